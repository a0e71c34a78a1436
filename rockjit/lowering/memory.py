"""Memory plan: one arena per program, every tensor at an offset, bytes reused by liveness.

The pipeline hands the planner *logical buffers*: a size, an alignment and a live interval
``[first, last]`` in step numbers (the step that writes it first, the step that reads it last).
Views (a channel-group slice of a cube, a reshape of a row-major tensor, the inputs of a free
channel concat) are not buffers: they are offsets inside their base buffer, whose interval the
pipeline widens to cover every view's uses.

The allocator is the greedy "largest first, lowest fitting offset" interval packer: buffers are
placed in decreasing size; each goes at the lowest aligned offset where it does not overlap
(in bytes) any already placed buffer whose interval overlaps its own (in time). It is not
optimal, but it is deterministic and never worse than the sum of the live set's sizes at the
peak rounded up by alignment gaps.

*Pinned* buffers live for the whole program (graph inputs and outputs, and cubes with a
must-stay-zero tail: a consumer that reads more channel groups than the producer writes relies
on those bytes being zero, so nothing else may ever be placed over them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .arith import round_up
from .intervals import Spans


@dataclass
class BufReq:
    """One logical buffer the planner must place."""

    id: int
    size: int
    align: int = 64
    first: int = 0          # first step that touches it
    last: int = 0           # last step that touches it
    pinned: bool = False    # live for the whole program
    name: str = ""

    def overlaps_in_time(self, other: "BufReq") -> bool:
        if self.pinned or other.pinned:
            return True
        return not (self.last < other.first or other.last < self.first)


@dataclass
class ArenaPlan:
    offsets: dict[int, int] = field(default_factory=dict)
    size: int = 0
    naive_size: int = 0      # what the same buffers take without reuse (each its own range)


def plan_arena(reqs: list[BufReq], base_align: int = 4096) -> ArenaPlan:
    """Place every buffer; returns offsets by buffer id and the arena size."""
    plan = ArenaPlan()
    order = sorted(reqs, key=lambda r: (not r.pinned, -r.size, r.first, r.id))
    # the pinned buffers come first and clash with every buffer; each later buffer clashes
    # with them and with the few placed ones live at its time, found in numpy over columns
    # (a scan over every placed buffer in Python was quadratic in the model's depth)
    n = len(order)
    start = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    first = np.array([r.first for r in order], np.int64)
    last = np.array([r.last for r in order], np.int64)
    npin = sum(r.pinned for r in order)
    # the placed pinned buffers as joined blocks: a buffer of one byte or more has the same
    # ``_lowest_fit`` over them, with any other ranges sorted in, as over the buffers (a range
    # starting inside a block can never be the gap a buffer fits before: the ranges before it
    # reach past its start)
    blocks = Spans()
    for i, r in enumerate(order):
        live = np.flatnonzero(~((last[npin:i] < r.first) | (r.last < first[npin:i]))) + npin \
            if i > npin else ()
        mine = list(zip(start[live].tolist(), end[live].tolist())) if len(live) else []
        if r.size > 0:
            busy = sorted([*zip(blocks.lo, blocks.hi), *mine]) if mine else \
                list(zip(blocks.lo, blocks.hi))
        else:
            busy = sorted([*zip(start[:min(i, npin)].tolist(), end[:min(i, npin)].tolist()), *mine])
        off = _lowest_fit(busy, r.size, r.align)
        plan.offsets[r.id] = off
        start[i], end[i] = off, off + r.size
        if r.pinned:
            blocks.add(off, off + r.size)
        plan.size = max(plan.size, off + r.size)
    plan.size = round_up(max(plan.size, 1), base_align)
    plan.naive_size = naive_size(order, base_align)
    return plan


def naive_size(bufs: Iterable, base_align: int = 4096) -> int:
    """The bytes ``bufs`` (each with ``size`` and ``align``) take without reuse, each its own
    range one after another (``ArenaPlan.naive_size``)."""
    naive = 0
    for b in bufs:
        naive = round_up(naive, b.align) + b.size
    return round_up(max(naive, 1), base_align)


def _lowest_fit(busy: list[tuple[int, int]], size: int, align: int) -> int:
    """The lowest ``align``-aligned offset before the first busy range (sorted by start) that
    leaves room for ``size`` bytes after every earlier range, else after all of them."""
    reach = 0
    for s, e in busy:
        if -(-reach // align) * align + size <= s:
            break
        if e > reach:
            reach = e
    return round_up(reach, align)


def check_plan(reqs: list[BufReq], plan: ArenaPlan) -> None:
    """Assert no two buffers that are live at the same time share a byte (a test helper and
    a guard the pipeline runs after planning)."""
    rs = sorted(reqs, key=lambda r: plan.offsets[r.id])
    # the buffers as columns: each one is checked against the later-placed ones it shares bytes
    # with, in numpy (a pairwise scan in Python was most of the image build at full depth)
    off = np.array([plan.offsets[r.id] for r in rs], np.int64)
    first = np.array([r.first for r in rs], np.int64)
    last = np.array([r.last for r in rs], np.int64)
    pinned = np.array([r.pinned for r in rs], bool)
    for i, a in enumerate(rs):
        a0 = int(off[i])
        if a0 % a.align:
            raise AssertionError(f"buffer {a.name or a.id} at {a0} is not {a.align}-aligned")
        # the later buffers that start inside a's bytes (rs is sorted by offset)
        j = max(i + 1, int(np.searchsorted(off, a0 + a.size, side="left")))
        if j == i + 1:
            continue
        sl = slice(i + 1, j)
        live = pinned[sl] | bool(a.pinned) | ~((a.last < first[sl]) | (last[sl] < a.first))
        if live.any():
            b = rs[i + 1 + int(np.argmax(live))]
            b0 = plan.offsets[b.id]
            raise AssertionError(f"buffers {a.name or a.id} [{a0}, {a0 + a.size}) and "
                                 f"{b.name or b.id} [{b0}, {b0 + b.size}) overlap while "
                                 f"both are live")
