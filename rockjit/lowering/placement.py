"""Core placement under the eager copies (ROCKJIT_EAGER_COPIES; by default placement follows
the residency-tracked copies, resident_placement.py, which reuses ``CoreChoice``): how many
cores an NPU step's independent jobs use, by modelled cost.

The jobs of one step may run side by side on the device's cores, but a core other than 0 is
its own context (rocket: one fd, one IOVA space) with a mirror of the arena; in the eager scheme
every arena run its jobs' DMA reads is copied in by the host before the step and every run they
write is copied back after it (context_copies.eager_copies). For each step with more than one job this module
models, with ``rockjit.cost`` (calibrated constants, the model's default clock), the step dealt
round-robin over k = 1 .. min(cores, jobs) cores:

    submits(k) + the slowest core's jobs + the host copies the cores > 0 imply

and keeps the cheapest (the fewest cores on a tie). k = all cores is the schedule's fixed rule
(schedule.py: job index mod cores), so a choice of k < all cores is a place where the model
overruled it; every choice, with both sides' modelled costs, is a ``CoreChoice``.

The cost model has no fixed cost per host step, so a copy costs its bytes at the host's copy
rate only (``Constants.host_copy_gbps``; an assumption that favours spreading for steps with
many small runs). The weights a core's jobs read are uploaded once at load, not per call, so
they cost nothing here.

Pure: it reads plain descriptions (cost jobs and arena runs) and returns the choice; the image
builder applies it. Moving a job between cores never changes what it computes: the same words
run on a mirror of the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .. import cost
from ..cost import Constants, CostHostStep, CostJob, CostNpuStep, CostProgram

Run = tuple[int, int, int, int]   # arena (start, pieces, pitch, chunk): pieces x chunk bytes


@dataclass(frozen=True)
class StepJob:
    """One scheduled job: the runtime jobs it becomes (as the cost model sees them, on any
    core) and the arena runs its DMA reads and writes."""

    jobs: tuple[CostJob, ...]
    reads: tuple[Run, ...]
    writes: tuple[Run, ...]


@dataclass(frozen=True)
class CoreChoice:
    """One step's decision: modelled ms and host copy bytes per number of cores tried."""

    step: int
    label: str
    jobs: int
    cores: int                      # the choice
    rule_cores: int                 # the fixed rule's (round-robin over every core)
    modelled_ms: dict[int, float]   # cores -> modelled ms of the step with its copies
    copy_bytes: dict[int, int]      # cores -> host bytes copied between contexts
    # each job's core (resident_placement.py); empty: round-robin over ``cores``
    assignment: tuple[int, ...] = ()

    @property
    def agrees(self) -> bool:
        return self.cores == self.rule_cores

    def describe(self) -> str:
        opts = ", ".join(f"{k} core{'s' if k > 1 else ''} {ms:.4f} ms"
                         f" ({self.copy_bytes[k] / 1e3:.1f} kB copied)"
                         for k, ms in sorted(self.modelled_ms.items()))
        verdict = ("round-robin kept" if self.agrees
                   else f"round-robin over {self.rule_cores} overruled")
        if self.assignment:     # resident_placement.py: the jobs went where their data is
            per = "/".join(str(self.assignment.count(c)) for c in range(self.cores))
            verdict = ("every core" if self.agrees else
                       f"{self.cores} cores, round-robin over {self.rule_cores} overruled") + \
                f"; jobs per core {per} by where their data is"
        return f"{self.jobs} jobs, modelled {opts}; {verdict}"


def _run_bytes(run: Run) -> int:
    return run[1] * run[3]


def option(jobs: Sequence[StepJob], k: int, label: str = "") -> CostProgram:
    """The step with job i on core i mod k, as a cost program: the copies into cores > 0, the
    NPU step, the copies back (each distinct run once per core, as the image builder copies)."""
    ins: dict[int, dict[Run, None]] = {}
    outs: dict[int, dict[Run, None]] = {}
    npu: list[CostJob] = []
    for i, sj in enumerate(jobs):
        core = i % k
        npu.extend(replace(j, core=core) for j in sj.jobs)
        if core:
            ins.setdefault(core, {}).update(dict.fromkeys(sj.reads))
            outs.setdefault(core, {}).update(dict.fromkeys(sj.writes))

    def copies(runs: dict[int, dict[Run, None]]) -> list[CostHostStep]:
        return [CostHostStep("copy", _run_bytes(r), "cross-context copy")
                for c in sorted(runs) for r in runs[c]]

    return CostProgram([*copies(ins), CostNpuStep(npu, label), *copies(outs)], name=label)


def choose(jobs: Sequence[StepJob], cores: int, step: int = 0, label: str = "",
           constants: Constants | None = None) -> CoreChoice:
    """The number of cores (1 .. min(cores, jobs)) with the least modelled step time."""
    c = constants or cost.calibrated()
    top = max(1, min(cores, len(jobs)))
    ms: dict[int, float] = {}
    nbytes: dict[int, int] = {}
    for k in range(1, top + 1):
        prog = option(jobs, k, label)
        ms[k] = cost.estimate(prog, constants=c).ms
        nbytes[k] = sum(s.nbytes for s in prog.steps if isinstance(s, CostHostStep))
    best = min(ms, key=lambda k: (ms[k], k))
    return CoreChoice(step, label, len(jobs), best, top, ms, nbytes)
