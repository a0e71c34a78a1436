"""Forward time against XLA's fp32 forward on the CPU, measured in the same run:
the ``sim`` backend (the C functional simulator runs every NPU job, the C runtime every host
step) and the ``null`` backend (host cost only: the runtime runs the host steps and counts the
NPU jobs without computing them).

    python bench/forward_vs_xla.py [--model siglip-224] [--layers N] [--backend sim null]
                                   [--reps 3]

Warm medians, and beside them the ratio of the two sides' fastest forwards (on a shared
machine memory-bound host work swings with its neighbours' load; the minimum of each side is
its least disturbed figure): the first call (lowering, calibration) is excluded. Default
depth: the encoder's own (a whole forward, which is what the host-cost target is per); a
shallower ``--layers`` weighs the embedding and head, which run once, as much as one layer.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from _encoders import ENCODERS, setup
from _timing import times_s, xla_compile_s, xla_forward_times

import rockjit


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="siglip-224", choices=sorted(ENCODERS))
    ap.add_argument("--layers", type=int, default=None,
                    help="encoder layers (default: the encoder's full depth)")
    ap.add_argument("--backend", nargs="+", default=["sim", "null"], choices=["sim", "null"])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    enc = ENCODERS[args.model]
    if args.layers is None:
        args.layers = enc.layers
    fn, params, inputs = setup(enc, args.layers)
    _, exe = xla_compile_s(fn, params, inputs)
    xla_ts = xla_forward_times(exe, params, inputs, max(args.reps, 5))
    t_xla, min_xla = statistics.median(xla_ts), min(xla_ts)
    from rockjit.runtime import host_threads

    print(f"{enc.name}, {args.layers} layer(s); host steps on up to {host_threads()} thread(s) "
          f"(RJ_HOST_THREADS)")
    print(f"  XLA fp32 forward (CPU, jit, warm median)  {t_xla * 1e3:10.2f} ms")
    for be in args.backend:
        f = rockjit.compile(fn, resident_argnums=0, backend=be)
        t0 = time.perf_counter()
        f(params, *inputs)
        t_first = time.perf_counter() - t0
        ts = times_s(lambda: f(params, *inputs), args.reps)
        t = statistics.median(ts)
        what = "simulator forward" if be == "sim" else "host cost (null backend)"
        print(f"  rockjit {what:28s} {t * 1e3:10.2f} ms  = {t / t_xla:8.3f} x XLA   "
              f"(first call {t_first:.1f} s; fastest {min(ts) * 1e3:.2f} ms vs XLA's "
              f"{min_xla * 1e3:.2f} ms = {min(ts) / min_xla:.3f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
