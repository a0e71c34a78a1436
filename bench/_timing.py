"""Timing helpers for the XLA comparisons: medians of repeated wall times, XLA compile and
forward of the same JAX function rockjit compiles."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


def median_s(fn: Callable[[], Any], reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def xla_compile_s(fn, params, inputs) -> tuple[float, Any]:
    """Wall time of ``jax.jit(fn).lower(...).compile()`` (a fresh jit, so nothing is cached)."""
    args = (params, *(jnp.asarray(x) for x in inputs))
    t0 = time.perf_counter()
    exe = jax.jit(fn).lower(*args).compile()
    return time.perf_counter() - t0, exe


def xla_forward_s(exe, params, inputs, reps: int) -> float:
    """Median warm forward of the compiled XLA executable on the CPU (fp32)."""
    args = (jax.device_put(params), *(jnp.asarray(x) for x in inputs))
    jax.block_until_ready(exe(*args))
    return median_s(lambda: jax.block_until_ready(exe(*args)), reps)
