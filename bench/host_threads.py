"""Wall time of single large host steps on 1..N threads (csrc/runtime/rj_host_pool.h), and of
whole forwards' host cost on the null backend: what splitting host steps buys on this machine.

    python bench/host_threads.py [--threads 1 2 3] [--reps 30] [--model siglip-224 ...]

Each host step runs through the C library (rj_host_op_run_threads) on buffers of a few MB;
the figures are min and median over the repetitions. On a machine whose cores are busy with
other work the extra threads wait for a core and the median rises: read the load average
printed first. The board's figure is the modelled one (bench/modelled_time.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rockjit.ir.types import DType  # noqa: E402
from rockjit.lowering.host_rules import HostView, encode_descriptor  # noqa: E402
from rockjit.runtime._ffi import check, ffi, lib  # noqa: E402
from rockjit.runtime.host_abi import BINARY, UNARY  # noqa: E402

F16, F32 = DType.F16, DType.F32


def _case(kind, shape, out, views, arrays, code=0):
    desc = encode_descriptor(kind, shape, views, code)
    d = ffi.new("rj_host_op *")
    ffi.memmove(d, desc.tobytes(), desc.nbytes)
    bufs = ffi.new("rj_host_buf[]", len(arrays) + 1)
    for i, a in enumerate([out, *arrays]):
        bufs[i].data = ffi.from_buffer(a)
        bufs[i].size = a.nbytes
    return d, bufs, len(arrays) + 1, [out, *arrays]


def cases(rng: np.random.Generator):
    x = rng.integers(0, 60000, (2048, 1024)).astype(np.uint16)
    yield "transpose f16 2048x1024", _case(
        "copy", (1024, 2048), np.zeros((1024, 2048), np.uint16),
        [HostView("o", F16, 0, [2048, 1]), HostView("x", F16, 0, [1, 1024])], [x])
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    dense = [1024, 1]
    yield "add f32 1024x1024", _case(
        "binary", a.shape, np.zeros_like(a), [HostView("o", F32, 0, dense),
                                              HostView("a", F32, 0, dense),
                                              HostView("b", F32, 0, dense)], [a, b], BINARY["add"])
    yield "exp f32 1024x1024", _case(
        "unary", a.shape, np.zeros_like(a), [HostView("o", F32, 0, dense),
                                             HostView("a", F32, 0, dense)], [a], UNARY["exp"])
    yield "convert f32->f16 1024x1024", _case(
        "copy", a.shape, np.zeros(a.shape, np.float16), [HostView("o", F16, 0, dense),
                                                        HostView("a", F32, 0, dense)], [a])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--model", nargs="*", default=[])
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; wall ms, min / median")
    err, used = ffi.new("rj_err *"), ffi.new("uint32_t *")
    for name, (d, bufs, n, _keep) in cases(np.random.default_rng(0)):
        row = []
        for t in args.threads:
            ts = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                check(lib.rj_host_op_run_threads(d, bufs, n, t, ffi.NULL, used, err), err)
                ts.append(time.perf_counter() - t0)
            row.append(f"{t}T {min(ts) * 1e3:7.2f} / {np.median(ts) * 1e3:7.2f}")
        print(f"  {name:28s}" + "  ".join(row))
    if args.model:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _encoders import ENCODERS, setup
        from _timing import median_s

        import rockjit
        from rockjit.runtime import set_host_threads

        for m in args.model:
            fn, params, inputs = setup(ENCODERS[m], 1)
            f = rockjit.compile(fn, resident_argnums=0, backend="null")
            f(params, *inputs)
            row = []
            for t in args.threads:
                set_host_threads(t)
                row.append(f"{t}T {median_s(lambda: f(params, *inputs), args.reps) * 1e3:7.2f}")
            set_host_threads(None)
            print(f"  {m + ' host cost, 1 layer (median)':46s}" + "  ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
