"""The host-op ABI files generated from csrc/runtime/rj_host_ops.h are current, and the
generated Python numbers are the built C module's (cffi reads the header's generated cdef, the
C library the header itself)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rockjit.runtime import ffi, host_abi, lib

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_host_abi.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_generated_numbers_match_the_c_library() -> None:
    assert host_abi.DESC_BYTES == ffi.sizeof("rj_host_op")
    assert host_abi.VIEW_DTYPE.itemsize == ffi.sizeof("rj_host_view")
    for name in host_abi.DESC_DTYPE.names:
        assert host_abi.DESC_DTYPE.fields[name][1] == ffi.offsetof("rj_host_op", name), name
    for name, code in host_abi.KINDS.items():
        assert ffi.string(lib.rj_host_op_kind_name(code)).decode() == name
    for name, code in host_abi.DTYPES.items():
        assert ffi.string(lib.rj_host_dtype_name(code)).decode() == name
    assert host_abi.MAX_RANK == lib.RJ_HOST_MAX_RANK and host_abi.OP_MAGIC == lib.RJ_HOST_OP_MAGIC
