"""Multicore programs and Program.stats().

* The jobs of one NPU step are independent, so the program deals them over the device's
  contexts (cores; rocket: one fd each). A BO belongs to one context (each fd has its own IOVA
  space, notes: perf/iova-and-multicore.md), so every used context gets its own arena, weights
  and regcmd BOs, and host copy steps move exactly the bytes a job's DMA reads in and writes
  out. Checked on SimDevice(cores=3) and RocketDevice(fake=True, cores=3): the results equal
  the single-context program's bit for bit, jobs land on all three contexts, and every BO a
  context's jobs use is in that context.
* stats() counts are compared with expectations computed here from the op's definition and
  the layout facts (16-byte atoms, fp16 elements), not read back from the compiler.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.oracle import tolerance as T
from rockjit.lowering.pipeline import lower_graph
from rockjit.lowering.loaded_graph import LoadedGraph
from rockjit.runtime import RocketDevice, SimDevice

ATOM = 16          # bytes per cube atom (notes: encodings/tile-layouts.md)


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _program(fn, params, x, device):
    c = rockjit.compile(fn, resident_argnums=0).compiled(params, x)
    lowered = lower_graph(c.graph, c.params)
    return LoadedGraph(lowered, device), c


def _wide(w, x):
    return jnp.tanh(x @ w)          # N tiles (the weights do not fit one CBUF) + a LUT


def _heads(p, x):
    q = (x @ p["wq"]).reshape(48, 6, 32).transpose(1, 0, 2)
    k = (x @ p["wk"]).reshape(48, 6, 32).transpose(1, 0, 2)
    s = jnp.einsum("hqd,hkd->hqk", q, k)
    return jax.nn.softmax(s, axis=-1)


def _devices(kind: str):
    if kind == "sim":
        return SimDevice(cores=1), SimDevice(cores=3)
    return RocketDevice(fake=True, cores=1), RocketDevice(fake=True, cores=3)


@pytest.mark.parametrize("kind", ["sim", "rocket_fake"])
@pytest.mark.parametrize("case", ["n_tiles", "heads"])
def test_jobs_spread_over_three_contexts(kind, case, request) -> None:
    if kind == "rocket_fake":
        request.getfixturevalue("fake")
    rng = np.random.default_rng(7)
    if case == "n_tiles":
        params = (rng.standard_normal((1024, 1536)) / 32).astype(np.float32)
        x = rng.standard_normal((40, 1024)).astype(np.float32)
        fn = _wide
    else:
        params = {n: (rng.standard_normal((192, 192)) / 14).astype(np.float32)
                  for n in ("wq", "wk")}
        x = rng.standard_normal((48, 192)).astype(np.float32)
        fn = _heads
    one, three = _devices(kind)
    try:
        p1, c = _program(fn, params, x, one)
        p3, _ = _program(fn, params, x, three)
        y1, = p1.run([x])
        y3, = p3.run([x])
        # the same tasks on other contexts: bit-identical results
        assert np.array_equal(y1, y3)
        ref = np.asarray(fn(params, x), np.float64)
        T.check(y3, ref, T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref),
                f"{case} on 3 contexts")
        s1, s3 = p1.stats(), p3.stats()
        assert s1["cores_used"] == 1 and s1["host_copy_steps"] == 0
        assert s3["cores_used"] == 3
        assert all(s3[f"jobs_core{k}"] > 0 for k in range(3))
        # the same tasks; on one context more of a step's jobs share a core, where
        # job_merge.py links them into one
        assert s3["tasks"] == s1["tasks"] and s3["jobs"] >= s1["jobs"]
        # cross-context moves are counted host steps, and only they differ from one core
        # (before fusion: the steps that fuse depend on the context each one writes)
        assert s3["host_copy_steps"] > 0 and s3["host_bytes_copied"] > 0

        def unfused(s):
            return s["host_steps"] - s["host_fused_steps"] + s["host_fused_ops"]
        assert unfused(s3) - s3["host_copy_steps"] == unfused(s1)
        # each context's arena / weights / regcmd BOs live in that context
        for core, bos in p3.context_bos.items():
            assert {p3.program.bo_info(bo).ctx for bo in bos} == {core}
        # device bytes are per task DMA, independent of where the task runs
        assert s3["device_bytes_read"] == s1["device_bytes_read"]
        assert s3["device_bytes_written"] == s1["device_bytes_written"]
    finally:
        for d in (one, three):
            d.close()


def test_three_fds_run_jobs_at_the_same_time(fake) -> None:
    """On the rocket fake each fd has its own worker: with a per-job delay, jobs of one step on
    three fds overlap in time."""
    rng = np.random.default_rng(8)
    params = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
    x = rng.standard_normal((40, 1024)).astype(np.float32)
    dev = RocketDevice(fake=True, cores=3)
    try:
        prog, _ = _program(_wide, params, x, dev)
        fake.set_faults(job_delay_us=20000)
        prog.run([x])
        assert fake.stats()["max_running"] >= 2
    finally:
        fake.set_faults()
        dev.close()


def _run_matmul(w: np.ndarray, x: np.ndarray, cores: int):
    """x @ w run once on a simulator of ``cores`` cores: (y, the program's stats, compiled)."""
    dev = SimDevice(cores=cores)
    try:
        prog, c = _program(lambda w, x: x @ w, w, x, dev)
        y, = prog.run([x])
        return y, prog.stats(), c
    finally:
        dev.close()


def test_stats_of_one_matmul_match_an_independent_count() -> None:
    m, k, n = 12, 64, 48
    rng = np.random.default_rng(9)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y, st, _ = _run_matmul(w, x, cores=3)
    m_pad, k_pad = _round(max(m, 4), 4), _round(k, 32)
    n_pad = _round(n, 32)                 # N padded to the K atom (the next op's K)
    # one task: A read (K/8 fp16 surfaces of M rows), the weights (N_pad x K_pad fp16), the
    # output written (N_pad/8 surfaces of M rows)
    assert st["device_bytes_read"] == (k_pad // 8) * m_pad * ATOM + n_pad * k_pad * 2
    assert st["device_bytes_written"] == (n_pad // 8) * m_pad * ATOM
    assert st["macs"] == m * k * n
    assert (st["jobs"], st["tasks"], st["kicks"]) == (1, 1, 1)
    # the boundary: x packed (M*K fp16), y unpacked (M*N fp16); nothing else on the host
    assert st["host_steps"] == 2 and st["host_copy_steps"] == 0
    assert st["host_bytes_packed"] == m * k * 2 and st["host_bytes_unpacked"] == m * n * 2
    assert st["rt_runs"] == 1 and st["rt_jobs"] == 1 and st["rt_host_steps"] == 2
    ref = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64)
    T.check(y, ref, T.matmul_bound(x.astype(np.float16), w.T.astype(np.float16)), "x @ w")


def test_k_split_counts_every_task_and_its_partial(monkeypatch) -> None:
    """A matmul whose K needs several CBUF passes: every K step is a task of one chained kick
    per job, and each step after the first also reads the previous partial. (Its jobs are
    counted as the emitter made them: job_merge.py would link the N tiles on one core.)"""
    monkeypatch.setenv("ROCKJIT_NO_JOB_MERGE", "1")
    m, k, n = 16, 8192, 32
    rng = np.random.default_rng(10)
    w = (rng.standard_normal((k, n)) / 90).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y, st, c = _run_matmul(w, x, cores=1)
    assert st["tasks"] > st["kicks"] == st["jobs"]
    steps = st["tasks"] // st["jobs"]
    # each job (one N tile; the planner may split N to spread over cores) reads the feature once
    # over its K steps, the weights are read once in total; every step but the last writes an
    # fp32 partial (twice the fp16 output's bytes), each step after the first reads the
    # previous one, the last writes the fp16 output
    m_pad = max(_round(m, 4), 12) if steps > 1 else _round(m, 4)
    out = (n // 8) * m_pad * ATOM
    a = (k // 8) * m_pad * ATOM
    assert st["device_bytes_read"] == a * st["jobs"] + n * k * 2 + (steps - 1) * 2 * out
    assert st["device_bytes_written"] == (steps - 1) * 2 * out + out
    ref = np.asarray(x.astype(np.float16), np.float64) @ np.asarray(w.astype(np.float16), np.float64)
    T.check(y, ref, T.graph_bound(c.graph, c.params, [x])[0], "K = 8192")
