"""The adapter from a compiled LoadedGraph: the description it builds must count what the
program's own stats count (built independently in rockjit/lowering/loaded_graph.py), and
Program.stats() carries the modelled totals."""
from __future__ import annotations

import io

import jax
import numpy as np
import pytest

import rockjit
from rockjit import cost


@pytest.fixture(scope="module")
def compiled():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((128, 512)).astype(np.float32) * 0.05,
              "w2": rng.standard_normal((512, 128)).astype(np.float32) * 0.05}

    @rockjit.compile(resident_argnums=0, backend="null")
    def mlp(p, x):
        return jax.nn.relu(x @ p["w1"]) @ p["w2"]

    x = rng.standard_normal((64, 128)).astype(np.float32)
    mlp(params, x)
    return mlp.compiled(params, x)


def test_description_counts_what_the_program_counts(compiled):
    prog = cost.program_of(compiled)
    s = prog.stats()
    d = cost.describe(prog).counts()
    assert d["npu_steps"] == s["npu_steps"]
    # one SUBMIT per core a step uses
    assert s["npu_steps"] <= d["submits"] <= s["npu_steps"] * s["cores_used"]
    assert d["jobs"] == s["jobs"]
    assert d["kicks"] == s["kicks"]
    assert d["tasks"] == s["tasks"]
    assert d["host_steps"] == s["host_steps"]
    assert d["host_bytes"] == (s["host_bytes_packed"] + s["host_bytes_unpacked"]
                               + s["host_bytes_copied"])
    dev = s["device_bytes_read"] + s["device_bytes_written"]
    assert abs(d["dma_bytes"] - dev) <= 2 * d["tasks"]           # per-task integer shares
    assert abs(d["macs_fp16"] - s["device_macs"]) <= d["tasks"]
    assert s["device_macs"] > 0 and dev > 0


def test_stats_carry_the_modelled_totals(compiled):
    s = compiled.stats()
    est = cost.estimate(cost.describe(cost.program_of(compiled)), 600)
    assert s["modelled_ms"] == pytest.approx(est.ms)
    parts = [s[f"modelled_{b}_ms"] for b in ("dispatch", "dma", "mac", "host")]
    assert sum(parts) == pytest.approx(s["modelled_ms"])
    # every submit costs at least the per-submit constant
    assert s["modelled_dispatch_ms"] >= s["npu_steps"] * cost.calibrated().submit_us * 1e-3
    assert "jobs" in s and "host_steps" in s      # the existing keys stay


def test_report_prints_modelled_steps(compiled):
    buf = io.StringIO()
    est = cost.report(compiled, file=buf)
    text = buf.getvalue()
    assert "modelled" in text.splitlines()[0]
    assert len(text.splitlines()) == len(est.steps) + 3


def test_report_refuses_a_backend_without_program():
    f = rockjit.compile(lambda x: x + 1, backend="interpreter")
    f(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="compile with an NPU backend"):
        cost.report(f.compiled(np.ones(4, np.float32)))


def test_host_steps_charged_at_the_threads_the_runtime_runs_them_on():
    """A column sum of 4096 x 64 floats runs on the host (the NPU reduces only the last axis):
    large enough to split. The description charges it at the runtime's default 3 threads on
    the board and at 1 with host_threads=1; the runtime, run with the same count, reports the
    same thread total as the description (rt_host_threads counts what it did)."""
    from rockjit.runtime import set_host_threads
    from rockjit.runtime.host_threads import DEFAULT_HOST_THREADS, SPLIT_MIN_BYTES

    f = rockjit.compile(lambda x: np.float32(0.5) * x.sum(axis=0), backend="null")
    x = np.ones((4096, 64), np.float32)
    f(x)
    prog = cost.program_of(f.compiled(x))
    d3, d1 = cost.describe(prog), cost.describe(prog, host_threads=1)
    host3 = [s for s in d3.steps if isinstance(s, cost.CostHostStep)]
    host1 = [s for s in d1.steps if isinstance(s, cost.CostHostStep)]
    assert DEFAULT_HOST_THREADS == 3 and [s.nbytes for s in host3] == [s.nbytes for s in host1]
    split = [s for s in host3 if s.threads > 1]
    assert split and all(s.threads == 3 and s.nbytes >= SPLIT_MIN_BYTES // 2 for s in split)
    assert all(s.threads == 1 for s in host1)
    c = cost.calibrated()
    e3, e1 = cost.estimate(d3), cost.estimate(d1)
    for s3, st3, st1 in zip(d3.steps, e3.steps, e1.steps):
        if isinstance(s3, cost.CostHostStep):
            bw = c.host_gather_gbps if s3.kind == "gather" else c.host_copy_gbps
            assert st3.ms == pytest.approx(s3.nbytes / (bw * 1e9 * s3.threads) * 1e3)
            assert st1.ms == pytest.approx(st3.ms * s3.threads)
    for threads, d in ((3, d3), (1, d1)):
        set_host_threads(threads)
        try:
            before = prog.stats()
            f(x)
            after = prog.stats()
        finally:
            set_host_threads(None)
        assert after["rt_host_steps"] - before["rt_host_steps"] == len(host3)
        assert after["rt_host_threads"] - before["rt_host_threads"] == \
            sum(s.threads for s in d.steps if isinstance(s, cost.CostHostStep))
