"""Loaded by `make -C csrc asan-py` (PYTHONPATH points here): makes `rockjit._rjc` the
ASan/UBSan build of the C core named by RJ_ASAN_MODULE, so the Python simulator and runtime
tests exercise the sanitized code. Outside that target this file is never on the path."""
import importlib.util
import os
import sys

_path = os.environ.get("RJ_ASAN_MODULE")
if _path:
    if not os.path.isfile(_path):
        raise ImportError(f"RJ_ASAN_MODULE={_path} does not exist; build it with `make -C csrc asan-py`")
    _spec = importlib.util.spec_from_file_location("rockjit._rjc", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    sys.modules["rockjit._rjc"] = _mod
