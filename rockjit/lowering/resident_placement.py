"""Core placement by the copies the residency scheme would really make (context_copies.py):
the steps are walked in schedule order, tracking which contexts hold each buffer's current
bytes after the earlier steps' decisions, and each NPU step with several jobs is given, per
number of cores k = 1 .. min(cores, jobs), a job -> core assignment and its modelled cost

    submits(k) + the slowest core's jobs + the host copies the assignment needs

(the cheapest k kept, the fewest cores on a tie). What a copy costs here is what the image
builder's walk will copy: the bytes of a job's reads its core does not hold. Writes are charged
a copy back only where a later host step reads a slice the job does not make whole, or the
value is a graph output (the runtime reads outputs from context 0): a value made on a core
and consumed there by the next NPU step never moves.

The assignment keeps data where it is: job by job in order, the core needing the fewest
copied bytes among those under the balanced load (the step's modelled job time / k, plus half
a job), ties broken by the job's block (jobs i*k//n: contiguous jobs on one core, so the tiles
of one head, made by one step and read by the next with a different tiling, share a core), then
by load. With every input on context 0 that is the block rule itself; with inputs spread by
the step before, each job follows its data.

Runs are in the unplaced space of ImageBuilder._ranges(placed=False) (buffer id << 40 +
offset): before the arena plan no two buffers share bytes, so no value dies under another.
``ROCKJIT_EAGER_COPIES`` keeps placement.py's eager model (round-robin over k cores).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .. import cost
from ..cost import Constants, CostHostStep, CostJob, CostNpuStep, CostProgram
from ..cost.from_program import cost_jobs_once
from .placement import CoreChoice, StepJob, choose
from .buffer_residency import SHIFT as _SHIFT, BufferResidency
from .context_copies import host_runs
from .residency_copies import Run, grains_by_buffer, run_span
from .schedule import ScheduledStep
from .walk_runs import WalkRuns

if TYPE_CHECKING:
    from .image_builder import ImageBuilder

_SLACK = 4096   # an emitter may read a padded span past its tensor (image_builder._ARENA_SLACK)


def _lacking_key(lacking: list[list[tuple[Run, list[int]]]]) -> tuple:
    """``_assign``'s view of the step's reads: it only asks whether two runs are the same one,
    so each run becomes the index of its first appearance, with the bytes each core lacks."""
    names: dict[Run, int] = {}
    return tuple(tuple((names.setdefault(r, len(names)), tuple(m)) for r, m in reads)
                 for reads in lacking)


def _step_ms(jobs: Sequence[CostJob], copies: Sequence[int], c: Constants) -> float:
    steps = [CostHostStep("copy", nb, "cross-context copy") for nb in copies if nb]
    return cost.estimate(CostProgram([*steps, CostNpuStep(list(jobs), "")]), constants=c).ms


class ResidentPlacement:
    """The walk: ``npu_step`` decides one step and records its copies and writes;
    ``host_step`` records where a host step reads and writes."""

    def __init__(self, res: BufferResidency, host_reads: dict[int, list[tuple[int, int]]],
                 outputs: set[int], constants: Constants | None = None) -> None:
        self.res = res
        self.host_reads = host_reads      # buffer -> spans host steps read (unplaced space)
        self.outputs = outputs            # buffers of graph outputs
        self.c = constants or cost.calibrated()
        # a job's modelled time on its own, by the identity of its cost jobs (the layers share
        # them: cost_jobs_once); the tuple is kept so its id is not reused
        self._alone: dict[int, tuple[float, tuple]] = {}
        # ids are of cost job tuples held by ``_alone``
        self._option: dict[tuple, float] = {}
        # a step's decision (cores, ms and bytes per k, assignment) by what it depends on:
        # the jobs' cost tuples (by id, held by ``_alone``), each job's lacking bytes per core
        # with its runs told apart only by equality (_lacking_key), the bytes its writes cost
        # later. The layers repeat their steps at other offsets with the same data layout
        self._decided: dict[tuple, tuple] = {}

    def _job_ms(self, jobs: tuple) -> float:
        hit = self._alone.get(id(jobs))
        if hit is None:
            hit = self._alone[id(jobs)] = (_step_ms(jobs, (), self.c), jobs)
        return hit[0]

    def _back(self, run: Run) -> int:
        """Bytes of a job's write on a core > 0 that will be copied to context 0 later."""
        bid = (run[0] >> _SHIFT) - 1
        if bid in self.outputs:
            return run[1] * run[3]
        lo, hi = run_span(run)
        if any(a < hi and lo < b and not (lo <= a and b <= hi) for a, b in self.host_reads.get(bid, ())):
            return run[1] * run[3]
        return 0

    def _assign(self, lacking: list[list[tuple[Run, list[int]]]], k: int, times: list[float],
                back: list[int], balance: bool = True) -> tuple[list[int], list[int]]:
        """(core per job, copied bytes per core) for ``k`` cores; ``lacking``: per job, its
        distinct read runs some core lacks bytes of, with the bytes each core lacks (the state
        does not change while a step is decided; a run no core lacks never adds a byte);
        ``back``: per job, the bytes its writes on a core > 0 will cost later (``_back``)."""
        n = len(lacking)
        cap = sum(times) / k + max(times) / 2 if balance else float("inf")
        load = [0.0] * k
        brought: list[set[Run]] = [set() for _ in range(k)]
        copied = [0] * k
        cores: list[int] = []
        for i, reads in enumerate(lacking):
            block = i * k // n if balance else 0
            need = [sum(m[c] for r, m in reads if r not in brought[c]) + (back[i] if c else 0)
                    for c in range(k)] if reads else [back[i] if c else 0 for c in range(k)]
            fits = [c for c in range(k) if load[c] + times[i] <= cap] or list(range(k))
            best = min(fits, key=lambda c: (need[c], c != block, load[c], c))
            cores.append(best)
            load[best] += times[i]
            brought[best].update(r for r, _ in reads)
            copied[best] += need[best]
        return cores, copied

    def npu_step(self, jobs: Sequence[StepJob], cores: int, step: int, label: str
                 ) -> tuple[list[int], CoreChoice | None]:
        """Decide a step (each job's core, and the choice when there was one to make: more
        than one job) and record its copies and writes."""
        top = max(1, min(cores, len(jobs)))
        choice = None
        assign = [0] * len(jobs)
        ctxs = range(cores)
        # the jobs of a step often read the same runs (a head's jobs, one input)
        miss = {r: self.res.missing(r, ctxs)
                for r in dict.fromkeys(r for sj in jobs for r in sj.reads)} if cores > 1 else {}
        back = [sum(self._back(w) for w in sj.writes) for sj in jobs] if cores > 1 else []
        lacking = [[(r, m) for r in dict.fromkeys(sj.reads) if any(m := miss[r])]
                   for sj in jobs] if cores > 1 else []
        if len(jobs) == 1 and cores > 1:
            # one job costs the same on any core: it goes where its data is (context 0 on
            # a tie); coalesce runs such neighbours side by side
            assign = [self._assign(lacking, cores, [1.0], back, balance=False)[0][0]]
        elif top > 1:
            ids = tuple(id(sj.jobs) for sj in jobs)
            key = (ids, top, tuple(back), _lacking_key(lacking))
            hit = self._decided.get(key)
            if hit is None:
                times = [self._job_ms(sj.jobs) for sj in jobs]
                ms: dict[int, float] = {}
                nbytes: dict[int, int] = {}
                options: dict[int, list[int]] = {}
                for k in range(1, top + 1):
                    options[k], copied = self._assign(lacking, k, times, back)
                    ms[k] = self._option_ms(jobs, ids, options[k], copied)
                    nbytes[k] = sum(copied)
                best = min(ms, key=lambda k: (ms[k], k))
                hit = self._decided[key] = (best, ms, nbytes, tuple(options[best]))
            best, ms, nbytes, chosen = hit
            assign = list(chosen)
            choice = CoreChoice(step, label, len(jobs), best, top, dict(ms), dict(nbytes), chosen)
        brought: set[tuple[Run, int]] = set()
        for sj, c in zip(jobs, assign):
            for r in sj.reads:
                # a run found current stays current; one brought stays brought
                if (r not in miss or miss[r][c]) and (r, c) not in brought:
                    brought.add((r, c))
                    self.res.bring(r, c)
        for sj, c in zip(jobs, assign):
            for w in sj.writes:
                self.res.write(w, c)
        return assign, choice

    def _option_ms(self, jobs: Sequence[StepJob], ids: tuple[int, ...], assign: list[int],
                   copied: list[int]) -> float:
        """The modelled ms of the step's jobs on ``assign``'s cores with ``copied`` bytes
        copied first, once per (jobs, assignment, copies): the layers repeat their steps."""
        key = (ids, tuple(assign), tuple(copied))
        hit = self._option.get(key)
        if hit is None:
            cj = [CostJob(c, j.tasks, j.kicks) for sj, c in zip(jobs, assign) for j in sj.jobs]
            hit = self._option[key] = _step_ms(cj, copied, self.c)
        return hit

    def host_step(self, runs: Sequence[tuple[str, Run]], to_reader: bool = False) -> None:
        """A host step's operands (its output "dst" last), as context_copies reads them. A
        ``to_reader`` step's output goes where its next NPU reader runs, which is not decided
        yet: where the step read its source, the core that made it, stands in for it."""
        src = None
        for opname, run in runs:
            ctx = self.res.holder(run)
            if opname == "dst" and to_reader and src is not None and ctx is not None and \
                    not self.res.missing(run, (src,))[0]:
                ctx = src
            if ctx is None:
                self.res.bring(run, 0)
                ctx = 0
            if opname == "src":
                src = ctx
            if opname == "dst":
                self.res.write(run, ctx)


def _step_jobs(b: "ImageBuilder", st: ScheduledStep, costed: dict) -> list[StepJob]:
    """The step's jobs as placement sees them (a lone job's cost is never asked; the layers'
    calls share their jobs, each costed once: ``costed``)."""
    return [StepJob(_cost_jobs(costed, jr.job, b.calls[jr.call].call.lowering)
                    if len(st.jobs) > 1 else (),
                    tuple(b._ranges(jr, "r", placed=False)),
                    tuple(b._ranges(jr, "w", placed=False))) for jr in st.jobs]


def _cost_jobs(costed: dict, job, lowering) -> tuple:
    """cost_jobs_once with the op's MACs per task, both remembered by identity (the per-task
    MACs sum every task of the op: once per op lowering, which the layers share)."""
    key = ("op", id(job), id(lowering))   # apart from cost_jobs_once's (id, macs) keys
    hit = costed.get(key)
    if hit is None:
        # macs_per_task sums the op's every task: once per lowering, not once per job
        mkey = ("macs", id(lowering))
        macs = costed.get(mkey)
        if macs is None:
            macs = costed[mkey] = (lowering.macs_per_task, lowering)
        hit = costed[key] = (cost_jobs_once(costed, job, macs[0]), job, lowering)
    return hit[0]


def _place_eager(b: "ImageBuilder") -> list[CoreChoice]:
    """placement.py's choice of k under the eager copies; jobs round-robin over k cores."""
    choices: list[CoreChoice] = []
    costed: dict = {}
    for si, st in enumerate(b.steps):
        k = 1
        if st.kind == "npu" and len(st.jobs) > 1:
            label = ", ".join(dict.fromkeys(b.calls[jr.call].node for jr in st.jobs))
            choices.append(choose(_step_jobs(b, st, costed), b.ncores, si, label))
            k = choices[-1].cores
        for i, jr in enumerate(st.jobs):
            jr.core = i % k
    return choices


def place(b: "ImageBuilder", eager: bool = False) -> tuple[list[CoreChoice], WalkRuns]:
    """Every NPU step's jobs' cores (``JobRef.core``) and the choices made for steps with
    several jobs; ``eager``: by placement.py's model of the eager copies. Also the runs the
    image's walk would ask the builder for again (``WalkRuns``; empty when eager)."""
    if eager:
        return _place_eager(b), WalkRuns()
    arena = {bf.id: bf.size for bf in b.bufs if bf.kind == "arena"}

    desc: list = []
    costed: dict = {}
    host_reads: dict[int, list[tuple[int, int]]] = {}
    for st in b.steps:
        if st.kind != "npu":
            runs = host_runs(b, *st.host)
            desc.append(runs)
            for opname, r in runs:
                if opname != "dst":
                    host_reads.setdefault((r[0] >> _SHIFT) - 1, []).append(run_span(r))
            continue
        desc.append(_step_jobs(b, st, costed))
    allruns = [r for d in desc for x in d for r in
               ((x[1],) if isinstance(x, tuple) else (*x.reads, *x.writes))]
    grains = grains_by_buffer(allruns, _SHIFT)
    res = BufferResidency(arena, list(range(b.ncores)), grains=grains, slack=_SLACK)
    outputs = {bd.tensor.buf for bd in b.lowered.outputs}
    for bd in b.lowered.inputs:
        if bd.tensor.buf in arena:
            lo = (bd.tensor.buf + 1) << _SHIFT
            res.write((lo, 1, arena[bd.tensor.buf], arena[bd.tensor.buf]), 0)
    walk = ResidentPlacement(res, host_reads, outputs)
    choices: list[CoreChoice] = []
    runs = WalkRuns({id(jr): (sj.reads, sj.writes) for st, d in zip(b.steps, desc)
                     if st.kind == "npu" for jr, sj in zip(st.jobs, d)},
                    {(st.host[0], id(st.host[1])): d for st, d in zip(b.steps, desc)
                     if st.kind != "npu"}, grains)
    for si, (st, d) in enumerate(zip(b.steps, desc)):
        if st.kind != "npu":
            walk.host_step(d, bool(st.host[1].params.get("to_reader")))
            continue
        label = ", ".join(dict.fromkeys(b.calls[jr.call].node for jr in st.jobs))
        cores, ch = walk.npu_step(d, b.ncores, si, label)
        for jr, c in zip(st.jobs, cores):
            jr.core = c
        if ch is not None:
            choices.append(ch)
    return choices, runs
