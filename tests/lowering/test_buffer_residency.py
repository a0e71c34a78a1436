"""Residency per lowered buffer (rockjit/lowering/buffer_residency.py): the image's walk and
core placement ask it which contexts hold a buffer's bytes and what to copy. Its answers are
remembered per history of partial writes and brings since the buffer was last uniform, shared
by every buffer of the same size (the layers repeat their ops at other buffer ids).

Checked against an independent model: per buffer and context, the id of the write each byte
holds. Every planned copy moves ids byte by byte; after it the reader must hold the latest id
of every byte, ``missing`` must count the stale bytes and ``holder`` name a context holding
them all. The copies must also be exactly those of a fresh ContextResidency fed the same ops
(what the walk planned before the answers were shared), so sharing never changes a program.
"""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.lowering.buffer_residency import SHIFT, BufferResidency
from rockjit.lowering.residency_copies import ContextResidency

SIZE = 1024
CTX = [0, 1, 2]


def _run(bid: int, r: tuple) -> tuple:
    return (((bid + 1) << SHIFT) + r[0], *r[1:])


def _bytes(r: tuple) -> np.ndarray:
    lo, pieces, pitch, chunk = r
    return (lo + np.arange(pieces)[:, None] * pitch + np.arange(chunk)[None, :]).reshape(-1)


class _Model:
    """Per buffer: each context's write ids and the latest ones; a plain ContextResidency."""

    def __init__(self, nbuf: int, grain: int) -> None:
        self.held = {b: {c: np.zeros(SIZE, np.int64) for c in CTX} for b in range(nbuf)}
        self.truth = {b: np.zeros(SIZE, np.int64) for b in range(nbuf)}
        self.plain = {b: ContextResidency(SIZE, CTX, grain) for b in range(nbuf)}
        self.next_id = 1

    def reset(self, b: int) -> None:
        for c in CTX:
            self.held[b][c][:] = 0
        self.truth[b][:] = 0
        self.plain[b].reset(0, SIZE)

    def write(self, b: int, r: tuple, ctx: int) -> None:
        i = _bytes(r)
        self.held[b][ctx][i] = self.truth[b][i] = self.next_id
        self.next_id += 1
        self.plain[b].write(r, ctx)

    def stale(self, b: int, r: tuple, ctx: int) -> int:
        i = _bytes(r)
        return int(np.count_nonzero(self.held[b][ctx][i] != self.truth[b][i]))


def _script(rng, n: int, grain: int) -> list[tuple]:
    """A layer's ops on one buffer: (kind, run inside the buffer, context)."""
    ops = []
    for _ in range(n):
        k = rng.random()
        if k < 0.06:
            ops.append(("reset", None, 0))
            continue
        if k < 0.12:
            ops.append(("write", (0, 1, SIZE, SIZE), int(rng.integers(3))))
            continue
        pieces = int(rng.integers(1, 5))
        chunk = grain * int(rng.integers(1, 64 // grain + 1))
        pitch = chunk + grain * int(rng.integers(0, 32 // grain + 1))
        lo = grain * int(rng.integers(0, (SIZE - (pieces - 1) * pitch - chunk) // grain + 1))
        kind = "write" if k < 0.45 else ("copies" if k < 0.85 else "ask")
        ops.append((kind, (lo, pieces, pitch, chunk), int(rng.integers(3))))
    return ops


@pytest.mark.parametrize("seed,grain", [(0, 1), (1, 2), (2, 16), (3, 4)])
def test_shared_answers_keep_every_reader_current_and_match_a_plain_mask(seed, grain) -> None:
    rng = np.random.default_rng(seed)
    nbuf = 4
    res = BufferResidency({b: SIZE for b in range(nbuf)}, CTX, grains={b: grain for b in range(nbuf)})
    model = _Model(nbuf, grain)
    script = _script(rng, 120, grain)
    for b in range(nbuf):
        # the layers repeat the first buffer's ops; the last one strays from them halfway
        ops = script if b < nbuf - 1 else script[:60] + _script(rng, 60, grain)
        for kind, r, ctx in ops:
            if kind == "reset":
                res.reset(b)
                model.reset(b)
            elif kind == "write":
                res.write(_run(b, r), ctx)
                model.write(b, r, ctx)
            elif kind == "ask":
                assert res.missing(_run(b, r), CTX) == [model.stale(b, r, c) for c in CTX]
                h = res.holder(_run(b, r))
                fresh = [c for c in CTX if model.stale(b, r, c) == 0]
                assert h == (fresh[0] if fresh else None)
                assert model.plain[b].holder(r) == h
            else:
                got = res.copies(_run(b, r), ctx)
                assert got == model.plain[b].bring(r, ctx)
                for src, cr in got:
                    assert src != ctx and model.stale(b, cr, src) == 0   # a current source
                    i = _bytes(cr)
                    model.held[b][ctx][i] = model.held[b][src][i]
                assert model.stale(b, r, ctx) == 0


def test_answers_are_shared_only_between_histories_from_the_same_bits() -> None:
    """The same partial ops after a whole write by context 1 and by context 2 copy from
    different sources; a shorter buffer refuses a run that fits the longer one."""
    res = BufferResidency({0: SIZE, 1: SIZE, 2: SIZE // 2}, CTX, grains={0: 16, 1: 16, 2: 16})
    part, tail = (0, 2, 64, 16), (SIZE // 2, 1, 64, 64)
    for b, src in ((0, 1), (1, 2)):
        res.write(_run(b, (0, 1, SIZE, SIZE)), src)
        res.write(_run(b, (256, 1, 16, 16)), 0)
        assert res.copies(_run(b, part), 0) == [(src, part)]
        assert res.copies(_run(b, tail), 0) == [(src, tail)]
    res.write(_run(2, (0, 1, SIZE // 2, SIZE // 2)), 1)
    res.write(_run(2, (256, 1, 16, 16)), 0)
    assert res.copies(_run(2, part), 0) == [(1, part)]
    with pytest.raises(ValueError, match="outside"):
        res.copies(_run(2, tail), 0)
