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

import numpy as np

from .arith import round_up


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
    # the placed buffers as columns, so each placement filters and scans them in numpy: the
    # per-buffer scan over every placed one in Python was quadratic in the model's depth
    n = len(order)
    start = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    first = np.array([r.first for r in order], np.int64)
    last = np.array([r.last for r in order], np.int64)
    pinned = np.array([r.pinned for r in order], bool)
    naive = 0
    for i, r in enumerate(order):
        naive = round_up(naive, r.align) + r.size
        # the placed buffers whose interval meets r's (BufReq.overlaps_in_time), by (start, end)
        hit = pinned[:i] | (r.pinned | ~((last[:i] < r.first) | (r.last < first[:i])))
        s, e = start[:i][hit], end[:i][hit]
        k = np.lexsort((e, s))
        s, e = s[k], e[k]
        # lowest fitting offset: before the j-th busy range the candidate is the largest end
        # so far (0 before any); the first gap that holds r wins, else after all of them
        before = np.maximum.accumulate(np.concatenate(([0], e)))
        fits = round_up(before[:-1], r.align) + r.size <= s
        j = int(np.argmax(fits)) if fits.any() else len(s)
        off = round_up(int(before[j]), r.align)
        plan.offsets[r.id] = off
        start[i], end[i] = off, off + r.size
        plan.size = max(plan.size, off + r.size)
    plan.size = round_up(max(plan.size, 1), base_align)
    plan.naive_size = round_up(max(naive, 1), base_align)
    return plan


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
