"""End-to-end: rockjit.compile(..., backend="sim") -> pipeline -> LoadedGraph on the strict
simulator, compared with an independent float64 numpy reference.

Bound for a graph of one matmul (tolerance.py): the reference is computed in float64 from the
fp16-rounded inputs and weights, so only the NPU's own roundings remain: fp32 accumulation
and one fp16 rounding of the result, i.e. tolerance.matmul_bound(a16, b16) (2u|A||B| + u|C|).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.oracle import tolerance as T
from rockjit.lowering.memory import BufReq, check_plan, plan_arena


def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _mm(w, x):
    return x @ w


def test_matmul_graph_matches_numpy_and_stats() -> None:
    rng = np.random.default_rng(1)
    m, k, n = 12, 64, 48
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    f = rockjit.compile(_mm, resident_argnums=0, backend="sim")
    y = f(w, x)
    a16, b16 = _f16(x), _f16(w).T
    T.check(y, a16 @ b16.T, T.matmul_bound(a16, b16), "x @ w")
    st = f.stats()
    assert st["macs"] == m * k * n
    # the boundary: x packed once (fp16 rows, M*K*2 bytes), y unpacked once (M*N*2)
    assert st["host_bytes_packed"] == m * k * 2
    assert st["host_bytes_unpacked"] == m * n * 2
    assert st["host_steps"] == 2 and st["retiles"] == 0
    assert st["npu_steps"] == 1 and st["jobs"] >= 1 and st["tasks"] >= 1
    assert st["rt_host_steps"] == 2 and st["rt_runs"] == 1


def _chain(ws, x):
    for w in ws:
        x = x @ w
    return x


def test_chained_matmuls_stay_on_the_cube() -> None:
    # fp16 output cube of one matmul = input cube of the next: no host trip between them
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal((64, 64)).astype(np.float32) / 8 for _ in range(4)]
    x = rng.standard_normal((16, 64)).astype(np.float32)
    f = rockjit.compile(_chain, resident_argnums=0, backend="sim")
    y = f(ws, x)
    st = f.stats()
    # four NPU ops with no host step between: one NPU step (lowering/coalesce.py)
    assert st["retiles"] == 0 and st["host_steps"] == 2 and st["npu_ops"] == 4
    assert st["npu_steps"] == 1
    assert st["macs"] == 4 * 16 * 64 * 64
    # liveness reuse: the intermediates share bytes
    assert st["arena_bytes"] < st["arena_bytes_without_reuse"]
    ref = _f16(x)
    bound = np.zeros_like(ref)
    for w in ws:   # per-layer bound propagated through |W| (first-order)
        w16 = _f16(w)
        nxt = ref @ w16
        bound = bound @ np.abs(w16) + T.matmul_bound(ref, w16.T)
        ref = _f16(nxt)
    T.check(y, ref, bound + 4 * T.U16 * np.abs(ref), "4 chained matmuls")


def _split_heads(w, x):
    h = x @ w                        # [16, 128]
    a, b = h[:, :64], h[:, 64:]       # channel split at a multiple of the atom: a view
    return a @ w[:64, :32], b @ w[64:, 32:64]


def test_channel_split_costs_no_copy() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((128, 128)).astype(np.float32) / 10
    x = rng.standard_normal((16, 128)).astype(np.float32)
    f = rockjit.compile(_split_heads, resident_argnums=0, backend="sim")
    ya, yb = f(w, x)
    st = f.stats()
    assert st["retiles"] == 0, "a channel slice at a group boundary must not be copied"
    assert st["host_steps"] == 3          # one pack in, two unpacks out
    h = _f16(_f16(x) @ _f16(w))
    ra, rb = h[:, :64] @ _f16(w[:64, :32]), h[:, 64:] @ _f16(w[64:, 32:64])
    for got, ref, a, b in ((ya, ra, h[:, :64], _f16(w[:64, :32])), (yb, rb, h[:, 64:], _f16(w[64:, 32:64]))):
        # h itself carries one fp16 rounding (u|h|) through |b|, plus this matmul's own bound
        bound = T.matmul_bound(a, b.T) + 4 * T.U16 * (np.abs(a) @ np.abs(b))
        T.check(got, ref, bound, "split-head matmul")


def _scores(x, y):
    return jnp.einsum("hqd,hkd->hqk", x, y)


def test_batched_activation_matmul_runs_heads_as_parallel_jobs() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 16, 64)).astype(np.float32)
    k = rng.standard_normal((3, 16, 64)).astype(np.float32)
    f = rockjit.compile(_scores, backend="sim")
    s = f(q, k)
    st = f.stats()
    assert st["jobs"] >= 3 and st["npu_steps"] == 1   # one job per head, one step
    assert st["retiles"] == 1                          # K into the weight layout (host)
    assert st["macs"] == 3 * 16 * 64 * 16
    q16, k16 = _f16(q), _f16(k)
    T.check(s, np.einsum("hqd,hkd->hqk", q16, k16), T.matmul_bound(q16, k16), "scores")


def _int_dot(a, b):
    return jnp.dot(a, b)


def test_no_npu_and_no_host_form_raises_unsupported_with_location() -> None:
    a = np.ones((4, 8), np.int32)
    f = rockjit.compile(_int_dot, backend="sim")
    with pytest.raises(rockjit.UnsupportedError) as e:
        f(a, a.T.copy())
    msg = str(e.value)
    assert "dot_general" in msg and "test_pipeline.py:" in msg


def test_interval_allocator_reuses_dead_bytes() -> None:
    # a chain a -> b -> c -> d: only neighbours are live together
    reqs = [BufReq(i, 1000, 64, i, i + 1) for i in range(4)]
    plan = plan_arena(reqs, base_align=64)
    check_plan(reqs, plan)
    assert plan.size <= 2 * 1024 < plan.naive_size
    # overlapping lifetimes never share bytes
    reqs = [BufReq(i, 500 + i, 64, 0, 5) for i in range(3)]
    plan = plan_arena(reqs, base_align=64)
    check_plan(reqs, plan)
    assert plan.size >= sum(r.size for r in reqs)
