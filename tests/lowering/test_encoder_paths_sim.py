"""The encoders' less common paths on the strict simulator, each against JAX on CPU under
tolerance.graph_bound:

* matmuls with fewer than 4 rows (the output cube is padded to 4): SigLIP's attention-pooling
  head (one probe query), and a linear + bias + GELU at M = 1..3;
* ModernBERT's path: token-embedding gather on the host, additive attention masks built with
  finfo(f32).min (or -inf), which fp16 cannot hold, RoPE tables as constants, GeGLU;
* the helpers behind them: fp16 saturation of mask constants, LUT index scales past fp16's
  range, graph_bound's rules for gathers, selects and comparisons.
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import assert_npu, check_bound, run_sim
from models import layers as L
from models.weights import seeded_tensor
from rockjit.ir.activations import ACTIVATIONS
from rockjit.lowering import fp16_range, lut_tables
from rockjit.oracle import tolerance as T


# ---------------------------------------------------------------------------------------------
# M < 4
# ---------------------------------------------------------------------------------------------

D_, H_, S_ = 64, 4, 9


def _pool_params(rng: np.random.Generator, m: int) -> dict:
    p = {k: (rng.standard_normal((D_, D_)) / 8).astype(np.float32) for k in ("wq", "wk", "wv", "wo")}
    p.update({"b" + k: (rng.standard_normal(D_) * 0.1).astype(np.float32) for k in "qkvo"})
    p["probe"] = rng.standard_normal((1, m, D_)).astype(np.float32)
    return p


def _pooling(p, x):
    """SigLIP's head: learned probe queries attend over the tokens (torch MHA layout)."""
    m = p["probe"].shape[1]
    probe = jnp.broadcast_to(p["probe"], (x.shape[0], m, D_))
    return L.multi_head_attention(probe, x, p["wq"], p["bq"], p["wk"], p["bk"], p["wv"],
                                  p["bv"], p["wo"], p["bo"], H_)[:, 0]


@pytest.mark.parametrize("m", [1, 2, 3])
def test_attention_pooling_with_fewer_than_four_queries(m: int) -> None:
    """Regression: at M = 1 the matmul's 4-row output cube could not hold the [1, 1, D]
    result (the unit row axis blocked the reshape to the value's shape)."""
    rng = np.random.default_rng(20 + m)
    p = _pool_params(rng, m)
    x = rng.standard_normal((1, S_, D_)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_pooling, p, x)
    assert got.shape == (1, D_)
    T.check(got, ref, bound, f"attention pooling, {m} probe rows")
    assert_npu(rep, "dot_general")


def _linear_gelu(approximate: bool):
    def fn(p, x):
        return jax.nn.gelu(L.linear(x, p["w"], p["b"]), approximate=approximate)
    return fn


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("approximate", [False, True])
def test_linear_bias_gelu_with_fewer_than_four_rows(m: int, approximate: bool,
                                                    monkeypatch) -> None:
    """Regression: the fusion probe of a small tensor only sampled the flat tail near -12,
    so gelu(x + b) was taken for gelu(x) (the bias dropped) and the tanh form for the erf
    form. The NPU path is the subject: at one row the cost model would run it on the host."""
    monkeypatch.setenv("ROCKJIT_NPU_FIRST", "1")
    rng = np.random.default_rng(30 + m)
    p = {"w": (rng.standard_normal((96, D_)) / 8).astype(np.float32),
         "b": (rng.standard_normal(96) * 0.5).astype(np.float32)}
    x = rng.standard_normal((1, m, D_)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_linear_gelu(approximate), p, x)
    T.check(got, ref, bound, f"linear + gelu(approximate={approximate}), M = {m}")
    kind = "gelu_tanh" if approximate else "gelu"
    fused = [l for l in rep.splitlines() if f"lut.lower_activation[{kind}]" in l]
    assert len(fused) == 1 and " npu " in fused[0], rep
    # the activation's input is the matmul + bias, which itself ran on the NPU; under 12 rows
    # the matmul's EW epilogue is refused (k-accumulation.md) and the bias is a channel pass
    assert_npu(rep, "matmul_epilogue")
    assert "eltwise.lower_binary_channel" in rep, rep


# ---------------------------------------------------------------------------------------------
# additive masks fp16 cannot hold
# ---------------------------------------------------------------------------------------------

def _masked_attention(neg):
    def fn(p, x, keep):
        h, s, d = 2, x.shape[0], x.shape[1]
        q, k, v = (L.linear(x, p[f"w{n}"]) for n in "qkv")
        heads = lambda t: t.reshape(s, h, d // h).transpose(1, 0, 2)
        bias = jnp.where(keep[None, None, :] != 0, 0.0, neg)          # [1, 1, S] keys
        scores = jnp.einsum("hqd,hkd->hqk", heads(q), heads(k)) / math.sqrt(d // h) + bias
        probs = jax.nn.softmax(scores, axis=-1)
        return probs, jnp.einsum("hqk,hkd->hqd", probs, heads(v))
    return fn


@pytest.mark.parametrize("neg", [float(np.finfo(np.float32).min), -np.inf],
                         ids=["finfo_min", "minus_inf"])
def test_softmax_with_padding_mask_stays_finite_and_correct(neg: float) -> None:
    """finfo(f32).min (HF's mask value) and -inf are -inf in fp16; -inf - max and the exp
    LUT's index of -inf would make NaN. The lowering saturates them to -2^15 (fp16_range)."""
    rng = np.random.default_rng(40)
    s, d = 24, 32
    p = {f"w{n}": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in "qkv"}
    x = rng.standard_normal((s, d)).astype(np.float32)
    keep = np.ones(s, np.int32)
    keep[-7:] = 0                                  # 7 padded keys
    fn = _masked_attention(neg)
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    got = [np.asarray(g, np.float64) for g in f(p, x, keep)]
    c = f.compiled(p, x, keep)
    refs = [np.asarray(r, np.float64) for r in fn(p, x, keep)]
    bounds = T.graph_bound(c.graph, c.params, [x, keep])
    for g, r, b, what in zip(got, refs, bounds, ("probs", "attention")):
        assert np.isfinite(g).all(), what
        check_bound(g, r, b + 2.0 ** -23 * np.abs(r), what)
    probs = got[0]
    # a masked key weighs at most the exp table's floor entry (q = 1: 2^-15) over a row sum
    # >= 1, not 1/S; unmasked rows still sum to 1
    assert probs[..., -7:].max() <= 2.0 ** -15 * 1.01
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=s * 2 * T.U16)
    # the exp stayed on the NPU (a masked score no longer widens its table past fp16)
    assert_npu(c._runner.report(), "exp")


def test_saturate_replaces_only_what_fp16_cannot_hold() -> None:
    f32min = np.finfo(np.float32).min
    a = np.array([f32min, -np.inf, np.inf, -65504.0, 65504.0, 1.5, np.nan, -70000.0], np.float32)
    s = fp16_range.saturate(a)
    m = fp16_range.MASK_MAGNITUDE
    np.testing.assert_array_equal(s[:6], [-m, -m, m, -65504.0, 65504.0, 1.5])
    assert np.isnan(s[6]) and s[7] == -m
    assert np.float16(m) == m and np.isfinite(np.float16(-m + -m + 65504 - 2 * m + m))
    ok = np.linspace(-65504, 65504, 11, dtype=np.float32)
    assert not fp16_range.needs_saturation(ok) and fp16_range.saturate(ok) is ok
    assert not fp16_range.needs_saturation(np.array([1, 2], np.int32))


# ---------------------------------------------------------------------------------------------
# ModernBERT's front: gather on the host, RoPE as constants, GeGLU
# ---------------------------------------------------------------------------------------------

def _bert_block(p, ids):
    x = jnp.take(p["emb"], ids, axis=0)                                # [S, D] host gather
    x = L.layer_norm(x, p["g"], None, 1e-5)
    s, d = x.shape
    cos, sin = L.rope_tables(s, d, 10000.0)                           # trace-time constants
    x = L.apply_rope(x[None, None], cos, sin)[0, 0]
    wi = L.linear(x, p["wi"])                                          # GeGLU
    return L.linear(L.gelu_exact(wi[:, :48]) * wi[:, 48:], p["wo"])


def test_embedding_gather_rope_geglu() -> None:
    rng = np.random.default_rng(50)
    d = 32
    p = {"emb": rng.standard_normal((101, d)).astype(np.float32),
         "g": (1 + 0.05 * rng.standard_normal(d)).astype(np.float32),
         "wi": (rng.standard_normal((96, d)) / np.sqrt(d)).astype(np.float32),
         "wo": (rng.standard_normal((d, 48)) / np.sqrt(48)).astype(np.float32)}
    ids = rng.integers(0, 101, 20).astype(np.int32)
    got, ref, bound, st, rep = run_sim(_bert_block, p, ids)
    check_bound(got, ref, bound, "embedding + LayerNorm + RoPE + GeGLU")
    take = [l for l in rep.splitlines() if "= take" in l]
    assert take and all(" host " in l for l in take), rep
    assert_npu(rep, "dot_general", "activation")
    assert "lut.lower_activation[gelu]" in rep


def test_graph_bound_moves_errors_through_take_and_select() -> None:
    """take and select_n move their operands' errors with the data: a gather of an NPU
    result keeps that result's bound, row for row."""
    rng = np.random.default_rng(51)
    w = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    idx = np.array([3, 3, 0, 7], np.int32)
    pick = np.array([True, False, True, False])

    def fn(w, x, idx):
        y = x @ w
        return jnp.take(y, idx, axis=0), jnp.where(pick[:, None], y[:4], 0.0), y

    f = rockjit.compile(fn, resident_argnums=0, backend="interpreter")
    c = f.compiled(w, x, idx)
    taken, selected, whole = T.graph_bound(c.graph, c.params, [x, idx])
    # (the rule evaluates the gather in the operand's float32: equal to ~1e-7 relative)
    np.testing.assert_allclose(taken, whole[idx], rtol=1e-6)
    np.testing.assert_allclose(selected[pick], whole[:4][pick], rtol=1e-6)
    assert np.all(selected[~pick] == T.FLOOR)     # the exact zero case carries no error


def test_graph_bound_refuses_a_compare_of_values_with_error() -> None:
    """A comparison of NPU-computed floats may flip: no additive bound describes that."""
    rng = np.random.default_rng(52)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    f = rockjit.compile(lambda w, x: jnp.where(x @ w > 0, 1.0, 0.0), resident_argnums=0,
                        backend="interpreter")
    c = f.compiled(w, x)
    with pytest.raises(NotImplementedError, match="compares values that carry NPU error"):
        T.graph_bound(c.graph, c.params, [x])


# ---------------------------------------------------------------------------------------------
# LUT index scales past fp16's range
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(-1e-4, 0.0), (2.0, 2.0 + 1e-5)])
def test_narrow_lut_domain_saturates_the_index_scale(lo: float, hi: float) -> None:
    """A near-constant calibrated input asks for INDEX_SPAN / width > 65504: the fp16 index
    scale saturates at 65504 (no overflow warning), covering a wider domain that contains the
    requested one, with the table's stated error bound still holding."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = lut_tables.build_shifted_table("exp", np.exp, lo, hi, np.exp)
    # the covered domain contains the requested one (up to the fp32 rounding of the BN bias)
    slack = 2.0 ** -20 * max(1.0, abs(lo))
    assert t.lo <= lo + slack and t.hi >= hi - slack
    scale = float(np.array(t.bn.mul, np.uint16).view(np.float16))
    assert scale == 65504.0
    x = np.linspace(t.lo, t.hi, 4097)
    assert np.all(np.abs(t.emulate(x) - np.exp(x)) <= t.error_at(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sig = ACTIVATIONS["sigmoid"]
        u = lut_tables.build_unit_table("sigmoid", sig.table, 1e-3, sig.table_derivative)
    assert u.hi >= 1e-3


def test_modernbert_small_with_padding() -> None:
    """ModernBERT end to end at a small config with the last keys padded: the global layers'
    padding mask and the local layers' band + padding mask (finfo(f32).min in the model)
    stay finite through fp16, and every position (padded queries too: they attend to the
    real keys) is within the graph's bound."""
    from models import modernbert

    cfg = modernbert.ModernBertConfig(vocab_size=101, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      local_attention=8)
    rng = np.random.default_rng(60)
    params = {k: seeded_tensor(k, shape, rng) for k, shape in modernbert.expected_shapes(cfg).items()}
    ids = rng.integers(0, cfg.vocab_size, (1, 20)).astype(np.int32)
    mask = np.ones((1, 20), np.int32)
    mask[:, -6:] = 0
    fn = lambda p, i, m: modernbert.forward(p, i, m, config=cfg)  # noqa: E731
    got, ref, bound, st, rep = run_sim(fn, params, ids, mask)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, "ModernBERT with 6 padded keys")
    assert_npu(rep, "exp")
