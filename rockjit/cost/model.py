"""The cost model: modelled time of a ``description.CostProgram`` at a given NPU clock.

    NPU step   = submit x cores used + max over cores of  sum over the core's jobs of
                 [ job + kicks * kick + sum over tasks of (DMA bytes / dma_bw
                                                           + MACs / MAC rate(precision, clock)) ]
    host step  = bytes / (host bandwidth(kind) x threads sharing it)
    program    = sum of its steps (the runtime runs steps in order; nothing overlaps a fence)

Within a task DMA and MACs are added, not overlapped: the published profiles show the datapath
bound by CBUF fill plus dispatch, far from the MAC peak (notes: perf/not-mac-bound.md), and a
task's MACs start only once its CBUF tiles are in. Every number this module returns is a model
output, not a measurement: ``Estimate`` says so in its label.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .constants import Constants
from .description import CostHostStep, CostNpuStep, CostProgram

LABEL = "modelled"
BUCKETS = ("dispatch", "dma", "mac", "host")


@dataclass
class StepEstimate:
    kind: str                      # "npu" | "host"
    label: str
    ms: float
    buckets: dict[str, float]      # ms per bucket (NPU: the critical core's)


@dataclass
class Estimate:
    """Modelled time of a program: per step, per bucket and in total (milliseconds)."""

    clock_mhz: float
    steps: list[StepEstimate] = field(default_factory=list)
    label: str = LABEL

    @property
    def ms(self) -> float:
        return sum(s.ms for s in self.steps)

    def bucket_ms(self) -> dict[str, float]:
        out = dict.fromkeys(BUCKETS, 0.0)
        for s in self.steps:
            for k, v in s.buckets.items():
                out[k] += v
        return out

    def summary(self) -> dict[str, float]:
        return {"modelled_ms": self.ms,
                **{f"modelled_{k}_ms": v for k, v in self.bucket_ms().items()},
                "modelled_clock_mhz": self.clock_mhz}


def mac_rate(c: Constants, precision: str, clock_mhz: float) -> float:
    """MACs per second of one core at ``clock_mhz``."""
    try:
        per_cycle = c.macs_per_cycle[precision]
    except KeyError:
        raise ValueError(f"the cost model has no MAC rate for precision {precision!r} "
                         f"(known: {sorted(c.macs_per_cycle)})") from None
    return per_cycle * clock_mhz * 1e6


def estimate(program: CostProgram, clock_mhz: float, constants: Constants) -> Estimate:
    """The modelled time of ``program`` with the given constants (``rockjit.cost.estimate``
    defaults them to the calibrated set)."""
    c = constants
    if clock_mhz <= 0:
        raise ValueError(f"NPU clock must be positive, got {clock_mhz} MHz")
    est = Estimate(clock_mhz)
    us = 1e-3  # µs -> ms
    for st in program.steps:
        if isinstance(st, CostHostStep):
            bw = c.host_gather_gbps if st.kind == "gather" else c.host_copy_gbps
            ms = st.nbytes / (bw * 1e9 * st.threads) * 1e3
            est.steps.append(StepEstimate("host", st.label or st.kind, ms,
                                          {"dispatch": 0.0, "dma": 0.0, "mac": 0.0, "host": ms}))
            continue
        assert isinstance(st, CostNpuStep)
        per_core: dict[int, dict[str, float]] = {}
        for job in st.jobs:
            b = per_core.setdefault(job.core, {"dispatch": 0.0, "dma": 0.0, "mac": 0.0})
            fills = sum(1 for t in job.tasks if t.dma_read)
            b["dispatch"] += (c.job_us + job.kicks * c.kick_us + fills * c.fill_us) * us
            for t in job.tasks:
                b["dma"] += (t.dma_read + t.dma_written) / (c.dma_gbps * 1e9) * 1e3
                for p, n in t.macs.items():
                    if n:
                        b["mac"] += n / mac_rate(c, p, clock_mhz) * 1e3
        crit = max(per_core.values(), key=lambda b: sum(b.values()),
                   default={"dispatch": 0.0, "dma": 0.0, "mac": 0.0})
        # one SUBMIT ioctl + fence wait per core used: the host issues and waits on them in turn
        buckets = {"dispatch": c.submit_us * us * len(per_core) + crit["dispatch"],
                   "dma": crit["dma"],
                   "mac": crit["mac"], "host": 0.0}
        est.steps.append(StepEstimate("npu", st.label or "npu", sum(buckets.values()), buckets))
    return est
