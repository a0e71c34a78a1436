"""Compile time: rockjit (trace + import + lowering + program build) against XLA
(``jax.jit(f).lower(...).compile()``) on the same JAX function, measured in the same run.

    python bench/compile_vs_xla.py [--model siglip-224] [--layers 1]

rockjit's compile is trace + ``Lowered.compile()`` (which lowers and builds the program image
when every resident value is bound) + the first ``null`` call minus a warm ``null`` run (loading
the image: its uploads); each part is printed apart.
Default depth is 1 layer (--layers N for more; the full depth takes minutes here).
"""
from __future__ import annotations

import argparse
import sys
import time

from _encoders import ENCODERS, setup
from _timing import median_s, xla_compile_s

import rockjit


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="siglip-224", choices=sorted(ENCODERS))
    ap.add_argument("--layers", type=int, default=1)
    args = ap.parse_args()
    enc = ENCODERS[args.model]
    fn, params, inputs = setup(enc, args.layers)
    f = rockjit.compile(fn, resident_argnums=0, backend="null")
    t0 = time.perf_counter()
    lowered = f.lower(params, *inputs)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled(params, *inputs)
    t_first = time.perf_counter() - t0
    t_run = median_s(lambda: compiled(params, *inputs), 3)
    t_rj = t_trace + t_build + t_first - t_run
    t_xla, _ = xla_compile_s(fn, params, inputs)
    print(f"{enc.name}, {args.layers} layer(s)")
    print(f"  rockjit trace + import        {t_trace:8.2f} s")
    print(f"  rockjit lowering + image      {t_build:8.2f} s  (Lowered.compile())")
    print(f"  rockjit load                  {t_first - t_run:8.2f} s  (first null call {t_first:.2f} s "
          f"- warm null run {t_run:.3f} s)")
    print(f"  rockjit compile total         {t_rj:8.2f} s")
    print(f"  XLA jit lower + compile (CPU) {t_xla:8.2f} s")
    print(f"  ratio rockjit / XLA           {t_rj / t_xla:8.1f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
