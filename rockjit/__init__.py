"""rockjit: a JAX-style tracing compiler for the Rockchip RK3588 NPU."""
from __future__ import annotations

from .errors import (InputRangeError, IRSyntaxError, RockjitError, TraceError, UnsupportedError,
                     VerifyError, WeightError)

__all__ = ["RockjitError", "UnsupportedError", "TraceError", "WeightError", "IRSyntaxError",
           "VerifyError", "InputRangeError", "compile"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # compile() pulls in jax; keep `import rockjit` cheap for the runtime-only paths (bundles).
    if name == "compile":
        from .api import compile

        return compile
    raise AttributeError(name)
