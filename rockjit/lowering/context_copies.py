"""The cross-context copies of a program image, in step order (ImageBuilder._walk_steps).

Every used context has its own mirror of the arena (rocket: one IOVA space per fd). By default
the copies follow residency (residency_copies.py): before an NPU step, a job's context gets only
the bytes of the runs its DMA reads that it does not hold, from a context that does; nothing
is copied back. A host step reads an operand in a context holding it whole (the CPU maps every
context's arena) and writes where its output slice is current; the outputs end in context 0,
where the runtime reads them. ``ROCKJIT_EAGER_COPIES`` restores the old scheme: every run a
step's jobs on contexts > 0 read is copied in from context 0 and every run they write back.

A merged step (coalesce.py) is walked part by part in its unmerged order, so a part's reads of
bytes an earlier part wrote in the same context need no copy; coalesce never merges a step
that reads bytes another context wrote inside the merged step, so every copy a part needs can
run before the whole merged step.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Sequence

from ..ir.types import DType
from .host_descriptor import set_offsets
from .host_rules import HostView, host_op_step
from .lowered import Boundary
from .op_lowering import HostStep
from .regcmd import LoweringError
from .buffer_residency import SHIFT, BufferResidency
from .residency_copies import Run, grains_by_buffer, run_span
from .schedule import ScheduledStep
from .walk_runs import WalkRuns

if TYPE_CHECKING:
    from .image_builder import ImageBuilder


def boundary_run(b: "ImageBuilder", bd: Boundary) -> Run | None:
    """The bytes of a graph input or output in the unplaced space (buffer_residency.py; None:
    not in the arena)."""
    nb = bd.tensor.nbytes
    if b.bufs[bd.tensor.buf].kind != "arena" or not nb:
        return None
    return (((bd.tensor.buf + 1) << SHIFT) + bd.tensor.offset, 1, nb, nb)


def host_runs(b: "ImageBuilder", ci: int, hs: HostStep) -> list[tuple[str, Run]]:
    """A host step's arena operands as (operand, the run of bytes it touches, in the unplaced
    space), its output last."""
    binding = b.calls[ci].binding
    out = []
    for opname, buf, (off, pieces, pitch, chunk) in hs.footprints():
        bid, boff = binding[buf]
        if b.bufs[bid].kind == "arena":
            out.append((opname, (((bid + 1) << SHIFT) + boff + off, pieces, pitch, chunk)))
    return out


class ResidencyWalk:
    """The residency of the arena while the image builder walks the steps; ``bring`` and
    ``host_contexts`` record the copies they need (``cross_context_copy``). The state is kept
    per lowered buffer (buffer_residency.py), over runs in the unplaced space; a copy is
    placed at its buffer's arena offset when queued."""

    def __init__(self, b: "ImageBuilder", known: WalkRuns) -> None:
        """``known``: the runs placement found (resident_placement.place): each job's (reads,
        writes) before the arena plan, each host step's operands, the buffers' grains over
        them; the walk's steps are the same jobs and host steps, so it never asks again."""
        self.b = b
        self.offsets = b.plan.offsets
        inputs = {bd.tensor.buf for bd in b.lowered.inputs}
        # per unmerged step, the buffers whose live interval begins there: their bytes' old
        # values are dead (pinned buffers, zero tails and inputs never are)
        self.births: dict[int, list[int]] = {}
        sizes: dict[int, int] = {}
        for bf in b.bufs:
            if bf.kind == "arena":
                sizes[bf.id] = bf.size
                if not bf.pinned and not bf.zero and bf.id not in inputs:
                    self.births.setdefault(bf.first, []).append(bf.id)
        boundary = [r for bd in (*b.lowered.inputs, *b.lowered.outputs)
                    if (r := boundary_run(b, bd)) is not None]
        self.ranges, self.host = known.jobs, known.host
        # the grains over every job's and host step's runs, refined by the boundary runs
        grains = dict(known.grains)
        for bid, g in grains_by_buffer(boundary, SHIFT).items():
            grains[bid] = math.gcd(grains[bid], g) if bid in grains else g
        # no slack: a run reaching past its buffer would meet another buffer's bytes
        self.res = BufferResidency(sizes, b.used, grains=grains)
        for bd in b.lowered.inputs:
            if (run := boundary_run(b, bd)) is not None:
                self.res.write(run, 0)
        self._live = iter(enumerate(b._live_steps))
        self._pending: list[tuple[int, int, Run]] = []
        self.reader = next_readers(b.steps, self.host, self.ranges)

    def _parts(self, st: ScheduledStep) -> Iterator[tuple[int, ScheduledStep]]:
        """The unmerged steps (index, step) a step of the walk is made of."""
        if st.kind != "npu":
            li, part = next(self._live)
            assert part.kind == "host" and part.host[1] is st.host[1], (li, part.kind)
            yield li, part
            return
        njobs = 0
        while njobs < len(st.jobs):
            li, part = next(self._live)
            assert part.kind == "npu", li
            njobs += len(part.jobs)
            yield li, part
        assert njobs == len(st.jobs)

    def _born(self, li: int) -> None:
        for bid in self.births.get(li, ()):
            self.res.reset(bid)

    def bring(self, run: Run, ctx: int) -> None:
        """Queue the copies that make an unplaced run current in ``ctx``, at its arena offset."""
        base = self.offsets[(run[0] >> SHIFT) - 1]
        for src, (lo, pieces, pitch, chunk) in self.res.copies(run, ctx):
            self._queue(src, ctx, (base + lo, pieces, pitch, chunk))

    def _queue(self, src: int, dst: int, run: Run) -> None:
        """A copy joins a queued one between the same contexts when it continues it (the
        next bytes, or the next pieces at the same pitch): one host step, not two -- the
        pieces of a row range that alternate between source contexts (a cube split by rows
        read by a pass split by planes) become one strided copy per pair of contexts. Joining
        an earlier copy runs this one before the copies queued after that one, so it only
        joins across copies that neither write into its source context (it may need their
        bytes), nor read from its target context (they saw it before this copy), nor write
        bytes of it into the same target (the later write must stay the later)."""
        for i in range(len(self._pending) - 1, max(-1, len(self._pending) - 1 - _JOIN_BACK), -1):
            s, d, prev = self._pending[i]
            if (s, d) == (src, dst):
                joined = _joined(prev, run)
                if joined is not None:
                    self._pending[i] = (s, d, joined)
                    return
                break
            if d == src or s == dst or (d == dst and not _disjoint(prev, run)):
                break
        self._pending.append((src, dst, run))

    def _flush(self) -> None:
        for src, dst, run in self._pending:
            cross_context_copy(self.b, src, dst, run)
        self._pending = []

    def npu_step(self, st: ScheduledStep) -> None:
        """The copies before an NPU step (its jobs are independent within each part: every
        read of a part is brought in before any of its jobs' writes is recorded)."""
        for li, part in self._parts(st):
            self._born(li)
            for jr in part.jobs:
                for run in dict.fromkeys(self.ranges[id(jr)][0]):
                    self.bring(run, jr.core)
            for jr in part.jobs:
                for run in self.ranges[id(jr)][1]:
                    self.res.write(run, jr.core)
        self._flush()

    def host_contexts(self, st: ScheduledStep) -> dict[str, int]:
        """The context whose arena each arena operand of a host step uses. An input is read
        where it is current as a whole (context 0 first); one current nowhere as a whole is
        brought into context 0 first. The output ("dst") is written into a context holding
        all of its slice (so the bytes of the slice the step does not write stay current),
        else into context 0 after bringing the slice there."""
        for li, _ in self._parts(st):
            self._born(li)
        ci, hs = st.host
        where: dict[str, int] = {}
        for opname, run in self.host[(ci, id(hs))]:
            ctx = self.res.holder(run)
            if opname == "dst" and ctx is not None:
                # any context holding the whole slice may take the output: the one whose
                # next NPU job reads it, so that job needs no copy (a head's weights packed
                # by the host, on the core that multiplies by them; next_readers)
                ctx = self._reader_context(st, run, ctx)
            if ctx is None:
                self.bring(run, 0)
                ctx = 0
            where[opname] = ctx
            if opname == "dst":
                self.res.write(run, ctx)
        self._flush()
        return where

    def _reader_context(self, st: ScheduledStep, run: Run, holder: int) -> int:
        core = self.reader.get(id(st))
        return core if core is not None and core != holder and \
            not self.res.missing(run, (core,))[0] else holder

    def finish(self) -> None:
        """The runtime reads the outputs from context 0."""
        for bd in self.b.lowered.outputs:
            if (run := boundary_run(self.b, bd)) is not None:
                self.bring(run, 0)
        self._flush()


# how many queued copies a new one looks back over for one to join (compile time stays linear)
_JOIN_BACK = 8
# how many steps past a host step its output's first NPU reader is looked for (a pack's
# reader is the next NPU step or so; the bound keeps the search linear in the program)
_READER_AHEAD = 64


def next_readers(steps: Sequence[ScheduledStep], host: dict, ranges: dict) -> dict[int, int]:
    """For each host step that says ``to_reader`` (by ``id``), the core of the first NPU job
    within ``_READER_AHEAD`` steps after it that reads bytes of its output, where one does
    (runs in the unplaced space, so a buffer's bytes are its own: hulls that meet are the same
    value's). Only such steps: a host op's output written elsewhere than its neighbours'
    would no longer fuse with them (host_fuse.py)."""
    out: dict[int, int] = {}
    # per NPU step (by index), each job's core and read spans: a step is searched by every
    # host step up to _READER_AHEAD before it, so its spans are made once
    reads_of: dict[int, list[tuple[int, list[tuple[int, int]]]]] = {}
    for i, st in enumerate(steps):
        if st.kind == "npu" or not st.host[1].params.get("to_reader"):
            continue
        dst = [r for opname, r in host[(st.host[0], id(st.host[1]))] if opname == "dst"]
        if not dst:
            continue
        lo, hi = run_span(dst[0])
        for k in range(i + 1, min(i + 1 + _READER_AHEAD, len(steps))):
            if steps[k].kind != "npu":
                continue
            jobs = reads_of.get(k)
            if jobs is None:
                jobs = reads_of[k] = [(jr.core, [run_span(r) for r in ranges[id(jr)][0]])
                                      for jr in steps[k].jobs]
            core = next((c for c, spans in jobs if any(a < hi and lo < b for a, b in spans)),
                        None)
            if core is not None:
                out[id(st)] = core
                break
    return out


def _disjoint(a: Run, b: Run) -> bool:
    """Whether two runs surely share no byte (False where that is not plain: conservative)."""
    (lo1, n1, p1, c1), (lo2, n2, p2, c2) = a, b
    hi1, hi2 = lo1 + (n1 - 1) * p1 + c1, lo2 + (n2 - 1) * p2 + c2
    if hi1 <= lo2 or hi2 <= lo1:
        return True
    pitch = p1 if n1 > 1 else p2
    if (n1 > 1 and n2 > 1 and p1 != p2) or pitch < max(c1, c2):
        return False
    # both runs repeat at one pitch: their pieces' offsets within the pitch must not meet
    r1, r2 = lo1 % pitch, lo2 % pitch
    return all(not (x < y + cy and y < x + cx)
               for x, cx in ((r1, c1), (r1 - pitch, c1), (r1 + pitch, c1))
               for y, cy in ((r2, c2),))


def _joined(prev: Run, run: Run) -> Run | None:
    """``prev`` and ``run`` as one run where ``run`` continues ``prev``, else None."""
    lo, n, pitch, chunk = prev
    a, m, p2, c2 = run
    contiguous = (n == 1 or pitch == chunk) and (m == 1 or p2 == c2)
    if contiguous and a == lo + n * chunk:
        size = n * chunk + m * c2
        return (lo, 1, size, size)
    if n > 1 and m >= 1 and c2 == chunk and (m == 1 or p2 == pitch) and \
            a == lo + n * pitch and pitch != chunk:
        return (lo, n + m, pitch, chunk)
    if n == 1 and c2 == chunk and a - lo > chunk and (m == 1 or p2 == a - lo):
        # a second piece sets the pitch
        return (lo, 1 + m, a - lo, chunk)
    if n > 1 and m == n and p2 == pitch and a == lo + chunk and chunk + c2 <= pitch:
        # the next bytes of every piece: wider pieces (the next row tile of each plane)
        return (lo, n, pitch, chunk + c2)
    return None


def eager_copies(b: "ImageBuilder", st: ScheduledStep) -> tuple[list, list]:
    """ROCKJIT_EAGER_COPIES: (copies in, copies back) around an NPU step as (source, target,
    run); context 0 holds every value between steps."""
    ins: dict[int, list] = {}
    outs: dict[int, list] = {}
    for jr in st.jobs:
        if jr.core:
            ins.setdefault(jr.core, []).extend(b._ranges(jr, "r"))
            outs.setdefault(jr.core, []).extend(b._ranges(jr, "w"))
    return ([(0, c, run) for c, rs in sorted(ins.items()) for run in dict.fromkeys(rs)],
            [(c, 0, run) for c, rs in sorted(outs.items()) for run in dict.fromkeys(rs)])


def cross_context_copy(self: "ImageBuilder", src_core: int, dst_core: int,
                       run: tuple[int, int, int, int]) -> None:
    """One strided host copy of a run between the two contexts' arenas (same offsets: the
    arenas mirror each other), queued on the builder's pending records."""
    lo, pieces, pitch, chunk = run
    tmpl = self._copy_at_zero.get((pieces, pitch, chunk))
    if tmpl is None:
        # checked and encoded at offset 0 once per shape, each copy setting its own (the
        # view check is the same at any offset, but for the start checked below)
        span, dt = (pieces - 1) * pitch + chunk, DType.U8
        _, desc = host_op_step("copy", (pieces, chunk), HostView("dst", dt, 0, (pitch, 1)),
                               [HostView("src", dt, 0, (pitch, 1))], {"dst": span, "src": span,
                               "cdesc": 0}, "cdesc", what="cross-context copy")
        tmpl = self._copy_at_zero[(pieces, pitch, chunk)] = desc.data
    if lo + min(0, (pieces - 1) * pitch) < 0:
        raise LoweringError(f"cross-context copy of {pieces} x {chunk} bytes at {lo} (pitch "
                            f"{pitch}) reaches before the arena")
    self._desc_bufs.append(set_offsets(tmpl.copy(), (lo, lo)))
    self._pending.append(("copy", src_core, dst_core, len(self._desc_bufs) - 1))
    self._count["copied"] += pieces * chunk
    self._count["copy_steps"] += 1
    self._count["host"] += 1
