"""No result depends on the first call: LUT domains come from the function (saturation) or
the op runs on the host; compiling needs no data; a function compiled on one input range and
called on one 100x wider stays within its error bound.

References are independent of the compiler: math.erf / math.exp formulas in float64 and JAX
on the CPU. The 100x tests fail on the first-call calibration this replaced (tanh, sigmoid,
GELU, SiLU and the encoder came out 20-40 % off, silently)."""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from models import layers as L
from models.weights import seeded_weights
from numerics_testutil import program_fingerprint, within_bound
from rockjit.ir.activations import ACTIVATIONS, FUSABLE
from rockjit.lowering import calibrate as C
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters import lut

_erf = np.vectorize(math.erf)
_A, _B = math.sqrt(2 / math.pi), 0.044715
GATES = {   # independent float64 gates: result = gate (sigmoid), 2 gate - 1 (tanh), x gate
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": lambda x: (1 + np.tanh(x)) / 2,
    "gelu": lambda x: 0.5 * (1 + _erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * (1 + np.tanh(_A * (x + _B * x ** 3))),
    "mish": lambda x: np.tanh(np.log1p(np.exp(x))),
}
RESULT = {
    "sigmoid": lambda x: GATES["sigmoid"](x), "tanh": np.tanh,
    "gelu": lambda x: x * GATES["gelu"](x), "gelu_tanh": lambda x: x * GATES["gelu_tanh"](x),
    "silu": lambda x: x * GATES["silu"](x), "mish": lambda x: x * GATES["mish"](x),
    "softplus": lambda x: np.logaddexp(x, 0.0),
}
# where each fused activation{kind} runs: a saturating gate has a table domain from the
# function alone (NPU LUT), softplus grows like x and has none (host f32)
ROUTE = {"gelu": "npu", "gelu_tanh": "npu", "silu": "npu", "mish": "npu", "softplus": "host"}
SAT = 2.0 ** -16
# what the notes measured on hardware for these tables (tests/lowering/test_lut.py)
HW_LIMIT = {"sigmoid": 1.46e-3, "tanh": 1.46e-3, "gelu": 1.6e-3, "gelu_tanh": 1.6e-3,
            "silu": 1.6e-3, "mish": 1.6e-3}


@pytest.mark.parametrize("kind", sorted(GATES))
def test_saturation_radius_is_where_the_gate_reaches_its_limits(kind: str) -> None:
    lo, hi = C.lut_domain(kind)
    assert lo == -hi
    g = GATES[kind]
    with np.errstate(over="ignore"):
        assert g(np.array([-hi]))[0] <= SAT * (1 + 1e-6) and 1 - g(np.array([hi]))[0] <= SAT * (1 + 1e-6)
        # and not wider than needed: 1 % inside, one end is still short of its limit
        r = 0.99 * hi
        assert max(g(np.array([-r]))[0], 1 - g(np.array([r]))[0]) > SAT


@pytest.mark.parametrize("kind", sorted(GATES))
def test_saturating_table_is_within_its_bound_for_any_input(kind: str) -> None:
    """The table at the function's domain, fed inputs from 0 to fp16's largest, against the
    exact function (not the clamped one): within table error + clamp error, and the clamp
    error itself is under the table's resolution (2^-16; times |x| for x * gate kinds)."""
    dom = C.lut_domain(kind)
    t = lut.activation_table(kind, dom)
    assert t.abs_error <= HW_LIMIT[kind]
    x = np.concatenate([np.linspace(-100 * dom[1], 100 * dom[1], 40001),
                        [-65504.0, -3000.0, 3000.0, 65504.0]])
    x = x.astype(np.float16).astype(np.float64)         # NPU inputs are fp16
    g = t.emulate(x)
    if kind in C.GATED:
        got = x * g.astype(np.float16).astype(np.float64)
    elif kind == "tanh":
        got = 2 * g - 1
    else:
        got = g
    with np.errstate(over="ignore"):
        ref = RESULT[kind](x)
    bound = T.lut_bound(ref, T._lut_error(kind, x))
    assert np.all(np.abs(got - ref) <= bound), kind
    clamp = C.clamp_error(kind, x, t.lo, t.hi)
    scale = np.abs(x) if kind in C.GATED else (2.0 if kind == "tanh" else 1.0)
    assert np.all(clamp <= SAT * scale * (1 + 1e-6))


def test_only_softmax_exp_and_saturating_kinds_have_a_domain() -> None:
    assert C.lut_domain("exp", max_subtracted=True) == (C.EXP_FLOOR, 0.0)
    for kind in ("exp", "rsqrt", "reciprocal"):
        assert C.lut_domain(kind) is None


def _decisions(c, op: str) -> list[str]:
    return [d.where for d in c._runner.loaded_graph.lowered.decisions if f"= {op}" in d.node]


def test_exp_without_a_row_max_runs_on_the_host_and_is_right_at_any_range() -> None:
    """exp of an arbitrary value (and of x minus the max of *another* value, which can be
    positive) has no domain but the data's: it runs on the host in f32."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.5, 0.5, (8, 64)).astype(np.float32)
    y = rng.uniform(-0.5, 0.5, (8, 64)).astype(np.float32)
    f = rockjit.compile(lambda x: jnp.exp(x), backend="sim")
    g = rockjit.compile(lambda x, y: jnp.exp(x - jnp.max(y, axis=-1, keepdims=True)),
                        backend="sim")
    f(x), g(x, y)
    assert _decisions(f.compiled(x), "exp") == ["host"]
    assert _decisions(g.compiled(x, y), "exp") == ["host"]
    for s in (1, 20):
        # exp alone is all host f32; x - max(y) is an fp16 subtraction first: its bound
        np.testing.assert_allclose(f(x * s), np.exp(x.astype(np.float64) * s), rtol=1e-6)
        xs, ys = x * s, y * s
        want = np.exp(xs.astype(np.float64) - ys.max(-1, keepdims=True))
        ok, ratio = within_bound(g.compiled(x, y), g(xs, ys), want, [xs, ys])
        assert ok, f"exp(x - max(y)) at {s}x: worst |err| / bound = {ratio:.3g}"


def test_every_activation_record_is_pinned_to_an_independent_formula() -> None:
    """Each fusable kind's float64 reference and its jax.nn definition (the records in
    ir/activations.py) equal the formulas above: tests elsewhere may use the record's jax_fn."""
    assert set(FUSABLE) == set(ROUTE) and set(ROUTE) <= set(RESULT)
    x = np.concatenate([np.linspace(-30, 30, 2001), [-1e-3, 0.0, 1e-3]])
    for kind in FUSABLE:
        want = RESULT[kind](x)
        rec = ACTIVATIONS[kind]
        # (the erf formula above cancels to 0 far left, where the reference is ~1e-196)
        np.testing.assert_allclose(rec.reference(x), want, rtol=1e-12, atol=1e-15, err_msg=kind)
        np.testing.assert_allclose(np.asarray(rec.jax_fn(x.astype(np.float32)), np.float64),
                                   want, rtol=2e-6, atol=1e-6, err_msg=kind)


@pytest.mark.parametrize("kind", sorted(ROUTE))
def test_fused_activation_runs_where_stated_within_its_bound(kind: str) -> None:
    """jax.nn.<kind> traced -> one activation{kind} op -> a LUT gate on the NPU or the host
    (``ROUTE``) -> within the graph's bound of JAX on CPU, over the whole range and beyond
    the table. Adding an activation: its record (ir/activations.py), its pattern if JAX
    spells it anew (ir/passes/fuse.py), and its formula and route here."""
    where = ROUTE[kind]
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.uniform(-20, 20, 1000), [-300.0, -12.0, 0.0, 12.0, 300.0],
                        rng.standard_normal(19)]).astype(np.float32).reshape(16, 64)
    fn = ACTIVATIONS[kind].jax_fn
    f = rockjit.compile(fn, backend="sim")
    got = f(x)
    c = f.compiled(x)
    assert c.graph.op_counts() == {"activation": 1}
    assert _decisions(c, "activation") == [where]
    ok, ratio = within_bound(c, got, fn(x), [x])
    assert ok, f"{kind}: worst |err| / bound = {ratio:.3g}"
    # the bound can fail: the gate applied to the neighbouring row is rejected
    assert not within_bound(c, np.roll(np.asarray(got), 1, axis=0), fn(x), [x])[0]


def test_softmax_exp_stays_on_the_npu() -> None:
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    f = rockjit.compile(lambda x: jax.nn.softmax(x, axis=-1), backend="sim")
    f(x)
    assert _decisions(f.compiled(x), "exp") == ["npu"]


# ---------------------------------------------------------------------------------------------
# compile needs no data; 100x wider inputs after the first call
# ---------------------------------------------------------------------------------------------

def _layer_norm(p, x):
    return L.layer_norm(x, p["g"], p["b"], 1e-5)


def _ln_params(rng) -> dict:
    return {"g": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32),
            "b": (0.1 * rng.standard_normal(64)).astype(np.float32)}


ACTS = {
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "mish": jax.nn.mish,
    "softplus": jax.nn.softplus,
    "softmax": partial(jax.nn.softmax, axis=-1),
}


@pytest.mark.parametrize("name", sorted(ACTS) + ["layer_norm"])
def test_same_function_on_inputs_100x_wider_than_the_first_call(name: str) -> None:
    """Compiled by the first call on [-0.5, 0.5], then called on [-50, 50]: within the
    program's bound (tolerance.graph_bound, which uses the compiler's domains)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-0.5, 0.5, (16, 64)).astype(np.float32)
    if name == "layer_norm":
        p = _ln_params(rng)
        fn = partial(_layer_norm, p)
    else:
        fn = ACTS[name]
    f = rockjit.compile(fn, backend="sim")
    f(x)
    c = f.compiled(x)
    for s in (1.0, 100.0):
        xs = (x * s).astype(np.float32)
        ok, ratio = within_bound(c, f(xs), fn(xs), [xs])
        assert ok, f"{name} at {s:g}x the first call's range: worst |err| / bound = {ratio:.3g}"


def test_layer_norm_on_inputs_whose_squares_leave_fp16() -> None:
    rng = np.random.default_rng(4)
    p = _ln_params(rng)
    x = (3 * rng.standard_normal((16, 64))).astype(np.float32)
    f = rockjit.compile(partial(_layer_norm, p), backend="sim")
    f(x)
    xs = 100 * x
    try:
        got = f(xs)
    except rockjit.RockjitError:
        return          # a clear refusal is acceptable
    ok, ratio = within_bound(f.compiled(x), got, _layer_norm(p, xs), [xs])
    assert ok, f"worst |err| / bound = {ratio:.3g}"


def _whisper_small():
    from models import whisper

    cfg = whisper.WhisperEncoderConfig(d_model=64, encoder_layers=1, encoder_attention_heads=2,
                                       encoder_ffn_dim=128, max_source_positions=16)
    return whisper, cfg, seeded_weights(whisper.expected_shapes(cfg))


@pytest.mark.slow
def test_small_encoder_on_inputs_100x_wider_than_the_first_call() -> None:
    """A one-layer Whisper encoder (conv + GELU stem, attention, GELU MLP, LayerNorms)
    compiled by a call on log-mels scaled to 0.01 and then run on unscaled ones."""
    whisper, cfg, params = _whisper_small()
    fn = partial(whisper.forward, config=cfg)
    x = np.random.default_rng(5).standard_normal(
        (1, cfg.num_mel_bins, cfg.num_frames)).astype(np.float32)
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    f(params, 0.01 * x)
    c = f.compiled(params, x)
    for xs in (0.01 * x, x):
        ok, ratio = within_bound(c, f(params, xs), fn(params, xs), [xs])
        assert ok, f"|x| up to {np.abs(xs).max():.3g}: worst |err| / bound = {ratio:.3g}"


def _mlp(p, x):
    return jax.nn.gelu(x @ p["w1"], approximate=False) @ p["w2"] + jnp.tanh(x).sum(-1,
                                                                              keepdims=True)


def _encoder_case(model: str, rng):
    """(fn, params, example inputs, their ShapeDtypeStructs) of a small config."""
    if model == "whisper":
        whisper, cfg, params = _whisper_small()
        fn = partial(whisper.forward, config=cfg)
        xs = (0.01 * rng.standard_normal((1, cfg.num_mel_bins, cfg.num_frames)).astype(
            np.float32),)
    elif model == "siglip":
        from models import siglip
        cfg = siglip.SiglipVisionConfig(hidden_size=64, intermediate_size=96,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        image_size=32, patch_size=16)
        params = seeded_weights(siglip.expected_shapes(cfg))
        fn = partial(siglip.forward, config=cfg)
        xs = (rng.standard_normal((1, 3, 32, 32)).astype(np.float32),)
    else:
        from models import modernbert
        cfg = modernbert.ModernBertConfig(vocab_size=101, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=1, num_attention_heads=4,
                                          local_attention=8)
        params = seeded_weights(modernbert.expected_shapes(cfg))
        fn = partial(modernbert.forward, config=cfg)
        ids = rng.integers(0, cfg.vocab_size, (1, 12)).astype(np.int32)
        xs = (ids, np.ones((1, 12), np.int32))
    return fn, params, xs


@pytest.mark.parametrize("model", ["mlp", "whisper", "siglip", "modernbert"])
def test_compile_from_shape_dtype_struct_is_the_program_compiled_after_a_call(model: str) -> None:
    """lower(weights, ShapeDtypeStruct...).compile() builds the program with no input data,
    and it is word for word the program a first call builds (on small data and, for the
    float-input functions, on 100x wider data)."""
    rng = np.random.default_rng(6)
    if model == "mlp":
        params = {"w1": (rng.standard_normal((64, 96)) / 8).astype(np.float32),
                  "w2": (rng.standard_normal((96, 32)) / 10).astype(np.float32)}
        fn = _mlp
        xs = (rng.uniform(-0.1, 0.1, (16, 64)).astype(np.float32),)
    else:
        fn, params, xs = _encoder_case(model, rng)
    sds = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
    ahead = rockjit.compile(fn, resident_argnums=0, backend="sim").lower(params, *sds).compile()
    assert ahead._runner is not None and ahead._runner.image is not None, \
        "compile() with ShapeDtypeStruct inputs must build the program"
    fp = program_fingerprint(ahead._runner)
    scales = (1, 100) if model in ("mlp", "whisper") else (1,)
    for s in scales:
        call = tuple(x * s if x.dtype.kind == "f" else x for x in xs)
        f = rockjit.compile(fn, resident_argnums=0, backend="sim")
        got = f(params, *call)
        assert program_fingerprint(f.compiled(params, *call)._runner) == fp
    # and the ahead-of-time program runs, giving the same result
    for a, b in zip(jax.tree_util.tree_leaves(ahead(params, *call)),
                    jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(a, b)


def test_fingerprint_sees_a_different_table(monkeypatch) -> None:
    """The fingerprint above can fail: a tanh table over another domain changes it."""
    rng = np.random.default_rng(7)
    params = {"w1": (rng.standard_normal((64, 96)) / 8).astype(np.float32),
              "w2": (rng.standard_normal((96, 32)) / 10).astype(np.float32)}
    sds = jax.ShapeDtypeStruct((16, 64), jnp.float32)

    def build():
        c = rockjit.compile(_mlp, resident_argnums=0, backend="sim").lower(params, sds).compile()
        return program_fingerprint(c._runner)
    first = build()
    real = C.lut_domain
    monkeypatch.setattr(C, "lut_domain",
                        lambda kind, ms=False: (-3.0, 3.0) if kind == "tanh" else real(kind, ms))
    assert build() != first
