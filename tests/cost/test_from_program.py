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
