#!/usr/bin/env python3
"""LUT fidelity on the simulator: rockjit's own activation programs and the foreign shifted-table
cases of tests/sim/conformance_extra, each against a float64 numpy reference; prints max |error|
and the simulator wall time per program. Run it against any checkout's build (PYTHONPATH picks
the ``rockjit`` package) to compare simulator versions:

    PYTHONPATH=. python bench/lut_fidelity.py
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from rockjit._rjc import ffi, lib
from rockjit.ir.types import DType
from rockjit.lowering.emitters.lut import activation_table, build_activation
from rockjit.lowering.layouts import feature_layout
from rockjit.lowering.oprun import run_op_lowering
from rockjit.lowering.profile import get_profile

EXTRA = Path(__file__).resolve().parents[1] / "tests" / "sim" / "conformance_extra"
_erf = np.vectorize(math.erf)
REFS = {
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "exp": np.exp,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), "silu": lambda x: x / (1 + np.exp(-x)),
    "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x,
}
RANGES = {"sigmoid": (-8, 8), "tanh": (-6, 6), "exp": (-16, 0), "gelu": (-12, 12), "silu": (-16, 16),
          "rsqrt": (0.5, 64), "reciprocal": (0.25, 32)}


def rockjit_activation(kind: str, n_rows: int = 64) -> tuple[float, float]:
    p = get_profile("rk3588")
    lo, hi = RANGES[kind]
    lay = feature_layout(p, DType.F16, 1, n_rows, 256)
    x = np.linspace(lo, hi, n_rows * 256).astype(np.float16).reshape(1, n_rows, 256)
    prog = build_activation(kind, lay, (lo, hi), p)
    raw = np.zeros(prog.buffer("x").nbytes, np.uint8)
    raw[:lay.nbytes] = lay.pack(x)
    t0 = time.perf_counter()
    got = lay.unpack(run_op_lowering(prog, {"x": raw}, sentinel=0xAA)["out"]).astype(np.float64)
    dt = time.perf_counter() - t0
    t = activation_table(kind, (lo, hi))
    xx = x.astype(np.float64)
    xc = np.clip(xx, t.lo, t.hi)
    if kind in ("gelu", "silu"):   # x * gate(clamp(x)), the emitter's documented clamp
        ref = xx * (0.5 * (1 + _erf(xc / math.sqrt(2))) if kind == "gelu" else 1 / (1 + np.exp(-xc)))
    else:
        ref = REFS[kind](xc)
    return float(np.max(np.abs(got - ref))), dt


def extra_case(path: Path, faithful: bool) -> tuple[float, float]:
    meta = json.loads((path / "program" / "buffers.json").read_text())
    mem = {}
    for b in meta["buffers"]:
        data = bytearray(b["size"])
        if b["file"]:
            data[:] = (path / "program" / b["file"]).read_bytes()
        mem[b["name"]] = (b["iova"], data)
    err = ffi.new("rj_err *")
    out = ffi.new("rj_sim **")
    flags = lib.RJ_SIM_STRICT | (getattr(lib, "RJ_SIM_FAITHFUL", 0) if faithful else 0)
    assert lib.rj_sim_create(out, flags, err) == 0
    sim = ffi.gc(out[0], lib.rj_sim_destroy)
    t = meta["jobs"][0]["tasks"][0]
    words = (path / "program" / t["file"]).read_bytes()
    base, data = mem["regcmd"]
    data[t["regcmd_iova"] - base:t["regcmd_iova"] - base + len(words)] = words
    keep, regions = [], ffi.new("rj_region[]", len(mem))
    for i, (iova, d) in enumerate(mem.values()):
        buf = ffi.from_buffer(d)
        keep.append(buf)
        regions[i].iova, regions[i].size, regions[i].host = iova, len(d), ffi.cast("uint8_t *", buf)
    task = ffi.new("rj_task[]", 1)
    task[0].regcmd_iova, task[0].regcmd_count, task[0].reserved = t["regcmd_iova"], len(words) // 8, 0
    t0 = time.perf_counter()
    rc = lib.rj_sim_run_job(sim, regions, len(mem), task, 1, err)
    dt = time.perf_counter() - t0
    if rc:
        return float("nan"), dt
    e = meta["expected_output"]
    got = np.frombuffer(bytes(mem[e["buffer"]][1][:e["size"]]), e["dtype"]).astype(np.float64)
    want = np.frombuffer((path / "expected_output.bin").read_bytes(), e["dtype"]).astype(np.float64)
    return float(np.max(np.abs(got - want))), dt


def main() -> int:
    print(f"rockjit from {sys.modules['rockjit'].__file__}")
    print("rockjit activation        max|err|   sim s")
    for kind in RANGES:
        err, dt = rockjit_activation(kind)
        print(f"  {kind:22s} {err:10.3g} {dt:7.3f}")
    print("conformance_extra case    max|err|   sim s   (nan = refused)")
    for d in sorted(EXTRA.iterdir()):
        if not d.name.startswith(("10_", "11_")):
            continue
        err, dt = extra_case(d, faithful=False)
        print(f"  {d.name:28s} {err:10.3g} {dt:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
