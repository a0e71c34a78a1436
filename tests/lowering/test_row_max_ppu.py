"""The row max of a matrix cube on the PPU (emitters/pool.build_row_max) on the strict
simulator vs numpy: lane maxima over the whole 8-channel groups, heads as surfaces, padding
lanes and gaps never read."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from rockjit.lowering.emitters.pool import KERNEL_MAX, PAD_MAX, build_row_max, max_axis_plan
from rockjit.lowering.layouts import CubeLayout
from rockjit.lowering.regcmd import LoweringError

from test_eltwise_harness import P, needs_sim, run_program

NAN16 = np.frombuffer(np.uint16(0x7E00).tobytes(), np.float16)[0]


def test_max_axis_plan_covers_every_line() -> None:
    for n in range(2, 3000):
        plan = max_axis_plan(n)
        h = n
        for i, (k, pad) in enumerate(plan):
            assert 2 <= k <= KERNEL_MAX or (n == h and k == n)
            assert 0 <= pad <= PAD_MAX and pad < k and (h + pad) % k == 0
            h = (h + pad) // k
            assert h == 1 if i == len(plan) - 1 else h >= 4, (n, plan)


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Ties (a few integers), +-65504, -inf (and whole -inf rows)."""
    x = rng.integers(-4, 5, shape).astype(np.float16)
    m = rng.random(shape)
    x[m < 0.02] = np.float16(65504)
    x[(m >= 0.02) & (m < 0.04)] = np.float16(-65504)
    x[(m >= 0.04) & (m < 0.10)] = -np.inf
    x[..., 0, :] = -np.inf                                # a row of -inf only
    return x


def _pack(x: np.ndarray, lay: CubeLayout, item: int, rng: np.random.Generator) -> np.ndarray:
    """[batch, rows, C] into cubes ``item`` bytes apart; padding lanes, rows past ``rows``
    and gaps hold NaN/garbage, so a read of them shows."""
    batch, rows, c = x.shape
    total = (batch - 1) * item + lay.nbytes
    buf = np.frombuffer(rng.integers(0, 256, total, dtype=np.uint8).tobytes(), np.uint8).copy()
    buf.view(np.float16)[::3] = NAN16
    for b in range(batch):
        for g in range(lay.groups):
            lanes = min(8, c - 8 * g)
            base = b * item + g * lay.surf_stride
            atoms = buf[base:base + rows * 16].view(np.float16).reshape(rows, 8)
            atoms[:, :lanes] = x[b, :, 8 * g:8 * g + lanes]
    return buf


CASES = [  # rows, channels, batch, extra surface bytes, extra item bytes
    (1024, 64, 1, 0, 0),
    (1500, 1500, 1, 0, 0),          # 187 whole groups (a padded pass) + 4 tail lanes
    (1024, 1024, 2, 0, 0),
    (1500, 64, 12, 0, 0),           # whisper's heads
    (64, 1000, 3, 32, 48),          # strided surfaces, gaps between heads
    (4, 136, 3, 0, 16),             # 17 groups: two passes, the fewest rows that allow them
    (7, 20, 2, 0, 0),               # 2 whole groups + 4 tail lanes
    (13, 200, 1, 0, 0),             # one cube's rows split over the cores (5, 4, 4), two passes
]


@needs_sim
@pytest.mark.parametrize("rows,c,batch,surf_pad,item_pad", CASES,
                         ids=[f"{r}x{c}x{b}" for r, c, b, _, _ in CASES])
def test_row_max_lanes(rows, c, batch, surf_pad, item_pad) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((rows, c, batch)).encode()))
    lay = CubeLayout(rows, 1, c, 8, np.float16, surf_stride=rows * 16 + surf_pad)
    item = lay.nbytes + item_pad
    x = _values(rng, (batch, rows, c))
    prog = build_row_max(lay, rows, c, batch, item if batch > 1 else 0, P)
    out = run_program(prog, {"x": _pack(x, lay, item, rng)})["out"]
    got = out[:batch * rows * 16].view(np.float16).reshape(batch, rows, 8)
    whole = c // 8 * 8
    ref = x[..., :whole].reshape(batch, rows, c // 8, 8).max(axis=2)
    assert np.array_equal(got, ref)
    # with the tail lanes the host adds, each row's max is numpy's
    rowmax = np.maximum(got.max(-1), x[..., whole:].max(-1, initial=-np.inf))
    assert np.array_equal(rowmax, x.max(-1))


def test_row_max_jobs_cover_each_head_and_row_once() -> None:
    from rockjit.lowering.emitters.pool import _row_max_pieces
    for batch, rows in [(1, 13), (1, 1500), (1, 7), (12, 1024), (8, 1500), (2, 64), (1, 4)]:
        pieces = _row_max_pieces(batch, rows, P.cores)
        seen = np.zeros((batch, rows), int)
        for b0, nb, p0, n in pieces:
            assert n >= 4 or n == rows
            seen[b0:b0 + nb, p0:p0 + n] += 1
        assert (seen == 1).all() and len(pieces) <= P.cores


def test_row_max_refusals() -> None:
    lay = CubeLayout(3, 1, 200, 8, np.float16)
    with pytest.raises(LoweringError, match="sub-4"):
        build_row_max(lay, 3, 200, profile=P)                  # 25 groups: two passes
    with pytest.raises(LoweringError, match="whole"):
        build_row_max(CubeLayout(64, 1, 12, 8, np.float16), 64, 12, profile=P)
    with pytest.raises(LoweringError, match="positions"):
        build_row_max(CubeLayout(8, 2, 64, 8, np.float16), 8, 64, profile=P)
    with pytest.raises(LoweringError, match="overlap"):
        build_row_max(CubeLayout(64, 1, 64, 8, np.float16), 64, 64, batch=2, item_stride=64 * 16,
                      profile=P)
