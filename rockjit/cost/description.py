"""A program as the cost model sees it: plain data, independent of the compiler.

A program is an ordered list of steps. An NPU step is a set of independent jobs fenced together
(one ``ROCKET_SUBMIT`` and one fence wait per core it uses); a job runs on one core, its kicks in
order. A kick is one
hardware start of the datapath and one completion interrupt; a task is one register program
inside a kick (seeds README, "Terms": submits, tasks and kicks vary independently). A host step
is work the CPU does between submits, described by its kind and the bytes it moves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

PRECISIONS = ("fp16", "int8", "int4", "bf16", "tf32")


@dataclass(frozen=True)
class CostTask:
    """One register program: the MACs it runs (by precision) and the DMA bytes it moves."""

    macs: Mapping[str, int] = field(default_factory=dict)
    dma_read: int = 0
    dma_written: int = 0


@dataclass(frozen=True)
class CostJob:
    """One drm_sched job on one core: ``kicks`` hardware starts running ``tasks`` in order.

    ``kicks`` is 1 for a self-chained job (all tasks in one kick) and ``len(tasks)`` for an
    unchained one (one kick per task)."""

    core: int
    tasks: Sequence[CostTask]
    kicks: int

    def __post_init__(self) -> None:
        if not 1 <= self.kicks <= max(1, len(self.tasks)):
            raise ValueError(f"a job of {len(self.tasks)} task(s) cannot take {self.kicks} kick(s)")


@dataclass(frozen=True)
class CostNpuStep:
    """Independent jobs fenced together: one SUBMIT per core (context) that has jobs in the
    step (rocket gives each fd its own context; csrc/rocket/rocket_device.c submits once per
    fd), and the cores run their jobs side by side."""

    jobs: Sequence[CostJob]
    label: str = ""


@dataclass(frozen=True)
class CostHostStep:
    """CPU work between submits. ``kind``: "gather" (layout pack/unpack, strided reads and
    writes, element-wise maths) or "copy" (contiguous memcpy-like moves)."""

    kind: str
    nbytes: int
    label: str = ""
    # CPU threads sharing the step: rockjit's runtime splits a step of >= 256 KiB over its
    # host threads (3 on the board by default; csrc/runtime/rj_host_pool.h), from_program.py
    # sets what the runtime decides; the published multicore figures use 3 (published.py)
    threads: int = 1

    def __post_init__(self) -> None:
        if self.kind not in HOST_KINDS:
            raise ValueError(f"host step kind {self.kind!r} is not one of {HOST_KINDS}")
        if self.threads < 1:
            raise ValueError(f"host step {self.label or self.kind!r}: threads must be >= 1")


HOST_KINDS = ("gather", "copy")

CostStep = Union[CostNpuStep, CostHostStep]


@dataclass(frozen=True)
class CostProgram:
    steps: Sequence[CostStep]
    name: str = ""

    def counts(self) -> dict[str, int]:
        npu = [s for s in self.steps if isinstance(s, CostNpuStep)]
        jobs = [j for s in npu for j in s.jobs]
        return {
            "npu_steps": len(npu), "submits": sum(len({j.core for j in s.jobs}) for s in npu),
            "jobs": len(jobs), "kicks": sum(j.kicks for j in jobs),
            "tasks": sum(len(j.tasks) for j in jobs),
            "host_steps": sum(1 for s in self.steps if isinstance(s, CostHostStep)),
            "host_bytes": sum(s.nbytes for s in self.steps if isinstance(s, CostHostStep)),
            "dma_bytes": sum(t.dma_read + t.dma_written for j in jobs for t in j.tasks),
            **{f"macs_{p}": sum(t.macs.get(p, 0) for j in jobs for t in j.tasks)
               for p in PRECISIONS},
        }
