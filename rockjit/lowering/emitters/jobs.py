"""Tasks -> kicks -> jobs: the one place an op's tasks are laid out in its regcmd buffer.

A job is a list of kicks, each a list of tasks self-chained into one hardware kick (notes:
encodings/regcmd-task-model.md "Contiguous chaining"); a kick longer than
PC_TASK_CON.TASK_NUMBER allows is split. A kick boundary is a retire boundary, so a pass that
reads what the previous kick wrote may start after it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import registers as R
from ..op_lowering import NpuJob
from ..profile import ChipProfile
from ..regcmd import Kick, EmittedTask, link
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
