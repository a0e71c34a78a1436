"""The cross-context copy queue (rockjit/lowering/context_copies.ResidencyWalk._queue): joined
copies leave every context's arena as the copies one by one do, on random sequences against a
byte model; and the pieces of a row range alternating between source contexts become one
strided copy per pair of contexts."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.lowering.context_copies import ResidencyWalk

ARENA = 2048


def _bytes(run) -> np.ndarray:
    lo, pieces, pitch, chunk = run
    return np.array([lo + i * pitch + j for i in range(pieces) for j in range(chunk)], np.int64)


def _apply(copies, contexts: int) -> np.ndarray:
    mem = np.arange(contexts * ARENA, dtype=np.int64).reshape(contexts, ARENA)
    for src, dst, run in copies:
        b = _bytes(run)
        mem[dst, b] = mem[src, b]
    return mem


def _queued(copies) -> list:
    w = ResidencyWalk.__new__(ResidencyWalk)
    w._pending = []
    for c in copies:
        w._queue(*c)
    return w._pending


@pytest.mark.parametrize("seed", range(25))
def test_joined_copies_leave_the_arenas_as_one_by_one(seed) -> None:
    rng = np.random.default_rng(seed)
    pitch = int(rng.choice([16, 24, 32]))
    copies = []
    for _ in range(int(rng.integers(2, 30))):
        src, dst = rng.choice(3, 2, replace=False)
        chunk = int(rng.choice([4, 8, pitch]))
        pieces = int(rng.integers(1, 4))
        lo = int(rng.integers(0, ARENA - pieces * pitch))
        lo -= lo % 4 if rng.random() < 0.5 else 0
        copies.append((int(src), int(dst), (lo, pieces, pitch if pieces > 1 else chunk, chunk)))
    # a few strided continuations of earlier copies, so that joins happen
    for i in rng.choice(len(copies), min(5, len(copies)), replace=False):
        s, d, (lo, n, p, c) = copies[i]
        nxt = lo + n * (p if n > 1 else pitch)
        if nxt + c <= ARENA:
            copies.append((s, d, (nxt, 1, c, c)))
        if n > 1 and 2 * c <= p:
            copies.append((s, d, (lo + c, n, p, c)))      # the next bytes of every piece
    q = _queued(copies)
    assert np.array_equal(_apply(q, 3), _apply(copies, 3))


def test_alternating_sources_become_one_copy_per_pair() -> None:
    # 3 row ranges of 40 bytes in each 128-byte plane: context 2 reads planes 0..3 whole and
    # holds its own range; the other two ranges come from contexts 0 and 1, plane by plane
    copies = []
    for plane in range(4):
        copies.append((0, 2, (plane * 128, 1, 40, 40)))
        copies.append((1, 2, (plane * 128 + 40, 1, 40, 40)))
    q = _queued(copies)
    assert q == [(0, 2, (0, 4, 128, 40)), (1, 2, (40, 4, 128, 40))]
    assert np.array_equal(_apply(q, 3), _apply(copies, 3))


def test_next_row_tiles_widen_the_pieces() -> None:
    # a reader's row tiles, each a strided run over 4 planes, alternating two sources
    copies = []
    for tile in range(3):
        copies.append((0, 2, (tile * 16, 4, 256, 16)))
        copies.append((1, 2, (1024 + tile * 16, 4, 256, 16)))
    q = _queued(copies)
    assert q == [(0, 2, (0, 4, 256, 48)), (1, 2, (1024, 4, 256, 48))]
    assert np.array_equal(_apply(q, 3), _apply(copies, 3))


def test_no_join_past_a_copy_into_the_source() -> None:
    # the second 0 -> 2 copy reads bytes the 1 -> 0 copy brings: it must stay after it
    copies = [(0, 2, (0, 1, 16, 16)), (1, 0, (16, 1, 16, 16)), (0, 2, (16, 1, 16, 16))]
    q = _queued(copies)
    assert len(q) == 3
    assert np.array_equal(_apply(q, 3), _apply(copies, 3))
