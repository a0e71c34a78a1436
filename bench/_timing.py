"""Timing helpers for the XLA comparisons: medians of repeated wall times, XLA compile and
forward of the same JAX function rockjit compiles."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


def times_s(fn: Callable[[], Any], reps: int) -> list[float]:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def median_s(fn: Callable[[], Any], reps: int) -> float:
    return statistics.median(times_s(fn, reps))


def xla_compile_s(fn, params, inputs) -> tuple[float, Any]:
    """Wall time of ``jax.jit(fn).lower(...).compile()`` (a fresh jit, so nothing is cached).

    JAX's caches are cleared first: its trace of ``fn`` is cached by function, so after
    rockjit traced the same ``fn`` XLA's lower reused that trace (SigLIP x12: 0.04-0.06 s
    against 0.16 s traced afresh) and did not pay the tracing rockjit's figure includes."""
    args = (params, *(jnp.asarray(x) for x in inputs))
    jax.clear_caches()
    t0 = time.perf_counter()
    exe = jax.jit(fn).lower(*args).compile()
    return time.perf_counter() - t0, exe


def xla_forward_times(exe, params, inputs, reps: int) -> list[float]:
    """Every warm forward's wall time of the compiled XLA executable on the CPU (fp32)."""
    args = (jax.device_put(params), *(jnp.asarray(x) for x in inputs))
    jax.block_until_ready(exe(*args))
    return times_s(lambda: jax.block_until_ready(exe(*args)), reps)
