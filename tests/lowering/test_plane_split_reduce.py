"""A feature reduce split by channel planes (rules/reduce._plane_split_sum, issue 9): each of
the flat split's three plane ranges summed by a ones matmul on the core that made it, the
three fp32 partials added on the host. Checked on the strict simulator against numpy in
float64, with planted outliers (a residual stream's ~600 channels), where the split applies
(H three equal whole K groups) and where it does not (the row tiles then), and for the program
shape it exists for: the sum in its producer's NPU step, with no cross-context copy of the
cube before it."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_sim

PLANE = "reduce.feature_reduce (ones matmul per plane range)"


def _scaled_sum(p, x):
    # a pass that makes the reduce's operand, as a norm's x * 2^-s0 does
    return jnp.sum(x * p["k"], axis=-1)


def _inputs(t: int, h: int, seed: int) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, h)) * 3).astype(np.float32)
    # outliers: a few channels near 600 in every row, and rows whose sum cancels to ~0
    x[:, rng.choice(h, 4, replace=False)] = rng.choice([-600.0, 600.0], (t, 4))
    x[:7] -= x[:7].mean(axis=-1, keepdims=True)
    return {"k": np.float32(0.5) * np.ones((), np.float32)}, x


def _emitters(p, x) -> list[str]:
    from rockjit.cost import program_of

    f = rockjit.compile(_scaled_sum, resident_argnums=0, backend="null")
    f(p, x)
    return [c.call.emitter for c in program_of(f.compiled(p, x)).lowered.calls]


@pytest.mark.parametrize("t,h,split", [(196, 768, True), (197, 1152, True),
                                       (196, 512, False), (50, 96, False)])
def test_plane_split_sum_on_the_sim(t: int, h: int, split: bool) -> None:
    p, x = _inputs(t, h, t + h)
    got, ref, bound, st, _ = run_sim(_scaled_sum, p, x)
    # independent of the bound the IR's interval arithmetic gives: numpy's float64 sum of the
    # fp16 terms, within the fp32 accumulation error of H terms
    terms = (x.astype(np.float16).astype(np.float64) * 0.5)
    exact = terms.sum(axis=-1)
    tol = h * 2.0 ** -23 * np.abs(terms).sum(axis=-1) + 1e-6
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= tol), \
        np.max(np.abs(np.asarray(got, np.float64) - exact) / tol)
    check_bound(got, ref, bound, f"sum of [{t}, {h}]")
    assert (PLANE in _emitters(p, x)) == split


def test_plane_split_sum_joins_its_producers_step() -> None:
    """The scale and the split sum share one NPU step on every core: each part reads only the
    planes its core wrote. The row split (the fallback) needs a second step and copies."""
    from rockjit.cost import program_of

    p, x = _inputs(196, 768, 3)
    f = rockjit.compile(_scaled_sum, resident_argnums=0, backend="null")
    f(p, x)
    prog = program_of(f.compiled(p, x))
    calls = prog.lowered.calls
    steps = [st for st in prog.steps if st.kind == "npu"]
    assert len(steps) == 1, [[calls[j.call].call.emitter for j in st.jobs] for st in steps]
    parts = {j.core for j in steps[0].jobs if calls[j.call].call.emitter == PLANE}
    assert parts == {0, 1, 2}, parts


def _norm_block(p, x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    h = (x - mu) * jnp.reciprocal(jnp.sqrt(var + 1e-6)) * p["g"] + p["b"]
    return x + h @ p["w"]


def test_the_model_agrees_with_the_plane_split(monkeypatch) -> None:
    """The split is the rule where it applies; the cost model must agree on a norm feeding a
    768-wide projection (SigLIP's shape): fewer NPU steps, fewer bytes crossing contexts and
    less modelled time than the row tiles (ROCKJIT_NO_PLANE_SPLIT=1), the same result to
    fp32 rounding (both within the IR's bound against JAX)."""
    from rockjit import cost

    rng = np.random.default_rng(9)
    t, h = 196, 768
    x = (rng.standard_normal((t, h)) * 4 + rng.standard_normal((t, 1)) * 30).astype(np.float32)
    x[:, 5] = 600.0            # a residual stream's outlier channel
    p = {"g": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
         "b": (0.1 * rng.standard_normal(h)).astype(np.float32),
         "w": (rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)}
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("ROCKJIT_NO_PLANE_SPLIT", flag)
        got, ref, bound, st, _ = run_sim(_norm_block, p, x)
        check_bound(got, ref, bound, f"norm block, ROCKJIT_NO_PLANE_SPLIT={flag}")
        f = rockjit.compile(_norm_block, resident_argnums=0, backend="null")
        f(p, x)
        ms = cost.estimate(cost.describe(cost.program_of(f.compiled(p, x)))).ms
        out[flag] = (st["npu_steps"], st["host_bytes_copied"], ms)
    (steps, copied, ms), (steps_rows, copied_rows, ms_rows) = out["0"], out["1"]
    assert steps < steps_rows and copied < copied_rows and ms < ms_rows, out
