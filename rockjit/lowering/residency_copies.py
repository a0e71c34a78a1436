"""Which device contexts hold the current value of each activation-arena byte, and the
cross-context copies a step needs (image_builder.py ``_walk_steps``).

Every used context has its own mirror of the arena at the same offsets (rocket: one IOVA
space per fd; notes: perf/iova-and-multicore.md). A value a job on context c writes is current
only in c; a copy c -> d makes it current in d too. A copy is planned only where a reader's
context does not hold the current bytes, from a context that does, so a value made and
consumed on one core never moves, and nothing is copied back eagerly.

The state is one byte of context bits per cell of a range of bytes (bit c: context c holds
the current value; a cell is the largest grain dividing every run in the range). The walk and
core placement keep one per lowered buffer that is not uniform (buffer_residency.py). Runs are
strided (start, pieces, pitch, chunk), viewed in place as a (pieces, chunk) numpy array over
the mask, so marking and testing a run costs no Python loop over its pieces.
A buffer's bytes are reset to "current everywhere" when its live interval begins (whatever
they held is dead, so no reader needs the old bytes), which keeps dead values from being
copied.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

Run = tuple[int, int, int, int]   # (start, pieces, pitch, chunk): bytes of the arena


def run_span(run: Run) -> tuple[int, int]:
    """[first byte, end) of a run with a non-negative pitch."""
    lo, pieces, pitch, chunk = run
    return lo, lo + (pieces - 1) * pitch + chunk


class ContextResidency:
    """Per arena cell, the set of contexts (bits) holding its current value."""

    def __init__(self, nbytes: int, contexts: Sequence[int], grain: int = 1,
                 memo: dict | None = None, held: int | None = None) -> None:
        """``grain``: bytes per mask cell, a divisor of every run's start, pitch and chunk
        (``grain_of``); the arena's runs are mostly 16-byte atoms, so cells save work.
        ``memo``: shared by residencies whose runs repeat (one per buffer of a model's
        layers, resident_placement.py): what depends only on a run's shape and bits.
        ``held``: the context bits every cell starts with (default: all contexts)."""
        if max(contexts) >= 8:
            raise ValueError(f"contexts {list(contexts)}: the residency mask holds 8 contexts "
                             f"per byte (RK3588 has 3 NPU cores)")
        self.contexts = sorted(contexts)
        self.grain = max(1, int(grain))
        self.all = np.uint8(sum(1 << c for c in self.contexts))
        self.mask = np.full(-(-int(nbytes) // self.grain),
                            self.all if held is None else np.uint8(held), np.uint8)
        self._views: dict[Run, np.ndarray] = {}
        shared = (memo if memo is not None else {}).setdefault(
            (self.grain, tuple(self.contexts)), ({}, {}, {}))
        self._planned: dict[tuple, list[tuple[int, int, int, int, int]]] = shared[0]
        self._missing: dict[tuple, list[int]] = shared[1]
        self._cells_of: dict[tuple[Run, int], Run] = shared[2]

    # ----------------------------------------------------------------- views
    def _cells(self, run: Run) -> Run:
        key = (run, self.mask.size)
        hit = self._cells_of.get(key)
        if hit is None:
            hit = self._cells_of[key] = self._to_cells(run)
        return hit

    def _to_cells(self, run: Run) -> Run:
        lo, pieces, pitch, chunk = map(int, run)
        if pieces <= 1:
            pitch = chunk
        g = self.grain
        if lo % g or pitch % g or chunk % g:
            raise ValueError(f"run {run} is not in whole {g}-byte cells; build the residency "
                             f"with grain_of() over every run it will see")
        hi = lo + (pieces - 1) * pitch + chunk
        if lo < 0 or hi > self.mask.size * g:
            raise ValueError(f"run {run} reaches bytes [{lo}, {hi}) outside the arena of "
                             f"{self.mask.size * g} bytes")
        if pitch == chunk:  # back-to-back pieces: one contiguous piece
            return lo // g, 1, pieces * chunk // g, pieces * chunk // g
        return lo // g, pieces, pitch // g, chunk // g

    def _view(self, run: Run) -> np.ndarray:
        # a whole model asks ~10^5 times for a few 10^4 runs (the arena's offsets repeat
        # layer after layer); the mask is never reallocated, so a view stays valid
        v = self._views.get(run)
        if v is None:
            lo, pieces, pitch, chunk = self._cells(run)
            if lo + pieces * pitch <= self.mask.size:   # a plain slice: as_strided ~10 us
                v = self.mask[lo:lo + pieces * pitch].reshape(pieces, pitch)[:, :chunk]
            else:
                v = as_strided(self.mask[lo:], (pieces, chunk), (pitch, 1), writeable=True)
            self._views[run] = v
        return v

    # ----------------------------------------------------------------- updates
    def reset(self, lo: int, hi: int) -> None:
        """Bytes whose old value is dead: every context holds "the" value (none is needed)."""
        c0, _, _, n = self._cells((lo, 1, hi - lo, hi - lo))
        self.mask[c0:c0 + n] = self.all

    def write(self, run: Run, ctx: int) -> None:
        """A write by context ``ctx``: only it holds the new value."""
        self._view(run)[...] = np.uint8(1 << ctx)

    def mark(self, run: Run, ctx: int) -> None:
        """``bring``'s effect on the state without the copies: every byte of the run current
        in ``ctx`` too (placement only counts bytes; the walk plans the copies)."""
        v = self._view(run)
        np.bitwise_or(v, np.uint8(1 << ctx), out=v)

    # ----------------------------------------------------------------- queries
    def holder(self, run: Run, prefer: int = 0) -> int | None:
        """A context holding every byte of the run (``prefer`` first), or None."""
        common = np.bitwise_and.reduce(self._view(run), axis=None)
        for c in [prefer] + [c for c in self.contexts if c != prefer]:
            if common & (1 << c):
                return c
        return None

    def missing(self, run: Run, contexts: Sequence[int]) -> list[int]:
        """Per context, the bytes of the run whose current value it does not hold (what
        ``bring`` would copy), without recording anything."""
        v = self._view(run)
        # a function of the cells' bits, which repeat layer after layer at other offsets
        key = (v.shape, _bits_key(v), tuple(contexts))
        hit = self._missing.get(key)
        if hit is None:
            common = int(np.bitwise_and.reduce(v, axis=None))
            some = int(np.bitwise_or.reduce(v, axis=None))
            hit = []
            for c in contexts:
                if common & (1 << c):
                    hit.append(0)
                elif not some & (1 << c):
                    hit.append(v.size * self.grain)
                else:
                    hit.append(int(np.count_nonzero((v & np.uint8(1 << c)) == 0)) * self.grain)
            self._missing[key] = hit
        return list(hit)

    def bring(self, run: Run, ctx: int) -> list[tuple[int, Run]]:
        """The copies (source context, run) that make every byte of ``run`` current in
        ``ctx``, recorded as done. Sources are tried in context order (context 0 first); from
        each, exactly the needed bytes it holds."""
        v = self._view(run)
        bit = np.uint8(1 << ctx)
        common = int(np.bitwise_and.reduce(v, axis=None))
        if common & bit:     # the usual case, in one pass without a temporary
            return []
        lo, pieces, pitch, chunk = self._cells(run)
        # the copies depend only on the run's shape and its cells' bits, which repeat layer
        # after layer at other offsets: planned once per pattern, relative to the run's start
        key = (pieces, pitch, chunk, ctx, _bits_key(v))
        rel = self._planned.get(key)
        if rel is None:
            rel = self._planned[key] = self._plan(v, ctx, common, pieces, pitch, run)
        np.bitwise_or(v, bit, out=v)    # every byte is now current in ctx (all were needed
        g, base = self.grain, lo * self.grain   # or held)
        return [(src, (base + a * g, n, p * g, c * g)) for src, a, n, p, c in rel]

    def _plan(self, v: np.ndarray, ctx: int, common: int, pieces: int, pitch: int, run: Run
              ) -> list[tuple[int, int, int, int, int]]:
        """``bring``'s copies of a run whose cells are ``v`` (not modified), as (source,
        first cell relative to the run's, pieces, pitch, chunk) in cells."""
        bit = np.uint8(1 << ctx)
        chunk = v.shape[1]
        need = (v & bit) == 0
        if need.all():
            src = next((c for c in self.contexts if common & (1 << c)), None)
            if src is not None:     # one context holds it all: the run itself
                return [(src, 0, pieces, pitch, chunk)]
        copies: list[tuple[int, int, int, int, int]] = []
        # a source holding all the needed bytes first (one source: fewer, longer runs)
        held = {c: (v & np.uint8(1 << c)) != 0 for c in self.contexts if c != ctx}
        order = sorted(held, key=lambda c: (not bool((need <= held[c]).all()), c))
        for src in order:
            if not need.any():
                break
            has = held[src]
            take = need & has
            if not take.any():
                continue
            runs = _runs_of(take, 0, pitch)
            if len(runs) > 1:
                # pieces the source holds whole may move whole (their other bytes are current
                # in both, so equal) when that takes fewer copy steps
                moved = take.copy()
                moved[take.any(axis=1) & has.all(axis=1)] = True
                wide = _runs_of(moved, 0, pitch)
                runs = wide if len(wide) < len(runs) else runs
            copies.extend((src, a, n, p, c) for a, n, p, c in runs)
            need &= ~take
        if need.any():  # every byte is current somewhere: a write sets one bit, reset all
            raise AssertionError(f"run {run}: bytes current in no context")
        return copies


_RLE_CELLS = 2048


def _bits_key(v: np.ndarray) -> bytes | tuple[bytes, bytes]:
    """The cells' bits of a view as a hashable key, exactly: the bytes themselves when few;
    else their runs of equal bits (where each run ends, its bits), which a large view has
    few of (a value written by one context per tile) and which is cheaper to hash than
    the bytes (and than copying a strided view's pieces out)."""
    if v.size <= _RLE_CELLS:
        return v.tobytes()
    f = v.reshape(-1)
    ends = np.flatnonzero(f[1:] != f[:-1])
    return ends.tobytes(), f[ends].tobytes() + f[-1:].tobytes()


def grain_of(values: Iterable[int]) -> int:
    """The largest cell size dividing every value (run starts, pitches, chunks, bounds)."""
    a = np.fromiter(values, np.int64)
    return max(int(np.gcd.reduce(a)) if a.size else 0, 1)


def _run_columns(runs: Sequence[Run]) -> np.ndarray:
    """The runs as an (n, 4) int64 array; from one flat iterator (np.array over ~10^5 tuples
    took four times as long)."""
    return np.fromiter(itertools.chain.from_iterable(runs), np.int64,
                       count=4 * len(runs)).reshape(-1, 4)


def grain_of_runs(runs: Sequence[Run], extra: Iterable[int] = (), low_bits: int = 0) -> int:
    """``grain_of`` every run's start, chunk and (when it has several pieces) pitch, and of
    ``extra``; ``low_bits``: only the start's low bits count (an unplaced start's high bits
    name its buffer, resident_placement.py)."""
    a = _run_columns(runs)
    lo = a[:, 0] & ((1 << low_bits) - 1) if low_bits else a[:, 0]
    return grain_of(np.concatenate((lo, a[:, 3], np.where(a[:, 1] > 1, a[:, 2], 0),
                                    np.fromiter(extra, np.int64))))


def grains_by_buffer(runs: Sequence[Run], shift: int) -> dict[int, int]:
    """``grain_of_runs`` of each buffer's runs, in one pass: a run start's bits from ``shift``
    up are its buffer (id + 1), the low bits the offset in it (resident_placement.py)."""
    a = _run_columns(runs)
    if not a.size:
        return {}
    key = a[:, 0] >> shift
    vals = np.stack((a[:, 0] & ((1 << shift) - 1), a[:, 3],
                     np.where(a[:, 1] > 1, a[:, 2], 0)), axis=1)
    order = np.argsort(key, kind="stable")
    key, vals = key[order], vals[order]
    first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    g = np.gcd.reduceat(np.gcd.reduce(vals, axis=1), first)
    return {int(k) - 1: max(int(x), 1) for k, x in zip(key[first], g)}


def _runs_of(take: np.ndarray, lo: int, pitch: int) -> list[Run]:
    """The true bytes of a (pieces, chunk) mask as few strided runs: consecutive whole pieces
    as one run; in the other pieces, equal intervals of consecutive pieces merged into one
    run, the intervals left alone merged where they repeat at a constant pitch (the pieces
    other contexts' jobs wrote into one contiguous slice)."""
    pieces, chunk = take.shape
    full = take.all(axis=1)
    edges = np.diff(np.concatenate(([0], full.view(np.int8), [0])))
    first, end = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    runs: list[Run] = [(lo + int(a) * pitch, int(b - a), pitch if b - a > 1 else chunk, chunk)
                       for a, b in zip(first, end)]
    part = np.flatnonzero(take.any(axis=1) & ~full)
    if not part.size:
        return runs
    t = take[part]
    # one scan for the edges inside the pieces; a piece's first and last byte close it
    inner = np.flatnonzero(t[:, 1:] != t[:, :-1])
    er, ec = np.divmod(inner, max(chunk - 1, 1))
    ec += 1
    rising = t[er, ec]
    heads = np.flatnonzero(t[:, 0])
    tails = np.flatnonzero(t[:, -1])
    rs = np.concatenate((heads, er[rising]))
    c0 = np.concatenate((np.zeros(heads.size, np.int64), ec[rising]))
    re_ = np.concatenate((er[~rising], tails))
    c1 = np.concatenate((ec[~rising], np.full(tails.size, chunk, np.int64)))
    o0, o1 = np.lexsort((c0, rs)), np.lexsort((c1, re_))
    rs, c0, c1 = rs[o0], c0[o0], c1[o1]
    assert np.array_equal(rs, re_[o1])
    rs = part[rs]
    order = np.lexsort((rs, c1, c0))
    rs, c0, c1 = rs[order].tolist(), c0[order].tolist(), c1[order].tolist()
    single: list[tuple[int, int]] = []
    i, n = 0, len(rs)
    while i < n:
        j = i + 1
        while j < n and c0[j] == c0[i] and c1[j] == c1[i] and rs[j] == rs[j - 1] + 1:
            j += 1
        start, width = lo + rs[i] * pitch + c0[i], c1[i] - c0[i]
        if j - i > 1:
            runs.append((start, j - i, pitch, width))
        else:
            single.append((start, width))
        i = j
    return runs + _progressions(sorted(single, key=lambda iv: (iv[1], iv[0])))


def _progressions(intervals: list[tuple[int, int]]) -> list[Run]:
    """Disjoint (start, width) intervals sorted by width, then start, as strided runs:
    greedily, a run of equal widths at a constant distance."""
    runs: list[Run] = []
    i, n = 0, len(intervals)
    while i < n:
        s0, w = intervals[i]
        j = i + 1
        if j < n and intervals[j][1] == w:
            step = intervals[j][0] - s0
            while j < n and intervals[j][1] == w and intervals[j][0] - intervals[j - 1][0] == step:
                j += 1
        count = j - i
        runs.append((s0, count, step if count > 1 else w, w))
        i = j
    return runs
