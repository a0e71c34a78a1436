"""Tasks -> kicks -> jobs: the one place an op's tasks are laid out in its regcmd buffer.

A job is a list of kicks, each a list of tasks self-chained into one hardware kick (notes:
encodings/regcmd-task-model.md "Contiguous chaining"); a kick longer than
PC_TASK_CON.TASK_NUMBER allows is split. A kick boundary is a retire boundary, so a pass that
reads what the previous kick wrote may start after it.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from .. import registers as R
from ..op_lowering import NpuJob
from ..profile import ChipProfile
from ..regcmd import Kick, EmittedTask, LoweringError, link
from ..tiling import round_up


@dataclass
class JobTasks:
    """One job before layout: its kicks (each a list of tasks) and the buffers it uses."""

    kicks: list[list[EmittedTask]]
    reads: Sequence[str] = ()        # in the order the job lists them
    writes: Sequence[str] = ()
    integer: bool = False


def assemble_jobs(profile: ChipProfile, jobs: Sequence[JobTasks],
                  regcmd: str = "regcmd") -> tuple[list[NpuJob], int]:
    """Lay every kick of ``jobs`` out back to back in ``regcmd`` (each start aligned to
    ``profile.regcmd_align_bytes``); returns the NpuJobs and the byte where the last kick
    ends. A buffer listed as written is not listed as read: the intra-kick read of a partial
    is device-internal, and a BO in both lists makes the kernel complete the job without
    running it (regcmd-task-model.md, "Two traps")."""
    cap = (1 << R.register("PC_TASK_CON").field("TASK_NUMBER").width) - 1
    out: list[NpuJob] = []
    pos = end = 0
    for job in jobs:
        kicks: list[Kick] = []
        for tasks in job.kicks:
            for i in range(0, len(tasks), cap):
                pos = round_up(end, profile.regcmd_align_bytes)
                k = link(tasks[i:i + cap], profile, regcmd, pos)
                kicks.append(k)
                end = pos + k.nbytes
        out.append(NpuJob(tuple(kicks), reads=tuple(r for r in job.reads if r not in job.writes),
                          writes=tuple(job.writes), integer=job.integer))
    return out, end


_WHOLE = 1 << 62


def _touches(task: EmittedTask) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """(reads, writes) of a task as (buffer, lo, hi); a buffer it addresses without a declared
    stream counts as written whole (as coalesce.py takes it), so no split can separate it."""
    rd = [(a.buffer, a.offset, a.offset + a.extent) for a in task.reads]
    wr = [(a.buffer, a.offset, a.offset + a.extent) for a in task.writes]
    declared = {t[0] for t in rd} | {t[0] for t in wr}
    wr += [(n, 0, _WHOLE) for n in dict.fromkeys(r.buffer for r in task.relocs.values())
           if n not in declared]
    return rd, wr


def split_by_range(groups: Sequence[Sequence[EmittedTask]], bounds: Sequence[int],
                   reads: Sequence[str], writes: Sequence[str]) -> list[JobTasks]:
    """The passes ``groups`` (run in order) as independent jobs, one per byte range of a flat
    run cut at ``bounds``: job j holds every pass's tasks whose first write starts in range j,
    in pass order, so a later pass reading what an earlier one wrote finds it in its own job.

    Jobs of one step run on any core in any order, so two ranges stay one job wherever a task
    of one writes bytes (any buffer, scratch included) that a task of the other reads or
    writes; the declared DMA streams (regcmd.Access) say which bytes. The emitter's chunkings
    only have to agree on ``bounds`` for the split to happen; where they do not, the ranges
    merge and the program is still right."""
    n = len(bounds) + 1
    parts: list[list[list[EmittedTask]]] = [[[] for _ in groups] for _ in range(n)]
    hull: dict[tuple[int, str, bool], list[int]] = {}     # (part, buffer, written) -> [lo, hi]
    for gi, g in enumerate(groups):
        for t in g:
            rd, wr = _touches(t)
            p = bisect_right(bounds, wr[0][1]) if wr else 0
            parts[p][gi].append(t)
            for (b, lo, hi), w in [*((x, False) for x in rd), *((x, True) for x in wr)]:
                h = hull.setdefault((p, b, w), [lo, hi])
                h[0], h[1] = min(h[0], lo), max(h[1], hi)
    # joined[i]: part i runs in one job with part i - 1 (a conflict between parts a < z joins
    # every part between them: jobs stay contiguous ranges, in order)
    joined = [False] * n
    for (p, b, w), (lo, hi) in hull.items():
        if not w:
            continue
        for (q, b2, _), (lo2, hi2) in hull.items():
            if q != p and b2 == b and lo < hi2 and lo2 < hi:
                for i in range(min(p, q) + 1, max(p, q) + 1):
                    joined[i] = True
    jobs: list[JobTasks] = []
    for i in range(n):
        if joined[i]:
            for gi, ts in enumerate(parts[i]):
                jobs[-1].kicks[gi].extend(ts)
        else:
            jobs.append(JobTasks([list(ts) for ts in parts[i]], reads, writes))
    out = []
    for j in jobs:
        kicks = [k for k in j.kicks if k]
        if not kicks:
            continue
        used = {r.buffer for k in kicks for t in k for r in t.relocs.values()}
        out.append(JobTasks(kicks, tuple(r for r in reads if r in used),
                            tuple(w for w in writes if w in used)))
    if sum(len(k) for j in out for k in j.kicks) != sum(len(g) for g in groups):
        raise LoweringError("internal: split_by_range lost tasks")
    return out
