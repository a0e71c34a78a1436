"""Benchmark: a 1024x768x3072 fp16 matmul as simulator programs vs numpy float32 matmul.

    python bench/sim_matmul.py [--m 1024 --k 768 --n 3072 --reps 3]

The task words are derived from conformance case 01 (a hardware-validated fp16 1x1-conv
matmul) with the size, stride, address and CBUF fields recomputed (tests/sim/programs.py).
Tiling: one task must hold its feature tile and weight tile in the 12 x 32 KB CBUF
(notes: hardware-overview.md), so Mt = Nt = 128 with the whole K = 768 (6 + 6 banks). Tasks
run M-tile outer, N-tile inner with DATA_REUSE on the inner tasks (notes:
encodings/cbuf-reuse.md), self-chained into one kick per M-tile (fp16 chains bit-exactly:
notes: encodings/regcmd-task-model.md).

Besides the times and their ratio it prints where the simulator's time went in its best run
(rj_sim_get_phase_ns: feature fetch, weight unpacking, feature packing, MAC, DPU + write).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sim"))

from harness import Simulator, open_case  # noqa: E402
from programs import ConvGeometry, chain_to, retarget, set_fields  # noqa: E402
from rockjit._rjc import ffi, lib  # noqa: E402

REGCMD, FEATURE, WEIGHT, OUTPUT = 0x10000000, 0x20000000, 0x40000000, 0x60000000
CBUF_BANK, CBUF_BANKS = 32768, 12


def plan_tiles(M: int, K: int, N: int) -> tuple[int, int]:
    """Largest Mt (multiple of 4) and Nt (multiple of 16) <= 128 whose fp16 feature and weight
    tiles fit the 12 banks together with the whole K."""
    for mt in (128, 64, 32, 16, 8, 4):
        for nt in (128, 64, 32, 16):
            if M % mt or N % nt:
                continue
            banks = -(-mt * K * 2 // CBUF_BANK) + -(-nt * K * 2 // CBUF_BANK)
            if banks <= CBUF_BANKS:
                return mt, nt
    raise SystemExit(f"no single-K tile fits the CBUF for K={K}; K-tiling is not part of this bench")


def build(M: int, K: int, N: int):
    mt, nt = plan_tiles(M, K, N)
    (_iova, base), = open_case("01_matmul_fp16").jobs()[0]
    g = ConvGeometry(C=K, H=mt, W=1, N=nt)
    n_mt, n_nt = M // mt, N // nt
    stride = 8 * ((len(base) + 1) & ~1)
    jobs = []
    for mi in range(n_mt):
        tasks = []
        for ni in range(n_nt):
            w = retarget(base, g, FEATURE + mi * mt * K * 2, WEIGHT + ni * nt * K * 2,
                         OUTPUT + (mi * n_nt + ni) * mt * nt * 2)
            if ni:
                w = set_fields(w, "CNA_CBUF_CON0", DATA_REUSE=1)
            tasks.append(w)
        base_iova = REGCMD + mi * n_nt * stride
        placed = []
        for ni, w in enumerate(tasks):
            iova = base_iova + ni * stride
            if ni + 1 < n_nt:
                w = chain_to(w, iova + stride, len(tasks[ni + 1]))
            placed.append((iova, w))
        jobs.append(placed)
    return (mt, nt), jobs, n_mt * n_nt * stride


def pack(a: np.ndarray, b: np.ndarray, mt: int):
    M, K = a.shape
    feat = a.reshape(M // mt, mt, K // 8, 8).transpose(0, 2, 1, 3)          # [M/Mt][K/8][Mt][8]
    wts = b.reshape(b.shape[0] // 16, 16, K // 32, 32).transpose(0, 2, 1, 3)  # [N/16][K/32][16][32]
    return np.ascontiguousarray(feat).tobytes(), np.ascontiguousarray(wts).tobytes()


def unpack(raw: bytes, M: int, N: int, mt: int, nt: int) -> np.ndarray:
    tiles = np.frombuffer(raw, np.float16).reshape(M // mt, N // nt, nt // 8, mt, 8)
    return tiles.transpose(0, 3, 1, 2, 4).reshape(M, N)


PHASES = (("feature", "feature fetch + fp16->fp32"), ("weights", "weight fetch into fp32 panels"),
          ("columns", "im2col / feature panel packing"), ("mac", "MAC (fp32 GEMM)"),
          ("dpu", "DPU + output write"))


def phase_ns(sim: Simulator) -> dict[str, int]:
    """The simulator's per-phase wall-clock totals (csrc/sim/rj_sim_profile.h)."""
    p = ffi.new("rj_sim_phase_ns *")
    lib.rj_sim_get_phase_ns(sim._sim, p)
    return {k: getattr(p, k) for k in ("conv_tasks",) + tuple(name for name, _ in PHASES)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    M, K, N = args.m, args.k, args.n

    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    (mt, nt), jobs, regcmd_bytes = build(M, K, N)
    feat, wts = pack(a, b, mt)
    mem = {
        "regcmd": (REGCMD, bytearray(regcmd_bytes)),
        "feature": (FEATURE, bytearray(feat)),
        "weight": (WEIGHT, bytearray(wts)),
        "output": (OUTPUT, bytearray(M * N * 2)),
    }
    for job in jobs:
        for iova, w in job:
            off = iova - REGCMD
            mem["regcmd"][1][off:off + 8 * len(w)] = w.tobytes()

    sim = Simulator()
    t_sim, phases = [], []
    task_lists = [[(iova, len(w)) for iova, w in job] for job in jobs]
    for _ in range(args.reps):
        before = phase_ns(sim)
        t0 = time.perf_counter()
        for tasks in task_lists:
            sim.run_job(mem, tasks)
        t_sim.append(time.perf_counter() - t0)
        after = phase_ns(sim)
        phases.append({k: after[k] - before[k] for k in after})

    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    t_np = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        ref = a32 @ b32.T
        t_np.append(time.perf_counter() - t0)

    got = unpack(bytes(mem["output"][1]), M, N, mt, nt).astype(np.float32)
    err = np.abs(got - ref)
    tol = 2e-3 * np.abs(ref) + 4e-3
    bad = int((err > tol).sum())
    s = sim.stats()
    per_run = {k: v // args.reps for k, v in s.items()}
    print(f"fp16 matmul M={M} K={K} N={N}: tiles Mt={mt} Nt={nt}, {per_run['tasks']} tasks in "
          f"{per_run['kicks']} kicks / {per_run['jobs']} jobs per run, {per_run['macs'] / 1e9:.2f} GMAC")
    print(f"simulator        best of {args.reps}: {min(t_sim) * 1e3:8.1f} ms")
    print(f"numpy float32    best of {args.reps}: {min(t_np) * 1e3:8.1f} ms")
    print(f"ratio sim/numpy: {min(t_sim) / min(t_np):.2f}x")
    best = phases[t_sim.index(min(t_sim))]
    timed = sum(best[name] for name, _ in PHASES)
    print(f"simulator phases of the best run ({best['conv_tasks']} conv tasks):")
    for name, label in PHASES:
        print(f"  {label:<32} {best[name] / 1e6:8.1f} ms")
    print(f"  {'outside the conv phases':<32} {(min(t_sim) * 1e9 - timed) / 1e6:8.1f} ms")
    print(f"check vs numpy: max |err| = {err.max():.4g}, {bad} of {err.size} outside fp16 tolerance")
    if bad:
        raise SystemExit("simulator result disagrees with numpy")


if __name__ == "__main__":
    main()
