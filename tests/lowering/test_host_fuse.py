"""Fused host steps in compiled programs (rockjit/lowering/host_fuse.py): a LayerNorm between
two matmuls, on the strict simulator against JAX on CPU (graphs_testutil: the fp16 bound, which
a row swap fails). The norm's per-row statistics run as fused steps, the pack of a row vector
among them (so it is no re-tile; where only the pack read the f32 rows, the op before it writes
the NPU's form itself), and the result is the same bits as with every host op a step of its
own (ROCKJIT_NO_HOST_FUSE)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from graphs_testutil import check_bound, run_sim


def _norm_between_matmuls(w, x):
    h = x @ w["a"]
    mu = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mu), axis=-1, keepdims=True)
    y = (h - mu) * jax.lax.rsqrt(var + 1e-6) * w["g"] + w["b"]
    return y @ w["c"]


def test_norm_statistics_run_fused_with_the_same_bits(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    w = {"a": (rng.standard_normal((64, 96)) / 4).astype(np.float32),
         "g": rng.uniform(0.5, 1.5, 96).astype(np.float32),
         "b": (rng.standard_normal(96) / 10).astype(np.float32),
         "c": (rng.standard_normal((96, 32)) / 8).astype(np.float32)}
    # rows of very different scales: the range plan's per-row prescale has work to do
    x = (rng.standard_normal((24, 64)) * np.geomspace(1e-2, 3e2, 24)[:, None]).astype(np.float32)
    got, ref, bound, st, _ = run_sim(_norm_between_matmuls, w, x)
    check_bound(got, ref, bound, "LayerNorm between matmuls, fused host steps")
    f = rockjit.compile(_norm_between_matmuls, resident_argnums=0, backend="sim")
    img = f.compiled(w, x)._runner.image
    fused = [img.sources[s.source].node for s in img.steps
             if s.kind == "host" and s.host.kind == "fused"]
    assert fused, [s.host.kind for s in img.steps if s.kind == "host"]
    # a pack after the op that computed its value, in one step: the producer writes NPU form
    assert any(any(p.startswith("pack %") and f"{p.split()[1]} = " in n for p in n.split("; "))
               for n in fused), fused
    monkeypatch.setenv("ROCKJIT_NO_HOST_FUSE", "1")
    off = rockjit.compile(_norm_between_matmuls, resident_argnums=0, backend="sim")
    np.testing.assert_array_equal(np.asarray(off(w, x)), got)
    s_off = off.compiled(w, x).stats()
    assert st["host_steps"] < s_off["host_steps"], (st["host_steps"], s_off["host_steps"])
    assert st["retiles"] < s_off["retiles"], (st["retiles"], s_off["retiles"])
    # a pack of rows only it reads is gone: the op before it wrote the NPU's form itself
    ops = st["host_steps"] - st["host_fused_steps"] + st["host_fused_ops"]
    assert ops < s_off["host_steps"], (ops, s_off["host_steps"])
