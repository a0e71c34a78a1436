"""cffi out-of-line API build of the C core: every csrc/**/*.c except tests/ becomes one
extension module, ``rockjit._rjc``.  What Python sees is ``rj_api.cdef`` followed by every
other ``csrc/**/*.cdef`` fragment (one per area, so areas don't edit one shared file); they must stay
free of preprocessor logic so cffi can parse them.  The module's C side includes every public
header ``csrc/**/rj_*.h``."""
from __future__ import annotations

import os
import platform
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def c_sources() -> list[str]:
    return sorted(str(p.relative_to(HERE.parent)) for p in HERE.rglob("*.c")
                  if "tests" not in p.relative_to(HERE).parts)


def compile_flags() -> list[str]:
    flags = ["-std=c11", "-O3", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
             "-fno-strict-aliasing", "-D_GNU_SOURCE"]
    if platform.machine() in ("x86_64", "AMD64"):
        # F16C turns fp16<->fp32 into one instruction; the simulator's inner loops rely on it.
        flags += ["-mavx2", "-mf16c", "-mfma"]
    if os.environ.get("RJ_SANITIZE"):
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    return flags


def cdefs() -> str:
    first = HERE / "rj_api.cdef"
    parts = [first.read_text()]
    parts += [p.read_text() for p in sorted(HERE.rglob("*.cdef")) if p != first]
    return "\n".join(parts)


def public_headers() -> str:
    heads = sorted(p.relative_to(HERE) for p in HERE.rglob("rj_*.h")
                   if "tests" not in p.relative_to(HERE).parts)
    return "".join(f'#include "{h}"\n' for h in heads)


ffibuilder = FFI()
ffibuilder.cdef(cdefs())
ffibuilder.set_source(
    "rockjit._rjc",
    public_headers(),
    sources=c_sources(),
    include_dirs=[str(HERE)],
    extra_compile_args=compile_flags(),
    extra_link_args=["-fsanitize=address,undefined"] if os.environ.get("RJ_SANITIZE") else [],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
