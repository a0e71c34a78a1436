"""One kick for each run of independent work a core does in an NPU step (issue 9: dispatch).

A step's runtime jobs on one core run one after another whatever their number, but the stock
kernel charges every submitted job its scheduler pass and IOMMU attach (cost.constants job_us)
and every kick its completion interrupt and re-arm (kick_us); RoPE's passes and a softmax's
per-head sub/exp leave a core ten or twenty small jobs in one step (ModernBERT, SigLIP). So
consecutive runtime jobs of one core in a step are linked into one self-chained kick: the
trailer of each one's last task gets the PC_BASE_ADDRESS redirect to the next one's first task
and its PC_REGISTER_AMOUNTS length, the redirect a kick's own chain already uses (notes:
encodings/regcmd-task-model.md, "Contiguous chaining"), and the merged job lists every task,
so TASK_NUMBER is their count. The same tasks run in the same order on the same core; the
simulator follows the redirects as silicon does.

Only independent work shares a kick: a job that reads bytes an earlier member wrote, or writes
bytes an earlier member read or wrote, starts a new one. The notes measured in-kick
read-after-write only for the DPU's ERDMA; the emitters put a pass that reads its
predecessor's output in a kick of its own, and this keeps that rule across ops. Nor do these
join: integer jobs (the CACC clears per kick and chained integer tasks are a refused hazard),
the tasks of a gapped runtime job (apart on purpose), a job whose regcmd span another job
reference also runs (their words are shared, so one trailer cannot serve both), spans that are
not back to back in the regcmd BO, and more tasks than PC_TASK_CON.TASK_NUMBER holds.
Dependent work shares a job instead, where the model says so: the jobs a core still has in a
step after the linking are gathered, in order, into one job of a kick per task (``_gather``).
The kernel kicks a job's tasks one at a time, each after the previous one's completion
interrupt (rocket_job.c in torvalds/linux steps through the job's task list; the simulator's
rj_sim_run_job), so a task that reads an earlier one's output sees it whole, as across jobs;
one drm_sched job is charged where there were several. The head of such a job must not
redirect the PC: the batched-submit kernel the simulator models runs a job whose first task
redirects as one kick of TASK_NUMBER = task_count (notes: encodings/regcmd-task-model.md), which
would chain the dependent tasks too. A self-chained kick therefore only joins behind another
job, where TASK_NUMBER = 1 stops the PC at each of its tasks (on the mainline kernel, which
always writes 1, every task is a kick anyway). A job joins when the job it saves
(cost.constants job_us) is worth more than the kicks it adds (kick_us each): never on the
keep-attached kernel, where a job costs nothing extra.

``ROCKJIT_NO_JOB_MERGE=1`` turns both off, for A/B comparisons.

The cost model prices the merged jobs (cost/from_program.py). Core placement
(resident_placement.py) still prices a step's jobs one by one: pricing them as merged moved
no encoder's placement, and on a small attention it dealt a softmax's subtraction over two
cores where the exp after it used three, so the two no longer shared a step (placement
decides step by step and cannot see that).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .. import cost, debugflags
from . import registers as R
from .host_fuse import combined_source
from .intervals import Spans
from .job_shapes import job_shape, job_span
from .regcmd import TRAILER_WORDS, LoweringError, redirect_words
from .schedule import JobRef

if TYPE_CHECKING:
    from .image_builder import ImageBuilder

_TASK_CAP = (1 << R.register("PC_TASK_CON").field("TASK_NUMBER").width) - 1

Span = tuple[int, int]


def _even_bytes(words: int) -> int:
    return 8 * (words + (words & 1))


def _joined(jobs: list[tuple], members: list[int]) -> tuple[tuple, tuple, tuple]:
    """The tasks of ``members`` in order and their read / written BOs: a BO one member writes
    is listed as written only (image_builder._runtime_jobs)."""
    tasks = tuple(t for k in members for t in jobs[k][0])
    wr = set().union(*(jobs[k][2] for k in members))
    rd = set().union(*(jobs[k][1] for k in members)) - wr
    return tasks, tuple(sorted(rd)), tuple(sorted(wr))


class StepMerger:
    """Plans one NPU step's merged jobs, patches the trailers it links (in the builder's regcmd
    word arrays) and keeps the relocations the redirects need."""

    def __init__(self, b: "ImageBuilder") -> None:
        self.b = b
        self.enabled = not debugflags.enabled(debugflags.NO_JOB_MERGE.name)
        self.relocs: list[tuple[int, int, int, int, int]] = []
        self.sources: dict[tuple[int, ...], int] = {}   # a merged job's calls -> its source
        self.c = cost.calibrated()
        b.job_groups = {}     # step -> the merged job each of its runtime jobs went into
        b.job_chained = {}    # step -> per submitted job: one self-chained kick or not

    def step(self, si: int, jrs: Sequence[JobRef], jobs: list[tuple]) -> list[tuple]:
        """Step ``si``'s jobs to submit (``merge``), counted in the builder's stats."""
        b = self.b
        out, b.job_groups[si] = self.merge(jrs, jobs)
        b.job_chained[si] = [bool(j[4]) for j in out]
        n = b._count
        for tl, _, _, core, chained, *_ in out:
            b.job_cores.append(core)
            n["jobs"] += 1
            n["tasks"] += len(tl)
            n["kicks"] += 1 if chained else len(tl)
        return out

    def finish(self) -> None:
        """The redirects' relocations joined to the image's table (the runtime sorts it)."""
        if self.relocs:
            arrays = self.b.arrays
            arrays["relocs"] = np.concatenate(
                [arrays["relocs"], np.array(self.relocs, np.uint64).reshape(-1, 5)])

    def _spans(self, jr: JobRef, hulls) -> list[Span]:
        """The arena bytes (placed offsets) of ``hulls`` (job_shapes._hull): the job's own
        scratch included, which merged neighbours of the same call share."""
        b = self.b
        binding = b.calls[jr.call].binding
        out = []
        for name, lo, hi in hulls:
            slot = binding.get(name)
            if slot is None or b.bufs[slot[0]].kind != "arena":
                continue
            base = b.plan.offsets[slot[0]] + slot[1]
            out.append((base + lo, base + hi))
        return out

    def _eligible(self, jr: JobRef) -> list[bool]:
        b = self.b
        shape = job_shape(b._shapes, jr.job)
        sp = b.rspec[jr.call]
        if sp is None:
            return [False] * len(shape.runtime)
        key = (jr.core, jr.call, job_span(b._spans, jr.job, sp.name)[0])
        if key in b.reused_spans:
            return [False] * len(shape.runtime)
        return [m[0] for m in shape.merge]

    def merge(self, jrs: Sequence[JobRef], jobs: list[tuple]) -> tuple[list[tuple], list[int]]:
        """``jobs``: the step's runtime jobs in order (image_builder._runtime_jobs' tuples for
        ``jrs``, each JobRef's in turn). Returns the jobs to submit (merged ones in place of
        their first member) and, per input job, the index of the job it went into."""
        if not self.enabled or len({j[3] for j in jobs}) == len(jobs):
            return jobs, list(range(len(jobs)))     # no core runs two of them
        b = self.b
        meta = []            # per runtime job: (eligible, read spans, write spans)
        for jr in jrs:
            shape = job_shape(b._shapes, jr.job)
            ok = self._eligible(jr)
            for r, (_, rd, wr) in enumerate(shape.merge):
                meta.append((True, self._spans(jr, rd), self._spans(jr, wr)) if ok[r]
                            else (False, [], []))
        assert len(meta) == len(jobs)
        groups: list[list[int]] = []
        open_of: dict[int, int] = {}        # core -> its open group (index into groups)
        reads_of: dict[int, Spans] = {}     # core -> the bytes its open group reads
        writes_of: dict[int, Spans] = {}    # and writes
        for i, (job, (ok, rd, wr)) in enumerate(zip(jobs, meta)):
            core = job[3]
            g = open_of.get(core)
            if not (ok and g is not None and self._joins(jobs, groups[g], i, rd, wr,
                                                         reads_of[core], writes_of[core])):
                groups.append([i])
                open_of.pop(core, None)
                if not ok:
                    continue
                g = open_of[core] = len(groups) - 1
                reads_of[core], writes_of[core] = Spans(), Spans()
            else:
                groups[g].append(i)
            for spans, new in ((reads_of[core], rd), (writes_of[core], wr)):
                for lo, hi in new:
                    spans.add(lo, hi)
        out: list[tuple] = []
        into = [0] * len(jobs)
        for members in groups:
            for i in members:
                into[i] = len(out)
            out.append(jobs[members[0]] if len(members) == 1 else self._link(jobs, members))
        gathered, into_g = self._gather(out, jobs, into)
        return gathered, [into_g[a] for a in into]

    def _gather(self, linked: list[tuple], jobs: list[tuple], into: list[int]
                ) -> tuple[list[tuple], list[int]]:
        """``linked`` (the step's jobs after linking; ``into``: runtime job -> linked job) with
        each core's consecutive jobs gathered into one unchained job where the model says a job
        saved is worth the kicks added; returns them and, per linked job, the one it went into."""
        c = self.c
        groups: list[list[int]] = []
        ntasks: list[int] = []               # per group: its tasks
        open_of: dict[int, int] = {}         # core -> its open group
        for a, job in enumerate(linked):
            tl, core, chained = job[0], job[3], job[4]
            redirects = bool(chained) and len(tl) > 1    # a self-chained kick
            g = open_of.get(core)
            if g is not None and ntasks[g] + len(tl) <= _TASK_CAP \
                    and c.job_us > (len(tl) - 1 if redirects else 0) * c.kick_us:
                groups[g].append(a)
                ntasks[g] += len(tl)
                continue
            groups.append([a])
            ntasks.append(len(tl))
            if redirects:       # heads no job: the kernel would run the whole job as its chain
                open_of.pop(core, None)
            else:
                open_of[core] = len(groups) - 1
        if len(groups) == len(linked):
            return linked, list(range(len(linked)))
        members_of: dict[int, list[int]] = {}      # linked job -> the runtime jobs in it
        for i, a in enumerate(into):
            members_of.setdefault(a, []).append(i)
        out: list[tuple] = []
        into_g = [0] * len(linked)
        for members in groups:
            for a in members:
                into_g[a] = len(out)
            out.append(linked[members[0]] if len(members) == 1 else
                       self._unchained(linked, members, jobs,
                                       [i for a in members for i in members_of[a]]))
        return out, into_g

    def _unchained(self, linked: list[tuple], members: list[int], jobs: list[tuple],
                   runtime: list[int]) -> tuple:
        """One job of ``members`` (linked jobs of one core, in order), a kick per task."""
        return (*_joined(linked, members), linked[members[0]][3], False, linked[members[0]][5],
                self._merged_source(jobs, runtime))

    def _merged_source(self, jobs: list[tuple], members: list[int]) -> int:
        """The source naming every op the runtime jobs ``members`` run."""
        b = self.b
        calls = tuple(dict.fromkeys(jobs[k][5] for k in members))
        src = self.sources.get(calls)
        if src is None:
            src = self.sources[calls] = combined_source(b, [b._source(ci) for ci in calls],
                                                        "job_merge")
        return src

    def _joins(self, jobs: list[tuple], members: list[int], i: int, rd: list[Span],
               wr: list[Span], g_reads: Spans, g_writes: Spans) -> bool:
        last = jobs[members[-1]][0][-1]
        first = jobs[i][0][0]
        if first[0] != last[0] or first[1] != last[1] + _even_bytes(last[2]):
            return False            # not back to back in the context's regcmd BO
        if sum(len(jobs[k][0]) for k in members) + len(jobs[i][0]) > _TASK_CAP:
            return False
        return not (any(g_writes.hits(lo, hi) for lo, hi in rd) or
                    any(g_reads.hits(lo, hi) or g_writes.hits(lo, hi) for lo, hi in wr))

    def _link(self, jobs: list[tuple], members: list[int]) -> tuple:
        """The merged job; each member's last trailer redirected to the next member."""
        b = self.b
        core = jobs[members[0]][3]
        words = b.arrays[f"regcmd{core}"]
        for a, c in zip(members, members[1:]):
            bo, off, cnt = jobs[a][0][-1]
            nbo, noff, ncnt = jobs[c][0][0]
            fi = off // 8 + cnt - TRAILER_WORDS
            if int(words[fi]) != 0:
                raise LoweringError(f"internal: job_merge: the task at regcmd byte {off} of "
                                    f"context {core} does not end in a sealed trailer")
            words[fi:fi + 2] = redirect_words(ncnt)
            self.relocs.append((bo, fi, nbo, noff, 0))
        return (*_joined(jobs, members), core, True, jobs[members[0]][5],
                self._merged_source(jobs, members))

