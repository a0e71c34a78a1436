"""The C core under the sanitizers: the C unit tests (csrc/tests) under ASan+UBSan and under
TSan, and the Python simulator/runtime suites against an ASan+UBSan build of the cffi module
(`make -C csrc asan-py`). Any sanitizer report fails the run (halt_on_error)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
UNDER_ASAN = os.environ.get("RJ_UNDER_ASAN") == "1"

needs_toolchain = pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                                     reason="needs make and a C compiler (cc) to build csrc/tests")
# Inside `make asan-py` the ASan runtime is preloaded into every child process, which a TSan
# binary cannot start under; the C suites have their own targets there.
not_nested = pytest.mark.skipif(UNDER_ASAN, reason="inside `make asan-py`: the C suites run in "
                                "their own `make asan` / `make tsan` targets")


def make(target: str) -> str:
    res = subprocess.run(["make", "-C", str(CSRC), target], capture_output=True, text=True,
                         timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out
    assert "WARNING: ThreadSanitizer" not in out
    return out


@needs_toolchain
@not_nested
def test_make_asan():
    assert "all C tests passed under ASan+UBSan" in make("asan")


@needs_toolchain
@not_nested
def test_make_tsan():
    assert "all C tests passed under TSan" in make("tsan")


@needs_toolchain
@not_nested
def test_python_sim_and_runtime_suites_under_asan():
    out = make("asan-py")
    assert "Python sim/runtime tests passed under ASan+UBSan" in out
    assert " failed" not in out and " passed" in out


@pytest.mark.skipif(not UNDER_ASAN, reason="only meaningful inside `make -C csrc asan-py`")
def test_the_sanitized_module_is_the_one_under_test():
    import importlib
    module = importlib.import_module("rockjit._rjc")
    assert os.path.samefile(module.__file__, os.environ["RJ_ASAN_MODULE"])
