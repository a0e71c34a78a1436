"""Compile cost against the size of the data (issue 10): a function with one large float32
intermediate, compiled for the null backend (no device work) from jax.ShapeDtypeStruct and by
a first call, with the peak Python/numpy memory (tracemalloc) and the wall time of each.

A compile that grows with the program, not the data, keeps the peak near the program's own
buffers; the first-call calibration this replaced ran the whole graph in float64 on the host
(peak several times the intermediate).

    python bench/compile_memory.py [--rows 2048] [--cols 2048]
"""
from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import rockjit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    args = ap.parse_args()
    r, c = args.rows, args.cols

    def fn(x, b):
        return jnp.tanh(jnp.broadcast_to(x, (r, c)) + b[:, None]).sum(-1)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c)).astype(np.float32)
    b = rng.standard_normal((r,)).astype(np.float32)
    print(f"intermediate  f32[{r}, {c}] = {r * c * 4 / 2**20:.1f} MiB")
    # warm-up at a small size: imports, jax's tracing caches and the LUT table caches are not
    # what is measured
    rockjit.compile(lambda x: jnp.tanh(x).sum(-1), backend="null")(np.ones((8, 64), np.float32))
    for how in ("ShapeDtypeStruct", "first call"):
        f = rockjit.compile(fn, backend="null")
        tracemalloc.start()
        t0 = time.perf_counter()
        if how == "first call":
            f(x, b)
        else:
            f.lower(jax.ShapeDtypeStruct(x.shape, x.dtype),
                    jax.ShapeDtypeStruct(b.shape, b.dtype)).compile()
        dt = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"{how:<17} compile {dt:6.2f} s   peak traced memory {peak / 2**20:7.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
