"""Schedule: the placed calls become an ordered list of NPU steps and host steps.

* Dependency order is program order: the pipeline places calls after everything they read.
* The calls of one parallel group (a rule's independent calls: attention heads, batched
  matmuls) whose programs have the same shape of steps are merged position by position: their
  host steps run back to back and their NPU steps become one step whose jobs are independent.
* The jobs of an NPU step are dealt round-robin over the cores (``core`` = job index mod
  cores): attention heads and a matmul's N tiles run side by side. This is the default; the
  image builder then chooses how many cores each step uses by modelled cost (placement.py).
* A job's kicks stay in order on its core. Self-chained kicks (several tasks in one kick) come
  from the emitters (fp16 only; regcmd.link refuses integer tasks); a run of single-task kicks
  is one unchained job (one kick per task).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Sequence

from .op_lowering import HostStep, NpuJob, NpuStep
from .regcmd import Kick


@dataclass
class JobRef:
    call: int          # index into the placed calls
    job: NpuJob
    core: int


@dataclass
class ScheduledStep:
    kind: str                                   # "npu" | "host"
    jobs: list[JobRef] = field(default_factory=list)
    host: tuple[int, HostStep] | None = None    # (call index, step)

    @property
    def calls(self) -> set[int]:
        return {j.call for j in self.jobs} if self.kind == "npu" else {self.host[0]}


def runtime_jobs(job: NpuJob) -> list[tuple[tuple[Kick, ...], bool]]:
    """Split a job's kicks into runtime jobs: (kicks, chained). A chained kick is one runtime
    job; consecutive single-task kicks form one unchained job."""
    out: list[tuple[tuple[Kick, ...], bool]] = []
    for chained, ks in groupby(job.kicks, key=lambda k: k.task_number > 1):
        ks = tuple(ks)
        if chained:
            out.extend(((k,), True) for k in ks)
        else:
            out.append((ks, False))
    return out


def _signature(prog) -> tuple[str, ...]:
    return tuple("npu" if isinstance(s, NpuStep) else "host" for s in prog.steps)


def schedule(calls: Sequence, cores: int) -> list[ScheduledStep]:
    """``calls``: PlacedCall list (pipeline.py) in dependency order."""
    steps: list[ScheduledStep] = []
    i = 0
    while i < len(calls):
        j = i
        while j + 1 < len(calls) and calls[j + 1].group == calls[i].group:
            j += 1
        members = list(range(i, j + 1))
        sigs = {_signature(calls[k].call.lowering) for k in members}
        if len(members) > 1 and len(sigs) == 1:
            sig = sigs.pop()
            for pos, kind in enumerate(sig):
                if kind == "host":
                    for k in members:
                        steps.append(ScheduledStep("host", host=(k, calls[k].call.lowering.steps[pos])))
                else:
                    st = ScheduledStep("npu")
                    for k in members:
                        for jb in calls[k].call.lowering.steps[pos].jobs:
                            st.jobs.append(JobRef(k, jb, len(st.jobs) % max(cores, 1)))
                    steps.append(st)
        else:
            for k in members:
                for s in calls[k].call.lowering.steps:
                    if isinstance(s, HostStep):
                        steps.append(ScheduledStep("host", host=(k, s)))
                    else:
                        st = ScheduledStep("npu")
                        for jb in s.jobs:
                            st.jobs.append(JobRef(k, jb, len(st.jobs) % max(cores, 1)))
                        steps.append(st)
        i = j + 1
    return steps


def call_spans(steps: Sequence[ScheduledStep], ncalls: int) -> list[tuple[int, int]]:
    """(first, last) step index of every call (calls without steps get an empty span at the
    position of their neighbours)."""
    first = [1 << 60] * ncalls
    last = [-1] * ncalls
    for si, st in enumerate(steps):
        for c in st.calls:
            first[c] = min(first[c], si)
            last[c] = max(last[c], si)
    prev = 0
    for c in range(ncalls):
        if last[c] < 0:
            first[c] = last[c] = prev
        prev = last[c]
    return list(zip(first, last))
