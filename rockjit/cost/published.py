"""Published figures, each described as a program in the cost model's own terms.

Every figure names its source, the kernel it ran on ("stock" mainline rocket or with the IOMMU
keep-attached patch the seeds' performance figures assume), the NPU clock, and whether
calibrate.fit uses it (``fit``: the constant it sets) or it is held out to test the model.

Where a source does not state the kernel (the single-fd matmul profile) it is taken as the
seeds' patched kernel; the difference is 20 us per job, under 0.3% of that figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .description import CostHostStep, CostJob, CostNpuStep, CostProgram, CostTask
from .networks import NETWORKS


@dataclass(frozen=True)
class Figure:
    name: str
    ms: float                       # the published time
    build: Callable[[], CostProgram]
    clock_mhz: float
    kernel: str                     # "stock" | "keep_attached"
    source: str
    fits: str | None = None         # the constant this figure sets; None: held out


def _tiny_job(tasks: int) -> CostProgram:
    # a probe job: near-zero work per task; each task its own kick (mainline re-arms per task)
    return CostProgram([CostNpuStep([CostJob(0, [CostTask()] * tasks, kicks=tasks)])],
                       name=f"{tasks}-task job")


def one_kick_network(name: str) -> CostProgram:
    """A whole int8 CNN as one submit, one job, one kick, one task per layer (seeds README,
    "Whole networks")."""
    tasks = [CostTask({"int8": l.macs}, l.weight_bytes + l.in_bytes, l.out_bytes)
             for l in NETWORKS[name]()]
    return CostProgram([CostNpuStep([CostJob(0, tasks, kicks=1)], label=name)], name=name)


# The matmul the notes and the seeds' README time: M x K x N = 512 x 3840 x 4096.
MM = (512, 3840, 4096)
# Tiles at Mt = Nt = 256 with the largest K tile the 384 KB CBUF holds: Kt = 384 / 768 for
# fp16 / int8 (notes: hardware-overview.md, "Kt @ Mt=Nt=256"). fp16: 2 x 16 x 10 = 320 tiles, as
# the notes count them (perf/iova-and-multicore.md, "320 tiles"). int4 writes int16 partials,
# so its K tile is capped for int16 saturation: kt_cap = 480 for in-model [-7, 7] operands
# (seeds API reference, rocket_matmul_int4_ex), not the CBUF's 1536. Which cap the published
# 413 GOP/s run used is not stated; with Kt = 1536 the model lands at 0.28x of it.
_KT = {"fp16": 384, "int8": 768, "int4": 480}
_IN_BYTES = {"fp16": 2.0, "int8": 1.0, "int4": 0.5}
_OUT_BYTES = {"fp16": 2, "int8": 4, "int4": 2}   # fp16 out / int32 / int16 partials (datatypes.md)


def tiled_matmul(precision: str, cores: int, resident: bool, host_threads: int = 1) -> CostProgram:
    """The tiled matmul as the notes describe it (perf/not-mac-bound.md, bytes-moved table):
    one submit per K tile (fp16 K-accumulates on the NPU, so K tiles fence in order), its
    nMt x nNt tiles dealt over ``cores`` jobs, one kick per tile (batched submit off by default).
    DMA per tile: the weight tile (no weight reuse), the feature tile once per (m, k) (DATA_REUSE),
    the output tile; fp16 K tiles after the first also read the previous partial (DPU EW add).
    Host: the A pack (and the B pack unless resident) and the readback (fp16: M x N once;
    integer: every K tile's partials, nKt x M x N, summed on the host), shared by
    ``host_threads`` CPU cores (the multicore library's workers de-tile their own slices across
    3 A76 cores: notes perf/rga-detile.md)."""
    return tiled_matmul_of(MM, 256, 256, _KT[precision], precision, cores, resident, host_threads)


def tiled_matmul_of(shape: tuple[int, int, int], mt: int, nt: int, kt: int, precision: str,
                    cores: int, resident: bool, host_threads: int = 1) -> CostProgram:
    """``tiled_matmul`` of any M x K x N with Mt x Nt output tiles and a K tile of ``kt``."""
    M, K, N = shape
    nmt, nnt, nkt = -(-M // mt), -(-N // nt), -(-K // kt)
    e, eo = _IN_BYTES[precision], _OUT_BYTES[precision]
    steps: list = [CostHostStep("gather", int(M * K * e), "pack A", host_threads)]
    if not resident:
        steps.append(CostHostStep("gather", int(N * K * e), "pack B", host_threads))
    for k in range(nkt):
        kk = min(kt, K - k * kt)
        per_core: dict[int, list[CostTask]] = {}
        i = 0
        for m in range(nmt):
            for n in range(nnt):
                rd = int(nt * kk * e) + (int(mt * kk * e) if n == 0 else 0)
                if precision == "fp16" and k > 0:
                    rd += mt * nt * eo
                per_core.setdefault(i % cores, []).append(
                    CostTask({precision: mt * nt * kk}, rd, mt * nt * eo))
                i += 1
        steps.append(CostNpuStep([CostJob(c, ts, kicks=len(ts)) for c, ts in per_core.items()],
                             label=f"K tile {k}"))
    readback = M * N * eo * (1 if precision == "fp16" else nkt)
    steps.append(CostHostStep("gather", readback, "readback", host_threads))
    return CostProgram(steps, name=f"{precision} matmul {M}x{K}x{N}, {cores} core(s)")


# The tile-shape A/B of notes perf/asymmetric-tile.md ("The measurement", HW sweep 2026-06-30,
# RK3588 at 600 MHz, warm median, the notes' matmul library: KACC + DATA_REUSE, one kick per
# tile): M x K x N and the published gain, in percent, of Mt=256 / Nt=128 / Kt=512 over the
# symmetric Mt=Nt=256 / Kt=384 (a published range is given by its middle: "+7-9%" -> 8.0,
# "+5-7%" -> 6.0). The same page: Mt=128 / Nt=256 measured slower than Mt=256 / Nt=128 (no
# figure). No constant is fitted on any of them (tests/cost/test_tile_ordering.py).
ASYM_TILE_AB: tuple[tuple[int, int, int, float], ...] = (
    (512, 2048, 2048, 15.8), (512, 2048, 4096, 13.8), (2048, 4096, 4096, 9.2),
    (1024, 4096, 4096, 8.0), (512, 8192, 2048, 8.1), (1024, 8192, 8192, 7.2),
    (512, 15360, 3840, 6.0), (512, 4096, 4096, 6.0), (512, 3840, 15360, 2.0),
    (512, 3840, 4096, 2.0))
ASYM_TILE_SOURCE = "notes perf/asymmetric-tile.md: The measurement (HW sweep 2026-06-30)"


def _npu_only(p: CostProgram) -> CostProgram:
    return CostProgram([s for s in p.steps if isinstance(s, CostNpuStep)], name=p.name + " (NPU wait)")


def _gops_ms(gops: float) -> float:
    M, K, N = MM
    return 2 * M * K * N / (gops * 1e9) * 1e3


_SEEDS = "seeds README (/work/shared/seeds/001_*.txt)"
_IOVA = "notes perf/iova-and-multicore.md"

FIGURES: tuple[Figure, ...] = (
    Figure("1-task submit, keep-attached", 34e-3, lambda: _tiny_job(1), 600, "keep_attached",
           _IOVA + ": submit_overhead_rocket median 54 -> 34 us/submit", fits="submit_us"),
    Figure("1-task submit, stock", 54e-3, lambda: _tiny_job(1), 600, "stock",
           _IOVA + ": submit_overhead_rocket median 54 us/submit", fits="job_us"),
    Figure("64-task job, stock", 7.68 / 10, lambda: _tiny_job(64), 600, "stock",
           _IOVA + ": multicore_probe J=1, 7.68 ms over 10 jobs", fits="kick_us"),
    Figure("64-task job, keep-attached", 7.50 / 10, lambda: _tiny_job(64), 600,
           "keep_attached", _IOVA + ": multicore_probe J=1, 7.50 ms over 10 jobs"),
    Figure("fp16 matmul 512x3840x4096, 1 fd, NPU wait", 84.0,
           lambda: _npu_only(tiled_matmul("fp16", 1, resident=False)), 600, "keep_attached",
           "notes perf/not-mac-bound.md: warm single-fd KACC+DATA_REUSE profile wait=84 ms"),
    Figure("ResNet-18-224 int8, one kick", 9.2, lambda: one_kick_network("ResNet-18-224"), 600,
           "keep_attached", _SEEDS + ": Whole networks", fits="dma_gbps"),
    Figure("MobileNetV1-224 int8, one kick", 4.9, lambda: one_kick_network("MobileNetV1-224"),
           600, "keep_attached", _SEEDS + ": Whole networks"),
    Figure("MobileNetV2-224 int8, one kick", 6.7, lambda: one_kick_network("MobileNetV2-224"),
           600, "keep_attached", _SEEDS + ": Whole networks", fits="fill_us"),
    Figure("Inception V1-224 int8, one kick", 10.8,
           lambda: one_kick_network("Inception V1-224"), 600, "keep_attached",
           _SEEDS + ": Whole networks"),
    Figure("fp16 matmul 512x3840x4096 resident, 3 cores", _gops_ms(461),
           lambda: tiled_matmul("fp16", 3, resident=True, host_threads=3), 600, "keep_attached",
           _SEEDS + ": Performance, fp16 461 GOP/s"),
    Figure("int8 matmul 512x3840x4096 resident, 3 cores", _gops_ms(386),
           lambda: tiled_matmul("int8", 3, resident=True, host_threads=3), 600, "keep_attached",
           _SEEDS + ": Performance, int8 386 GOP/s"),
    Figure("int4 matmul 512x3840x4096 resident, 3 cores", _gops_ms(413),
           lambda: tiled_matmul("int4", 3, resident=True, host_threads=3), 600, "keep_attached",
           _SEEDS + ": Performance, int4 413 GOP/s"),
)
