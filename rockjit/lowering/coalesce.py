"""Coalesce: reorder the scheduled steps so NPU steps become adjacent, then merge adjacent NPU
steps into one step (one SUBMIT per context and one fence wait instead of one per op).

Runs on the schedule (schedule.py) before the memory plan, so liveness and placement follow the
new order.

* What a step touches: every access is (lowered buffer id, byte range). A buffer bound to a
  value is shared by every call that binds it; scratch and const buffers are fresh buffers of
  their call (residency.py), so they are private by construction. NPU jobs: their kicks'
  declared DMA streams (regcmd.Access: the registers' own geometry); a name the job lists in
  ``reads``/``writes`` or a relocation target with no declared stream counts as the whole
  buffer, read and written. Host steps: their operand slices; ``dst`` is the only operand the
  runtime writes (csrc/runtime/program.c run_host_step marks only its BO dirty), but it counts
  as read too, since a step may accumulate into it. A slice without bytes is the whole buffer.
* Order: a list scheduler over the RAW / WAR / WAW edges between steps (every earlier step
  whose accesses overlap). It emits every ready host step first, then every ready NPU step,
  so the host steps that do not depend on an NPU step no longer split NPU steps. Ties go to the
  original order. A ready NPU step that can join the open merged step (``merge``'s test) goes
  before the ready host steps: after them it would open a step of its own (a norm's passes
  that need only its input join its first reduce's step; the host's mean waits for them).
* Merge: adjacent NPU steps become one step, their jobs in order, unless a job would read or
  write bytes a job of the merged step writes on another context (``merge``). One SUBMIT's
  jobs are ordered by the BOs they share: the kernel adds each job's implicit dependencies on
  its in/out BOs before queueing the next (rocket's submit path, drivers/accel/rocket/
  rocket_job.c in torvalds/linux), and every job writes its context's arena. image_builder
  inserts the cross-context copies before and after a whole merged step, so data crosses
  contexts only between steps.

``ROCKJIT_NO_COALESCE=1`` (debugflags.NO_COALESCE) turns the pass off, for A/B comparisons.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Sequence

from .. import debugflags
from .intervals import Spans
from .op_lowering import HostStep
from .schedule import JobRef, ScheduledStep

_WHOLE = 1 << 62


# (key, lo, hi): bytes [lo, hi) of a lowered buffer id (or of a call-private name without a
# buffer); a plain tuple, since a whole model makes ~10^5 of them
Touch = tuple[object, int, int]


def _range(binding: dict, ci: int, name: str, offset: int, nbytes: int) -> Touch:
    bound = binding.get(name)
    if bound is None:
        # not bound by the pipeline (the call's regcmd): private to the call
        return ("call", ci, name), 0, _WHOLE
    bid, base = bound
    if nbytes <= 0:
        return bid, 0, _WHOLE
    return bid, base + offset, base + offset + nbytes


def _whole(binding: dict, ci: int, name: str) -> Touch:
    bound = binding.get(name)
    return (bound[0] if bound is not None else ("call", ci, name)), 0, _WHOLE


def job_touches(jr: JobRef, binding: dict, shapes: dict | None = None, pieces: bool = False
                ) -> tuple[list[Touch], list[Touch]]:
    """(reads, writes) of one scheduled job. ``shapes``: a cache of each job's accesses by
    buffer name (the layers' calls share their jobs, compile_cache.py; only bindings differ)."""
    shape = shapes.get(id(jr.job)) if shapes is not None else None
    if shape is None:
        shape = _job_shape(jr.job, pieces)
        if shapes is not None:
            shapes[id(jr.job)] = shape
    _, rd, wr, undeclared = shape
    reads = [_range(binding, jr.call, *a) for a in rd]
    writes = [_range(binding, jr.call, *a) for a in wr]
    for name in undeclared:
        if name in binding:
            t = _whole(binding, jr.call, name)
            reads.append(t)
            writes.append(t)
    return reads, writes


def _job_shape(job, pieces: bool = False) -> tuple:
    """(the job, its declared (name, offset, extent) reads and writes, each once -- a job's
    tasks often repeat a stream, and a repeat adds no edge -- and the names it addresses
    without a declared stream, sorted: it is taken to read and write those whole)."""
    rd = list(dict.fromkeys(t for k in job.kicks for a in k.reads for t in _pieces(a, pieces)))
    wr = list(dict.fromkeys(t for k in job.kicks for a in k.writes for t in _pieces(a, pieces)))
    declared = {a[0] for a in rd} | {a[0] for a in wr}
    undeclared = {n for n in (*job.reads, *job.writes) if n not in declared}
    for kick in job.kicks:
        undeclared.update(r.buffer for r in kick.relocs.values() if r.buffer not in declared)
    return job, rd, wr, sorted(undeclared)     # the job itself: its id stays its own


def _pieces(a, pieces: bool) -> list[tuple[str, int, int]]:
    """(name, offset, extent) of each run of a declared stream: with ``pieces`` (the row
    split on, debugflags.ROW_SPLIT) a strided one (a row range of every plane of a cube) is its
    pieces, so the rows other cores write in between are no overlap. Else its span: the only
    strided streams whose gaps another core writes in one step are the row split's, and
    splitting every strided read (a matmul's K planes) into pieces made this pass ~4x slower
    for the same steps (SigLIP x12: 0.08 -> 0.38 s CPU). The span is conservative: it can
    only keep steps apart."""
    if pieces and a.pieces > 1 and a.pitch >= a.chunk > 0:
        return [(a.buffer, a.offset + i * a.pitch, a.chunk) for i in range(a.pieces)]
    return [(a.buffer, a.offset, a.extent)]


def host_touches(ci: int, hs: HostStep, binding: dict) -> tuple[list[Touch], list[Touch]]:
    reads: list[Touch] = []
    writes: list[Touch] = []
    for opname, sl in hs.operands.items():
        t = _range(binding, ci, sl.buffer, sl.offset, sl.nbytes)
        reads.append(t)
        if opname == "dst":
            writes.append(t)
    return reads, writes


JobTouches = tuple[int, list[Touch], list[Touch]]   # (context, reads, writes) of one job


def job_list_touches(st: ScheduledStep, calls: Sequence,
                     shapes: dict | None = None, pieces: bool = False) -> list[JobTouches]:
    """(context, reads, writes) of each job of an NPU step; a host step is one entry on
    context 0."""
    if st.kind == "host":
        ci, hs = st.host
        return [(0, *host_touches(ci, hs, calls[ci].binding))]
    return [(jr.core, *job_touches(jr, calls[jr.call].binding, shapes, pieces))
            for jr in st.jobs]


def dependencies(steps: Sequence[ScheduledStep], calls: Sequence,
                 touches: Sequence[list[JobTouches]] | None = None) -> list[set[int]]:
    """For every step, the earlier steps it must follow (RAW, WAR and WAW on overlapping bytes).
    ``touches``: each step's ``job_list_touches`` when the caller has them already."""
    seen_r: dict[object, list[tuple[int, int, int]]] = defaultdict(list)
    seen_w: dict[object, list[tuple[int, int, int]]] = defaultdict(list)
    preds: list[set[int]] = []
    for si, st in enumerate(steps):
        reads, writes = _hulls(touches[si] if touches is not None
                               else job_list_touches(st, calls))
        p: set[int] = set()
        for key, tlo, thi in reads:
            p.update(j for j, lo, hi in seen_w[key] if lo < thi and tlo < hi)
        for key, tlo, thi in writes:
            p.update(j for j, lo, hi in seen_w[key] if lo < thi and tlo < hi)
            p.update(j for j, lo, hi in seen_r[key] if lo < thi and tlo < hi)
        for key, tlo, thi in reads:
            seen_r[key].append((si, tlo, thi))
        for key, tlo, thi in writes:
            # an access inside this write's bytes needs no edge of its own any more: whatever
            # later overlaps it overlaps the write too, which follows it
            for seen in (seen_r, seen_w):
                old = seen.get(key)
                if old:
                    seen[key] = [a for a in old if a[0] == si or not tlo <= a[1] < a[2] <= thi]
            seen_w[key].append((si, tlo, thi))
        p.discard(si)
        preds.append(p)
    return preds


def _hulls(per_job: Sequence[JobTouches]) -> tuple[set[Touch], set[Touch]]:
    """A step's reads and writes for ordering: per job, the hull of its touches of each
    buffer. A row-split job's pieces (a row range of every plane, coalesce's merge test) would
    make thousands; the hull only adds edges to steps touching the rows between, which are
    the same op's other jobs or its neighbours in the chain, ordered anyway."""
    out: tuple[set[Touch], set[Touch]] = (set(), set())
    for _, r, w in per_job:
        for dst, src in zip(out, (r, w)):
            if len({t[0] for t in src}) == len(src):
                dst.update(src)         # each buffer touched once: its touch is its hull
                continue
            hull: dict = {}
            for key, lo, hi in src:
                h = hull.get(key)
                hull[key] = (lo, hi) if h is None else (min(h[0], lo), max(h[1], hi))
            dst.update((key, lo, hi) for key, (lo, hi) in hull.items())
    return out


def _mergeable(st: ScheduledStep) -> bool:
    return st.kind == "npu" and all(jr.core == 0 for jr in st.jobs)


def reorder(steps: Sequence[ScheduledStep], preds: list[set[int]],
            touches: Sequence[list[JobTouches]] | None = None,
            joins: list[bool] | None = None) -> list[int]:
    """A topological order of the steps: every ready host step before the next NPU step, and
    among ready NPU steps the context-0 ones first (they never carry data between contexts, so
    they join the open merged step whenever their data allows).

    With ``touches`` (each step's ``job_list_touches``), a ready NPU step that joins the open
    merged step (``merge``'s test) goes before the ready host steps: there it costs no step of
    its own, after them it would open one (a norm's passes that need only its input join the
    step of its first reduce instead of waiting for the host's mean).

    ``joins`` (with ``touches``): filled with, per emitted step, whether it joins the open
    merged step: ``merge``'s decision on the returned order, made here on the way."""
    n = len(steps)
    waiting = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in range(n)]
    for si, p in enumerate(preds):
        for j in p:
            succs[j].append(si)
    host: list[int] = []
    single: list[int] = []   # NPU steps all in context 0
    multi: list[int] = []

    def push(i: int) -> None:
        st = steps[i]
        heapq.heappush(host if st.kind == "host" else single if _mergeable(st) else multi, i)

    for i in range(n):
        if not waiting[i]:
            push(i)
    order: list[int] = []
    run: dict[int, dict] | None = None   # the open merged step's writes, None after a host step

    def emit(i: int) -> None:
        nonlocal run
        order.append(i)
        if touches is not None:
            mine = touches[i] if steps[i].kind == "npu" else None
            joined = mine is not None and run is not None and _joins(run, mine)
            run = None if mine is None else _add_writes(run if joined else {}, mine)
            if joins is not None:
                joins.append(joined)
        for s in succs[i]:
            waiting[s] -= 1
            if not waiting[s]:
                push(s)

    def joining() -> int | None:
        for q in (single, multi):
            for i in sorted(q):
                if _joins(run, touches[i]):
                    q.remove(i)
                    heapq.heapify(q)
                    return i
        return None

    while host or single or multi:
        if host:
            i = joining() if run is not None else None
            emit(heapq.heappop(host) if i is None else i)
            continue
        # one NPU run: the context-0 steps that become ready inside it keep joining it
        while single:
            emit(heapq.heappop(single))
        if multi and not host:
            emit(heapq.heappop(multi))
    if len(order) != n:
        raise AssertionError(f"coalesce: {n - len(order)} steps never became ready "
                             f"(a dependency cycle: a bug in rockjit/lowering/coalesce.py)")
    return order


def _joins(writes: dict[int, dict], mine: list[JobTouches]) -> bool:
    """Whether a step with jobs ``mine`` may join an open step with ``writes`` (per context)."""
    return not any(_overlaps(spans, r) or _overlaps(spans, w)
                   for c, r, w in mine for c2, spans in writes.items() if c2 != c)


def _add_writes(writes: dict[int, dict], mine: list[JobTouches]) -> dict[int, dict]:
    for c, _, w in mine:
        per = writes.setdefault(c, {})
        for key, lo, hi in w:
            sp = per.get(key)
            if sp is None:
                sp = per[key] = Spans()
            sp.add(lo, hi)
    return writes


def _overlaps(spans: dict, touches) -> bool:
    for key, tlo, thi in touches:
        sp = spans.get(key)
        if sp is not None and sp.hits(tlo, thi):
            return True
    return False


def merge(steps: Sequence[ScheduledStep], calls: Sequence,
          touches: Sequence[list[JobTouches]] | None = None
          ) -> tuple[list[ScheduledStep], list[range]]:
    """Adjacent NPU steps -> one step (jobs in order), and for every merged step whose jobs use
    more than one context the range of unmerged positions it covers.

    A step joins the open one unless one of its jobs, on context c, reads or writes bytes that
    a job of the open step on another context writes: the image builder copies a merged step's
    inputs into contexts > 0 before it and their outputs back to context 0 after it, so data
    may cross contexts only between steps. Within a context the jobs keep their order (one
    SUBMIT per context, ordered by the arena BO's implicit fences). Bytes another context only
    reads may be rewritten: that context reads its copy, made before the step. ``touches``: each
    step's ``job_list_touches`` when the caller has them already."""
    flags: list[bool] = []
    writes: dict[int, dict] = {}        # the open step's writes: context -> key -> [(lo, hi)]
    for i, st in enumerate(steps):
        mine = [] if st.kind != "npu" else \
            touches[i] if touches is not None else job_list_touches(st, calls)
        joins = bool(flags) and st.kind == "npu" and steps[i - 1].kind == "npu" and \
            _joins(writes, mine)
        flags.append(joins)
        if not joins:
            writes = {}
        _add_writes(writes, mine)
    return _merged(steps, flags)


def _merged(steps: Sequence[ScheduledStep], joins: Sequence[bool]
            ) -> tuple[list[ScheduledStep], list[range]]:
    """``merge``'s result from its decisions: each step that joins goes into the one before."""
    out: list[ScheduledStep] = []
    parts: list[list[int]] = []
    for i, (st, joined) in enumerate(zip(steps, joins)):
        if joined:
            out[-1] = ScheduledStep("npu", out[-1].jobs + list(st.jobs))
            parts[-1].append(i)
        else:
            out.append(st)
            parts.append([i])
    multi = [range(p[0], p[-1] + 1) for p, st in zip(parts, out)
             if len(p) > 1 and len({jr.core for jr in st.jobs}) > 1]
    return out, multi


def coalesce(steps: Sequence[ScheduledStep], calls: Sequence
             ) -> tuple[list[ScheduledStep], list[ScheduledStep], list[range]]:
    """(merged steps, the same steps reordered but not merged, the unmerged positions each
    merged step over several contexts covers). ``steps``: the schedule with each job's context
    already final (``JobRef.core``); ``calls``: the placed calls (their bindings name the
    buffers).

    Liveness belongs on the unmerged order: the parts of a merged step run one after the other
    in a context (every job writes its context's arena BO, so each waits for the one before),
    so a buffer dead after one part may share bytes with one born in a later part. Not so
    across contexts: a merged step's cross-context copies run before and after all of it, so
    the calls of a step over several contexts must keep their bytes for its whole range
    (ImageBuilder._liveness widens them)."""
    shapes: dict = {}
    pieces = debugflags.enabled(debugflags.ROW_SPLIT.name)
    touches = [job_list_touches(st, calls, shapes, pieces) for st in steps]
    joins: list[bool] = []
    order = reorder(steps, dependencies(steps, calls, touches), touches, joins)
    ordered = [steps[i] for i in order]
    merged, multi = _merged(ordered, joins)   # merge(ordered, ...)'s decisions, made by reorder
    return merged, ordered, multi
