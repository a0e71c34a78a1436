"""The range plan (rockjit/lowering/range_plan.py): bounds that hold, the norm-statistics
rewrite that keeps LayerNorm/RMSNorm exact for any fp16 row, and the plan's records/stats.

References are independent: numpy float64 LayerNorm/RMSNorm, and the IR interpreter on the
*original* graph (the rewrite must not change what the graph computes)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from models import layers as L
from rockjit.ir import interpreter
from rockjit.ir.ops import Op
from rockjit.ir.verifier import verify
from rockjit.lowering import range_bounds as RB
from rockjit.lowering import range_plan as RP
from rockjit.lowering.fp16_range import FP16_MAX, saturate_consts
from rockjit.lowering.fold import fold_consts

H = 64


def _ln_np(x, g, b, eps=1e-5):
    x = np.asarray(x, np.float64)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _rms_np(x, g, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def _rms(p, x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * p["g"]


def _ln(p, x):
    return L.layer_norm(x, p["g"], p["b"], 1e-5)


def _block(p, x):
    """LayerNorm -> linear + GELU -> linear -> softmax over the last axis: one of each rule."""
    h = _ln(p, x)
    h = jax.nn.gelu(L.linear(h, p["w1"], p["b1"]), approximate=False)
    return jax.nn.softmax(L.linear(h, p["w2"]), axis=-1), h


def _params(rng, gain=1.0):
    return {"g": (gain * (1 + 0.1 * rng.standard_normal(H))).astype(np.float32),
            "b": (0.1 * rng.standard_normal(H)).astype(np.float32),
            "w1": (rng.standard_normal((96, H)) / 8).astype(np.float32),
            "b1": (0.1 * rng.standard_normal(96)).astype(np.float32),
            "w2": (rng.standard_normal((H, 96)) / 10).astype(np.float32)}


def _rows(rng, n=24):
    """Rows a real checkpoint produces, and the extremes fp16 can hold: an outlier channel of
    620 (Whisper), a ModernBERT-large stream channel of 30000, a row near fp16's largest
    values, a row of tiny values, a constant row (zero deviation)."""
    x = rng.standard_normal((1, n, H)).astype(np.float32)
    x[0, 0:4, 7] = 620.0
    x[0, 4:6, 11] = -30000.0
    x[0, 6] = np.linspace(-60000, 60000, H)
    x[0, 7] *= 1e-3
    x[0, 8] = 3.0
    x[0, 9, 5] = 65504.0
    return x


def _graph(fn, p, x):
    """The graph the range plan sees: the traced one with its composites (softmax,
    layer_norm) expanded, as lowering/pipeline.lower_graph hands it over."""
    from rockjit.ir.composites import expand

    f = rockjit.compile(fn, resident_argnums=0, backend="interpreter")
    c = f.compiled(p, x)
    return expand(c.graph), dict(c.params)


# ---------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------

def test_every_bound_holds_on_data() -> None:
    """Run the graph on data and check |v| <= bound for every float value (input bound = the
    data's own largest magnitude, so every rule is exercised with a finite bound)."""
    rng = np.random.default_rng(0)
    p = _params(rng)
    x = _rows(rng)
    x[0, 6] = np.linspace(-600, 600, H)
    x[0, 9, 5] = 650.0
    g, params = _graph(_block, p, x)
    consts = saturate_consts(fold_consts(g, params), g)
    bounds = RB.compute_bounds(g, consts, input_bound=float(np.abs(x).max()))
    # every value's actual magnitude from the interpreter
    env = {g.inputs[0].id: x}
    from rockjit.ir.reference import evaluate
    checked = 0
    for n in g.nodes:
        if n.out.id in consts:      # compile-time values as the lowering sees them (saturated)
            env[n.out.id] = np.asarray(consts[n.out.id])
        else:
            env[n.out.id] = evaluate(n.op, [env[v.id] for v in n.inputs], n.attrs, n.out.type)
        if n.out.type.dtype.is_float and env[n.out.id].size:
            actual = float(np.abs(env[n.out.id].astype(np.float64)).max())
            assert actual <= bounds[n.out.id] * (1 + 1e-6), (n.op.text, actual, bounds[n.out.id])
            checked += 1
    assert checked > 20
    # the structural rules are finite where interval arithmetic alone would not be
    out = g.producers()[g.outputs[0].id]
    assert bounds[g.outputs[0].id] == 1.0, out.op            # softmax in [0, 1]
    ln = [n for n in g.nodes if n.op is Op.MUL and RB._norm_output(
        n, RB.BoundCtx(g, consts, g.producers(), bounds)) is not None]
    assert len(ln) == 1 and bounds[ln[0].out.id] == math.sqrt(H)


def test_layernorm_bound_is_reached() -> None:
    """sqrt(H) is the tight bound of a normalised element: a row with one non-zero element."""
    x = np.zeros((1, 4, H), np.float32)
    x[0, :, 3] = 5.0
    p = {"g": np.ones(H, np.float32), "b": np.zeros(H, np.float32)}
    got = np.abs(_ln_np(x, 1.0, 0.0)).max()
    assert got <= math.sqrt(H) and got > 0.98 * math.sqrt(H)
    g, params = _graph(_ln, p, x)
    bounds = RB.compute_bounds(g, saturate_consts(fold_consts(g, params), g))
    assert bounds[g.outputs[0].id] == pytest.approx(math.sqrt(H))


def test_matmul_bound_uses_weight_l1_norms() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 32)).astype(np.float32)

    def fn(w, x):
        return L.linear(x, w)

    x = np.ones((4, 32), np.float32)
    g, params = _graph(fn, w, x)
    b = RB.compute_bounds(g, saturate_consts(fold_consts(g, params), g), input_bound=2.0)
    assert b[g.outputs[0].id] == pytest.approx(2.0 * np.abs(w).sum(axis=1).max())


def test_weight_l1_norm_has_the_bits_of_the_whole_float64_sum() -> None:
    """The largest row L1 norm, taken in cache-sized row blocks, is numpy's float64 sum of
    the whole |w| bit for bit on real-sized projections (a bound feeds the prescale
    decisions), and a NaN or inf weight still shows."""
    rng = np.random.default_rng(5)
    for shape in [(768, 768), (1001, 771)]:
        w = rng.standard_normal(shape, np.float32) * np.float32(rng.uniform(0.01, 3.0))
        block = RB._L1_BLOCK // shape[1]
        # the largest row first, last, either side of a block edge, or nowhere special
        for big in (None, 0, block - 1, block, shape[0] - 1):
            v = w.copy()
            if big is not None:
                v[big] *= 4
            want = float(np.max(np.sum(np.abs(v.astype(np.float64)), axis=1)))
            assert RB._max_l1(v, (1,)) == want, (shape, big)
    w[0, 7] = np.nan
    assert math.isnan(RB._max_l1(w, (1,)))
    w[0, 7] = np.inf
    assert RB._max_l1(w, (1,)) == math.inf


# ---------------------------------------------------------------------------------------------
# the rewrite keeps the graph's meaning
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [_ln, _rms], ids=["layernorm", "rmsnorm"])
def test_rewrite_equals_the_original_graph(fn) -> None:
    rng = np.random.default_rng(2)
    p = _params(rng)
    if fn is _rms:
        p = {"g": p["g"]}
    x = _rows(rng)
    g, params = _graph(fn, p, x)
    g2, plan = RP.plan_ranges(g, params)
    verify(g2)
    assert len(plan.sites) == 1 and plan.sites[0].shift == RB.MAX_PRESCALE
    assert not any(n.op is Op.MUL and n.inputs[0].id == n.inputs[1].id and
                   n.inputs[0].id == plan.sites[0].c.id for n in g2.nodes), "old square kept"
    want = interpreter.run(g, [x], params)[0]
    got = interpreter.run(g2, [x], params)[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_no_rewrite_where_the_square_cannot_overflow() -> None:
    """A norm right after a bounded op (here a LayerNorm of a LayerNorm's output, |v| <=
    sqrt(H) * gain = 8.8 < 128) keeps the plain square."""
    rng = np.random.default_rng(3)
    p = _params(rng)

    def fn(p, x):
        return _ln(p, _ln(p, x))

    x = _rows(rng)
    g, params = _graph(fn, p, x)
    g2, plan = RP.plan_ranges(g, params)
    assert len(plan.sites) == 1          # the outer one only


# ---------------------------------------------------------------------------------------------
# on the simulator
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [_ln, _rms], ids=["layernorm", "rmsnorm"])
def test_norm_with_outliers_on_the_simulator(fn) -> None:
    """Rows with outliers of hundreds to tens of thousands, near-fp16-max rows, tiny and
    constant rows: each within fp16 rounding of float64 (the old lowering returned the bias
    for every row whose squares overflowed)."""
    rng = np.random.default_rng(4)
    p = _params(rng)
    x = _rows(rng)
    if fn is _rms:
        p = {"g": p["g"]}
        ref = _rms_np(x, p["g"])
    else:
        ref = _ln_np(x, p["g"], p["b"])
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    assert np.isfinite(got).all()
    # fp16 input rounding (2^-11 of each element, relative to the row's deviation) plus a few
    # fp16 roundings of the output
    scale = np.abs(ref).max(axis=-1, keepdims=True)
    err = np.abs(got - ref) / scale
    assert err.max() < 4e-3, (err.max(axis=-1))
    if fn is _ln:
        # the constant row: zero deviation -> exactly the bias, as in float64
        np.testing.assert_allclose(got[0, 8], p["b"], atol=1e-3)
    c = f.compiled(p, x)
    st = c.stats()
    assert st["range_norm_rewrites"] == 1 and st["range_prescaled"] == 2 and st["range_fp32"] >= 2
    recs = c.range_plan()
    acts = {r.action for r in recs}
    assert {"prescale 2^-8", "row prescale", "fp32", "host"} <= acts, acts
    pre = [r for r in recs if r.action.startswith("prescale")]
    assert pre and pre[0].bound <= 256 and pre[0].loc


def test_old_square_would_overflow() -> None:
    """The reason for the rewrite: the rows above square past fp16 (so the test is able to
    fail without it)."""
    x = _rows(np.random.default_rng(4))
    c = x - x.mean(-1, keepdims=True)
    with np.errstate(over="ignore"):
        assert np.isinf((c.astype(np.float16) * c.astype(np.float16))).any()


def test_plan_records_every_computed_value() -> None:
    rng = np.random.default_rng(5)
    p = _params(rng)
    x = rng.standard_normal((1, 12, H)).astype(np.float32)
    f = rockjit.compile(_block, resident_argnums=0, backend="sim")
    f(p, x)
    c = f.compiled(p, x)
    recs = c.range_plan()
    assert recs and all(r.loc for r in recs)
    for r in recs:
        assert r.action in ("fp16", "fp32", "host", "assumed", "row prescale") or \
            r.action.startswith("prescale"), r
        if r.action == "fp16":
            assert r.bound <= FP16_MAX
    # the softmax output and the LayerNorm output are NPU fp16 values with finite bounds
    assert any(r.action == "fp16" and r.bound == 1.0 for r in recs)
    st = c.stats()
    assert st["range_fp16"] + st["range_fp32"] + st["range_host"] + st["range_assumed"] + \
        st["range_prescaled"] == len(recs)
    assert "|v| <=" in str(recs[0])


# ---------------------------------------------------------------------------------------------
# softmax over long rows (the exp table's precision)
# ---------------------------------------------------------------------------------------------

def test_softmax_exp_table_small_keys() -> None:
    """The one-pass Q0.15 exp table is off by percents for small keys (and floors every key
    below e^-10.4 at 2^-15); the squared half-exponent table softmax uses is within 0.6 %
    (its stated bound; 60x tighter than the one-pass table's at e^-10)."""
    from rockjit.lowering.emitters.lut import activation_error

    x = np.linspace(-10.0, -4.0, 101)
    one_pass = activation_error("exp", x, (-16.0, 0.0)) / np.exp(x)
    squared = activation_error("exp_sq", x, (-16.0, 0.0)) / np.exp(x)
    assert one_pass.max() > 0.3 and squared.max() < 6e-3


def test_long_softmax_on_the_simulator() -> None:
    """1500 keys per row (Whisper's encoder): probabilities within 0.3 % rms of float64, the
    largest probability within 1 %, each row summing to 1 within 0.5 %."""
    rng = np.random.default_rng(6)
    s = (rng.standard_normal((16, 1500)) * 3).astype(np.float32)
    s[:, 7] += 12.0                                   # one dominant key per row
    f = rockjit.compile(lambda s: jax.nn.softmax(s, axis=-1), backend="sim")
    got = np.asarray(f(s), np.float64)
    x = s.astype(np.float16).astype(np.float64)
    ref = np.exp(x - x.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    rms = np.sqrt(((got - ref) ** 2).sum(-1) / (ref ** 2).sum(-1))
    assert rms.max() < 3e-3, rms.max()
    assert (np.abs(got[:, 7] - ref[:, 7]) / ref[:, 7]).max() < 1e-2
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=5e-3)
    rep = f.compiled(s)._runner.report()
    assert "lut.lower_activation[exp_sq]" in rep


def test_overflow_the_plan_could_not_bound_is_reported() -> None:
    """A residual stream pushed past fp16 (65504) by the graph itself: finite inputs, an inf
    inside the NPU program -> NumericsError naming the assumed values, not a plausible result
    (before the norm rewrite the LayerNorm of such a row silently returned its bias)."""
    from rockjit.errors import NumericsError

    p = {"g": np.ones(H, np.float32), "b": np.zeros(H, np.float32)}

    def fn(p, x):
        y = x * 4.0 + x             # |x| = 30000 -> 150000: inf in fp16
        return _ln(p, y)

    x = np.ones((1, 8, H), np.float32)
    x[0, :, 3] = 30000.0
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    with pytest.raises(NumericsError, match="assumed") as e:
        f(p, x)
    assert "mul" in str(e.value) or "add" in str(e.value)
    x[0, :, 3] = 300.0              # the same program on data in range is fine
    got = np.asarray(f(p, x), np.float64)
    np.testing.assert_allclose(got, _ln_np(x * 5.0, 1.0, 0.0), atol=8e-3)   # 1 ulp at 8


def _geglu(p, x):
    """ModernBERT's MLP: LayerNorm, Wi, GeGLU, Wo (no biases)."""
    h = L.layer_norm(x, p["g"], None, 1e-5)
    wi = L.linear(h, p["wi"])
    f = p["wo"].shape[1]
    return L.linear(jax.nn.gelu(wi[..., :f], approximate=False) * wi[..., f:], p["wo"])


def test_gated_mlp_product_past_fp16_is_prescaled() -> None:
    """gelu(a) * b past 65504 (LayerNorm gain 50 on a channel the gate and value rows read
    with weight 2): the product is computed as gelu(a) * (b 2^-s) and Wo scaled by 2^s."""
    rng = np.random.default_rng(7)
    f = 64
    p = {"g": np.ones(H, np.float32),
         "wi": (rng.standard_normal((2 * f, H)) * 0.02).astype(np.float32),
         "wo": (rng.standard_normal((H, f)) * 0.02).astype(np.float32)}
    p["g"][9] = 50.0
    p["wi"][3, 9] = p["wi"][f + 3, 9] = 2.0
    x = rng.standard_normal((1, 16, H)).astype(np.float32)
    x[0, :, 9] += 8.0            # channel 9 after the norm: ~sqrt(H) * 50 -> a, b ~ 700-800
    hn = _ln_np(x, p["g"], 0.0)
    a, b = hn @ p["wi"][:f].T, hn @ p["wi"][f:].T
    prod = a * 0.5 * (1 + __import__("scipy").special.erf(a / np.sqrt(2))) * b
    assert np.abs(prod).max() > 65504         # the product would be inf in fp16
    ref = prod @ p["wo"].T
    fc = rockjit.compile(_geglu, resident_argnums=0, backend="sim")
    got = np.asarray(fc(p, x), np.float64)
    assert np.isfinite(got).all()
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 5e-3, err
    c = fc.compiled(p, x)
    assert c.stats()["range_matmul_input_rewrites"] == 1
    assert any(r.action.startswith("prescale") and "weights" in r.note for r in c.range_plan())


def _attention(p, x):
    return L.multi_head_attention(x, x, p["wq"], None, p["wk"], None, p["wv"], None,
                                  p["wo"], None, 2)


@pytest.mark.parametrize("head_dim", [64, 48])
def test_attention_logits_near_fp16_limit_do_not_overflow_before_the_scale(head_dim: int) -> None:
    """Scaled attention logits of ~15000 (a real checkpoint's large-logit layer, pushed toward
    fp16's limit): q k^T before the 1/sqrt(head_dim) scale is 7-8x that, past 65504, so the
    NPU wrote inf there and the program raised NumericsError. The scale's power of two (1/8) is
    now applied to q first (score_scales.rewrite_score_scales); at head_dim 48 the rest of the
    scale (8 / sqrt(48) = 1.15) stays after the matmul. Reference: numpy float64."""
    rng = np.random.default_rng(11)
    d, s = 2 * head_dim, 16
    scale = head_dim ** -0.5
    p = {k: (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
         for k in ("wq", "wk", "wv", "wo")}
    x = rng.standard_normal((1, s, d)).astype(np.float32)
    xd = x.astype(np.float64)

    def heads(w):
        return (xd @ w.T).reshape(1, s, 2, head_dim).transpose(0, 2, 1, 3)
    raw = heads(p["wq"]) @ heads(p["wk"]).transpose(0, 1, 3, 2) * scale
    gain = np.sqrt(15000.0 / np.abs(raw).max())     # q and k weights times this: max 15000
    p["wq"] *= gain
    p["wk"] *= gain
    q, k, v = heads(p["wq"]), heads(p["wk"]), heads(p["wv"])
    logits = q @ k.transpose(0, 1, 3, 2) * scale
    assert np.abs(logits).max() / scale > 65504      # the unscaled product would overflow
    pr = np.exp(logits - logits.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    ref = (pr @ v).transpose(0, 2, 1, 3).reshape(1, s, d) @ p["wo"].T
    f = rockjit.compile(_attention, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    assert np.isfinite(got).all()
    cos = float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.9999, cos
    c = f.compiled(p, x)
    assert c.stats()["range_score_scale_rewrites"] == 1
    assert any(r.action == "prescale 2^-3" and "scale moved" in r.note for r in c.range_plan())


def test_extremes_of_broadcast_views() -> None:
    """A broadcast constant is scanned through index 0 of its stride-0 axes only; its
    (min, max) is numpy's over the whole array, NaN included."""
    from rockjit.lowering.fp16_range import _scan_extremes

    rng = np.random.default_rng(0)
    table = rng.standard_normal((5, 8)).astype(np.float32)
    with_nan = table.copy()
    with_nan[3, 2] = np.nan
    cases = [np.broadcast_to(table, (2, 3, 5, 8)), np.broadcast_to(table[:, :1], (5, 8)),
             np.broadcast_to(np.float32(-3.0), (4, 6)), np.broadcast_to(with_nan, (3, 5, 8)),
             table[::-1, ::2], table]
    for a in cases:
        got = _scan_extremes(a)
        want = (float(np.min(a)), float(np.max(a)))
        np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("shift", [1, 7, 30, 127, -1, -20, -126])
def test_power_of_two_prescale_rounds_as_the_exact_product(shift: int) -> None:
    """The float32 shortcut of a weight's 2^shift prescale gives the bits of the exact
    (float64) product rounded once, overflow to inf and float32 subnormals included."""
    from rockjit.lowering.range_rewrites import _pow2_scaled

    rng = np.random.default_rng(shift + 200)
    w = rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    w = np.where(np.isfinite(w), w, np.float32(3.0))
    want = (w.astype(np.float64) * 2.0 ** shift).astype(np.float32)
    got = _pow2_scaled(w, shift, np.dtype(np.float32))
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
