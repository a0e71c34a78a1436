"""A LayerNorm's chain of passes on the cores that hold its planes (issue 9).

A norm over [T, H] is a feature reduce (Sx), x * 2^-s0 and its square, a second reduce, the
centring and scaling by per-row values the host computes, and the gain and bias
(lowering/range_plan.py, range_rewrites.py). Two ways keep each reduce on the cores that made
its operand, so coalesce merges it with its passes (coalesce.reorder puts the passes that need
no host result into the open step):
* the default, where H is three equal whole K groups: the passes keep the flat split by whole
  channel planes and each reduce sums the same planes per core, the host adding the partials
  (rules/reduce._plane_split_sum);
* ROCKJIT_ROW_SPLIT=1: the passes that make a reduce's operand are split by the reduce's rows
  (rules/row_chain.py, emitters/eltwise_rows.py), so each core sums rows it made.
The last per-row pass (c * k) and the gain and bias keep the split by whole channel planes
(eltwise_row._one_pass). Checked on the strict simulator against JAX on CPU at token counts
that do not divide by 3, with the program shape claimed: the norm in 3 NPU steps either way
at [197, 768] (8 before either), more where neither applies.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_sim


def _layer_norm(p, x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jnp.reciprocal(jnp.sqrt(var + 1e-6)) * p["g"] + p["b"]


def _per_row_cores(f, p, x) -> list[set[int]]:
    """The cores of each per-row (row-broadcast) pass's jobs."""
    from rockjit.cost import program_of

    prog = program_of(f.compiled(p, x))
    calls = prog.lowered.calls
    cores: dict[int, set[int]] = {}
    for st in prog.steps:
        for jr in st.jobs if st.kind == "npu" else ():
            if calls[jr.call].call.emitter == "eltwise.lower_binary_row":
                cores.setdefault(jr.call, set()).add(jr.core)
    return list(cores.values())


def _plane_split_reduces(p, x) -> int:
    """How many of the program's calls are feature reduces split by channel planes."""
    from rockjit.cost import program_of

    f = rockjit.compile(_layer_norm, resident_argnums=0, backend="null")
    f(p, x)
    return sum(c.call.emitter == "reduce.feature_reduce (ones matmul per plane range)"
               for c in program_of(f.compiled(p, x)).lowered.calls)


@pytest.mark.parametrize("t,h,spread", [
    (197, 768, True), (50, 48, False),
    # H = 40: the cube padded to 64 channels for the reduce's K; H = 44: its last plane has
    # padding lanes too. Rows offset by ~30 made x - mean's padding -mean, which the per-row
    # scale took past fp16 when squared: the reduce's 0 * inf gave NaN (a NumericsError)
    (50, 40, False), (50, 44, False),
])
@pytest.mark.parametrize("row_split", ["1", "0"])
def test_layer_norm_chain_on_the_sim(t: int, h: int, spread: bool, row_split: str,
                                     monkeypatch) -> None:
    monkeypatch.setenv("ROCKJIT_ROW_SPLIT", row_split)
    rng = np.random.default_rng(t)
    # a residual stream's scale and an offset per row, so centring matters
    x = (rng.standard_normal((t, h)) * 4 + rng.standard_normal((t, 1)) * 30).astype(np.float32)
    p = {"g": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
         "b": (0.1 * rng.standard_normal(h)).astype(np.float32)}
    got, ref, bound, st, _ = run_sim(_layer_norm, p, x)
    check_bound(got, ref, bound, f"LayerNorm [{t}, {h}]")
    if row_split == "0":
        # the default: the flat split, and each reduce split by the same channel planes
        # (rules/reduce._plane_split_sum) where H is three whole equal K groups, so it joins
        # its passes' step; else the reduce's row tiles, a step after its passes' (coalesce
        # cannot merge across the cores the flat ranges and the row tiles use)
        if h % (3 * 32) == 0 and spread:
            assert _plane_split_reduces(p, x) == 3, st   # Sx, r1 and r2
            assert st["npu_steps"] == 3, st
        else:
            assert _plane_split_reduces(p, x) == 0, st
            assert st["npu_steps"] <= 5, st
        return
    f = rockjit.compile(_layer_norm, resident_argnums=0, backend="null")
    f(p, x)
    rows = _per_row_cores(f, p, x)
    assert len(rows) == 3, rows          # x - mean, c * t, c * k
    # x - mean and c * t feed the second reduce: split by its rows, one range per core (on
    # main: one job, core 0); c * k feeds no reduce: kernel ranges over several cores where
    # the cube is large enough to pay for them (placement prices how many)
    assert rows[0] == rows[1] == {0, 1, 2}, rows
    assert len(rows[2]) > 1 if spread else rows[2] == {0}, rows
    # [Sx, x 2^-s0, its square, r1] host [c, c t, its square, r2] host [c k, * g, + b]: each
    # reduce in the step of the passes that make its operand (main: 8 steps at [197, 768])
    assert st["npu_steps"] == 3, st


def test_row_split_gives_the_same_bits_in_as_many_steps(monkeypatch) -> None:
    """ROCKJIT_ROW_SPLIT (the A/B switch for a board): the row split computes the same fp16
    passes as the flat split. At H = 768 the default sums each reduce by the flat split's
    channel planes (rules/reduce._plane_split_sum), so its reduces join their passes' steps
    too: as many NPU steps as the row split, in far fewer tasks. The fp32 sums add the same
    terms in another order; the norm's output here is bit-identical all the same."""
    t, h = 197, 768
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((t, h)) * 4 + rng.standard_normal((t, 1)) * 30).astype(np.float32)
    p = {"g": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
         "b": (0.1 * rng.standard_normal(h)).astype(np.float32)}
    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ROCKJIT_ROW_SPLIT", flag)
        f = rockjit.compile(_layer_norm, resident_argnums=0, backend="sim")
        runs[flag] = (np.asarray(f(p, x)), f.compiled(p, x).stats())
    (on, s_on), (off, s_off) = runs["1"], runs["0"]
    np.testing.assert_array_equal(on, off)
    assert s_on["npu_steps"] == s_off["npu_steps"] == 3 and s_on["tasks"] > s_off["tasks"], \
        (s_on, s_off)
