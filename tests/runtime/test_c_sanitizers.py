"""The C unit tests (csrc/tests) under AddressSanitizer + UBSan: any report fails."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                    reason="needs make and a C compiler (cc) to build csrc/tests")
def test_make_asan():
    res = subprocess.run(["make", "-C", str(CSRC), "asan"], capture_output=True, text=True,
                         timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "all C tests passed under ASan+UBSan" in out
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out
