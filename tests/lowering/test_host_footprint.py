"""A strided host step declares the bytes it touches (host_descriptor.view_run), so the
cross-context copies bring only those: every byte the view touches lies in the run, and a
cube column's run is a few bytes a position, not the cube."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from rockjit.lowering.host_descriptor import view_run


def _touched(shape, offset, strides, esize) -> set[int]:
    out = set()
    for idx in itertools.product(*(range(n) for n in shape)):
        e = offset + sum(i * s for i, s in zip(idx, strides))
        out.update(range(e * esize, (e + 1) * esize))
    return out


def _covered(run) -> set[int]:
    off, pieces, pitch, chunk = run
    return {off + p * pitch + b for p in range(pieces) for b in range(chunk)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=3),
       st.integers(0, 50), st.sampled_from([1, 2, 4]))
def test_run_covers_every_touched_byte(dims, offset, esize) -> None:
    shape = [n for n, _ in dims]
    strides = [s for _, s in dims]
    run = view_run(shape, offset, strides, esize)
    assert run is not None
    off, pieces, pitch, chunk = run
    assert pieces == 1 or chunk < pitch        # pieces never overlap
    assert _touched(shape, offset, strides, esize) <= _covered(run)


def test_cube_column_is_a_few_bytes_a_position() -> None:
    # channel 0 (fp32) of 12 heads' cubes: 1024 positions 32 B apart, heads 80 KiB apart
    run = view_run([12, 1024], 100, [20480, 8], 4)
    assert run == (400, 12, 81920, (1023 * 8 + 1) * 4)
    assert _covered(run) >= _touched([12, 1024], 100, [20480, 8], 4)


def test_negative_stride_or_empty_declines() -> None:
    assert view_run([4], 10, [-1], 2) is None
    assert view_run([0, 4], 0, [4, 1], 2) is None
    assert view_run([3], 7, [0], 2) == (14, 1, 2, 2)      # a broadcast reads one element
    np.testing.assert_equal(view_run([2, 3], 0, [3, 1], 2), (0, 1, 12, 12))
