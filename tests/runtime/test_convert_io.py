"""Program.write_as / read_as: a call's inputs and outputs converted between float32 and the
dtype the program stores them in, in C, bit-identical to numpy's ``astype``."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.runtime import NullDevice, ProgramBuilder, ProgramError


def _edge_f32() -> np.ndarray:
    """Values where f32 -> f16 rounding is delicate: ties (even and odd), the subnormal range
    and its underflow, the overflow threshold, signed zeros, inf and NaN, and random values."""
    f16 = np.float16
    ties = [(float(f16(1.0)) + float(f16(1.0009765625))) / 2,   # halfway between 1 and next
            (float(f16(1.0009765625)) + float(f16(1.001953125))) / 2]
    edges = [0.0, -0.0, 6.0e-8, 5.96e-8, 2.98e-8, 3.0e-8, 6.1e-5, 6.09e-5, 65504.0, 65519.99,
             65520.0, -65520.0, 1e10, np.inf, -np.inf, np.nan, 1.0 / 3.0]
    rng = np.random.default_rng(0)
    rand = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 6, 3000),
                           rng.standard_normal(97)])
    return np.concatenate([ties, edges, rand]).astype(np.float32)


def _program(nbytes: int):
    dev = NullDevice()
    b = ProgramBuilder(dev)
    bo = b.add_bo(nbytes + 64, "io")
    return dev, bo, b.build()


def test_write_as_f16_matches_numpy_astype():
    x = _edge_f32().reshape(-1, 41)[:, :40]      # not contiguous: write_as makes it so
    dev, bo, prog = _program(2 * x.size + 8)
    with dev, prog:
        prog.write_as(bo, x, "float16", offset=8)
        got = np.frombuffer(prog.read(bo, 2 * x.size, 8), np.uint16)
        want = np.ascontiguousarray(x).astype(np.float16).view(np.uint16).reshape(-1)
        assert np.array_equal(got, want)
        assert prog.stats()["upload_bytes"] == 2 * x.size


def test_read_as_f32_from_f16_matches_numpy():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)   # every f16 value
    dev, bo, prog = _program(bits.nbytes)
    with dev, prog:
        prog.write(bo, bits)
        got = prog.read_as(bo, "float16", "float32", (256, 256))
        want = bits.view(np.float16).astype(np.float32).reshape(256, 256)
        assert got.dtype == np.float32 and got.shape == (256, 256)
        # bit-identical, except that a signalling NaN comes back quiet (F16C quiets it, as
        # any x86 float conversion does); its payload is kept
        g, w = got.view(np.uint32), want.view(np.uint32)
        snan = np.isnan(want) & ((w & 0x00400000) == 0)
        assert snan.sum() == 2 * 511
        assert np.array_equal(g[~snan], w[~snan])
        assert np.array_equal(g[snan], w[snan] | 0x00400000)


def test_other_dtype_pairs_keep_numpy_semantics():
    x = np.array([1.7, -2.5, 300.0], np.float32)
    dev, bo, prog = _program(64)
    with dev, prog:
        prog.write_as(bo, x, "int32")        # numpy's path: astype truncates
        assert list(np.frombuffer(prog.read(bo, 12), np.int32)) == [1, -2, 300]
        assert np.array_equal(prog.read_as(bo, "int32", "float32", (3,)), [1.0, -2.0, 300.0])


def test_out_of_range_is_refused():
    dev, bo, prog = _program(16)
    with dev, prog:
        with pytest.raises(ProgramError, match="outside BO"):
            prog.write_as(bo, np.zeros(100, np.float32), "float16")
        with pytest.raises(ProgramError, match="outside BO"):
            prog.read_as(bo, "float16", "float32", (100,), offset=8)
