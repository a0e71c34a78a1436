"""The cost model's constants: a handful, each with its source and how it was set.

Cited constants are published figures used as they stand. Fitted constants are solved from the
published figures marked ``fit`` in ``published.FIGURES`` (``calibrate.fit``; ``calibrate.calibrated()`` is the fitted set); the figures marked
``held_out`` are not used to set anything and tests/cost checks the model against them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# MACs per cycle per core by precision. notes: hardware-overview.md "TOPS vs reality": ~3 TFLOPS
# fp16 / ~6 TOPS int8 / ~12 TOPS int4 for 3 cores at 1 GHz, i.e. 512 / 1024 / 2048 MACs per
# cycle per core; datatypes.md: bf16 at the fp16 rate, tf32 at half of it.
MACS_PER_CYCLE = {"fp16": 512, "bf16": 512, "int8": 1024, "int4": 2048, "tf32": 256}

# Host rates on the board's Cortex-A76. notes: perf/not-mac-bound.md "An analytical bytes-moved
# model": the layout scatter packs 33.75 MB in 36 ms (~0.9 GB/s, latency/index-bound, not
# bandwidth-bound); perf/rga-detile.md: a single-threaded CPU memcpy moves 13.4 GB/s.
HOST_GATHER_GBPS = 33.75e6 / 36e-3 / 1e9
HOST_COPY_GBPS = 13.4


@dataclass(frozen=True)
class Constants:
    submit_us: float          # one ROCKET_SUBMIT + fence wait + waiter wakeup      (fitted)
    job_us: float             # per drm_sched job: IOMMU attach/detach, stock kernel (fitted)
    # per hardware kick: completion IRQ + re-arm + the kick's regcmd fetch (fitted). The
    # published figures do not separate a kick from a task inside a self-chained kick (the
    # probes' tasks are one kick each); a chained task's fetch is taken as free, so the model
    # credits chaining with the whole per-kick cost: an optimistic bound on chaining.
    kick_us: float
    dma_gbps: float           # per-core DMA bytes (read + written) per second / 1e9 (fitted)
    # per task, chained or not: the CBUF fill before a task's MACs start and the DPU drain after
    # them, which no kick saves (fitted on a chained whole network; the kick_us figure is of
    # unchained tasks, so there kick_us + fill_us is what it measures). It is what makes a
    # tiling of many small tasks dear (lowering/tile_choice.py).
    fill_us: float = 0.0
    host_gather_gbps: float = HOST_GATHER_GBPS   # cited
    host_copy_gbps: float = HOST_COPY_GBPS       # cited
    macs_per_cycle: dict = field(default_factory=lambda: dict(MACS_PER_CYCLE))  # cited

    def keep_attached(self) -> "Constants":
        """The kernel with the IOMMU keep-attached patch (notes: perf/iova-and-multicore.md,
        "Per-job IOMMU dispatch cost"): no per-job attach/detach."""
        return replace(self, job_us=0.0)

    def replace(self, **kw) -> "Constants":
        return replace(self, **kw)
