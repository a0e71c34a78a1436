"""rockjit: a JAX-style tracing compiler for the Rockchip RK3588 NPU."""
from __future__ import annotations

from .errors import (InputRangeError, IRSyntaxError, RockjitError, TraceError, UnsupportedError,
                     VerifyError, WeightError)

__all__ = ["RockjitError", "UnsupportedError", "TraceError", "WeightError", "IRSyntaxError",
           "VerifyError", "InputRangeError", "BundleError", "compile", "export", "load"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # compile() pulls in jax; keep `import rockjit` cheap for the runtime-only paths (bundles).
    if name in ("compile", "export"):
        from . import api

        return getattr(api, name)
    if name in ("load", "BundleError"):
        # no JAX: a bundle runs on the runtime alone
        from .runtime import bundle

        return getattr(bundle, name)
    raise AttributeError(name)
