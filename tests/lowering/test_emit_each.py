"""registers.emit_each (one numpy pass for a run of one-field words) against emit per value."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.lowering import registers as R


@pytest.mark.parametrize("values", [
    [0, 1, 0x7FFF, 0xFFFF, 12345],
    tuple(np.arange(513, dtype=np.int16) * 37 % 30000),
    np.arange(0, 65536, 257, dtype=np.uint16),
    [],
])
def test_emit_each_matches_emit(values) -> None:
    want = [R.emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(v)) for v in values]
    got = R.emit_each("DPU_LUT_ACCESS_DATA", "LUT_ACCESS_DATA", values)
    assert got == want and all(type(w) is int for w in got)


@pytest.mark.parametrize("bad", [[1, -1], [1 << 16]])
def test_emit_each_refuses_what_emit_refuses(bad) -> None:
    with pytest.raises(R.RegisterError, match="does not fit"):
        R.emit_each("DPU_LUT_ACCESS_DATA", "LUT_ACCESS_DATA", bad)
