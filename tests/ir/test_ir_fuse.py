"""Fusion as an IR rewrite: composite activations become ``activation{kind}`` ops, visible in
the text form, checked by the verifier, and equal in value to jax.nn's definitions."""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rockjit.ir import Builder, DType, Op, TensorType
from rockjit.ir.activations import ACTIVATIONS, FUSABLE
from rockjit.ir.interpreter import run
from rockjit.ir.parser import parse
from rockjit.ir.passes import PassManager
from rockjit.ir.passes.fuse import GELU, PATTERNS, _validates
from rockjit.ir.passes.pattern import UPat, match, required_ops, root_ops
from rockjit.ir.printer import print_graph
from rockjit.ir.verifier import verify
from test_ir_golden import build_mlp, run_mlp_against_numpy

GOLDEN = Path(__file__).parent / "golden"
F32 = DType.F32

# the kinds' jax.nn definitions (each record's jax_fn is pinned to an independent float64
# formula by tests/numerics/test_lut_domains.py)
JAX_FNS = {k: ACTIVATIONS[k].jax_fn for k in FUSABLE}


def _trace(fn, shape=(4, 8)):
    import rockjit

    f = rockjit.compile(fn, backend="interpreter")
    return f.lower(np.zeros(shape, np.float32)).graph


def test_every_fusable_kind_has_a_pattern() -> None:
    assert set(FUSABLE) == {k for _, k in PATTERNS}


def test_root_ops_rule_out_only_nodes_a_pattern_cannot_fit() -> None:
    """find_matches skips a pattern at a node whose op its root cannot have (root_ops): the
    alternatives' ops together; a variable or a constant anywhere among them fits any node."""
    add, mul = UPat(Op.ADD, (UPat.var("a"), UPat.var("b"))), UPat(Op.MUL, (UPat.var("a"),))
    assert root_ops(UPat.any(add, mul)) == {Op.ADD, Op.MUL}
    assert root_ops(UPat((Op.EXP, Op.LOG), (UPat.var("x"),))) == {Op.EXP, Op.LOG}
    assert root_ops(UPat.any(add, UPat.var("x"))) is None
    assert root_ops(UPat.any(add, UPat.cvar(1.0))) is None
    b = Builder()
    x = b.input(TensorType(DType.F32, (4,)))
    y = b.add(Op.ADD, [x, x])
    g = b.finish([y])
    for pat in (add, UPat.any(mul, add)):
        assert Op.ADD in root_ops(pat) and list(match(pat, y, g.producers()))


def test_required_ops_are_what_every_fit_covers() -> None:
    """find_matches skips a pattern in a graph lacking an op every fit of it covers
    (required_ops): the ops of unnamed patterns along every path, what all alternatives
    share; a named pattern can fit by its binding alone and promises nothing."""
    x = UPat.var("x")
    exp_x = UPat(Op.EXP, (x,))
    assert required_ops(UPat(Op.ADD, (exp_x, UPat.cvar(1.0)))) == {Op.ADD, Op.EXP}
    assert required_ops(UPat.any(UPat(Op.ADD, (exp_x, x)), UPat(Op.MUL, (exp_x, x)))) == {Op.EXP}
    assert required_ops(UPat(Op.ADD, (UPat(Op.EXP, (x,), name="e"), x))) == {Op.ADD}
    assert required_ops(UPat((Op.EXP, Op.LOG), (UPat(Op.NEG, (x,)),))) == {Op.NEG}
    needs = {kind: required_ops(pat) for pat, kind in PATTERNS}
    assert Op.ERF in needs["gelu"] and Op.TANH in needs["gelu_tanh"] and Op.TANH in needs["mish"]


def test_fused_mlp_golden() -> None:
    g = PassManager(["fuse"]).run(build_mlp())
    verify(g)
    text = print_graph(g)
    assert text == (GOLDEN / "mlp_fused.ir").read_text()
    assert parse(text) == g
    assert g.op_counts().get("activation") == 1 and "erf" not in g.op_counts()


def test_fused_mlp_values_match_numpy() -> None:
    run_mlp_against_numpy(parse((GOLDEN / "mlp_fused.ir").read_text()))


@pytest.mark.parametrize("kind", sorted(JAX_FNS))
def test_jax_spelling_fuses_to_one_op(kind: str) -> None:
    g = _trace(JAX_FNS[kind])
    ops = g.op_counts()
    assert ops.get("activation") == 1, ops
    (act,) = [n for n in g.nodes if n.op is Op.ACTIVATION]
    assert act.attrs["kind"] == kind and act.inputs[0] == g.inputs[0]
    # nothing of the chain is left: only the activation (and no constants) remain
    assert set(ops) == {"activation"}, ops
    x = np.linspace(-12, 12, 32, dtype=np.float32).reshape(4, 8)
    (y,) = run(g, [x], {})
    # jax evaluates the chain in f32 (several roundings); the fused op rounds once
    np.testing.assert_allclose(y, np.asarray(JAX_FNS[kind](x)), rtol=2e-6, atol=1e-6)


def test_bias_before_the_activation_stays_outside() -> None:
    g = _trace(lambda x: jax.nn.gelu(x + 1.5, approximate=True))
    (act,) = [n for n in g.nodes if n.op is Op.ACTIVATION]
    assert act.attrs["kind"] == "gelu_tanh" and act.inputs[0] != g.inputs[0]
    assert g.op_counts().get("add") == 1


@pytest.mark.parametrize("fn", [
    lambda x: 0.5 * x * (1 + jax.lax.erf(x * 0.8)),          # not 1/sqrt(2)
    lambda x: x * jax.nn.sigmoid(2.0 * x),                    # x * sigmoid(2x) is not SiLU
    lambda x: x * jax.nn.sigmoid(x + 1e-3),                   # the gate reads another value
], ids=["erf_scale", "sigmoid_2x", "other_gate_input"])
def test_look_alikes_are_not_fused(fn) -> None:
    assert "activation" not in _trace(fn).op_counts()


def test_shared_interior_is_not_fused() -> None:
    # the sigmoid is an output too: fusing would compute it twice
    g = _trace(lambda x: (x * jax.nn.sigmoid(x), jax.nn.sigmoid(x)))
    assert "activation" not in g.op_counts()


def test_validator_rejects_a_wrong_kind() -> None:
    """The numeric probe is the check of a structural match: the GELU nodes are not SiLU."""
    g = build_mlp()
    producers = g.producers()
    pos = {vid: i for i, vid in enumerate(producers)}
    root = next(n for n in reversed(g.nodes) if any(True for _ in match(GELU, n.out, producers)))
    m = next(match(GELU, root.out, producers))
    assert _validates(m, root, "gelu", producers, pos)
    assert not _validates(m, root, "silu", producers, pos)


def test_unknown_kind_is_refused_by_the_verifier() -> None:
    b = Builder()
    x = b.input(TensorType(F32, (2,)))
    with pytest.raises(Exception, match="unknown activation kind 'swish'"):
        b.add(Op.ACTIVATION, [x], attrs={"kind": "swish"})


# ------------------------------------------------------------------------------ softmax

def test_fused_attention_golden() -> None:
    """The hand-built attention's softmax (no max(-inf, .)) becomes softmax{axes}; expanded
    again it computes the same values as the original graph."""
    from rockjit.ir.composites import expand
    from test_ir_golden import build_attention

    g = PassManager(["fuse"]).run(build_attention())
    verify(g)
    text = print_graph(g)
    assert text == (GOLDEN / "attention_fused.ir").read_text()
    assert parse(text) == g
    assert g.op_counts().get("softmax") == 1 and "exp" not in g.op_counts()
    rng = np.random.default_rng(1)
    p = {k: rng.standard_normal(t.shape).astype(np.float32) / 4 for k, t in g.params().items()}
    x = rng.standard_normal((6, 8)).astype(np.float32)
    (want,) = run(build_attention(), [x], p)
    for h in (g, expand(g)):
        np.testing.assert_allclose(run(h, [x], p)[0], want, rtol=1e-5, atol=1e-6)
    assert "softmax" not in expand(g).op_counts()


@pytest.mark.parametrize("axis", [-1, 0, (0, 2)])
def test_jax_softmax_fuses_and_expands_back(axis) -> None:
    from rockjit.ir.composites import expand

    fn = lambda x: jax.nn.softmax(x, axis=axis)  # noqa: E731
    g = _trace(fn, (3, 4, 5))
    assert g.op_counts() == {"softmax": 1}
    ax = (axis % 3,) if isinstance(axis, int) else axis
    assert tuple(g.nodes[0].attrs["axes"]) == ax
    x = np.random.default_rng(2).uniform(-20, 20, (3, 4, 5)).astype(np.float32)
    want = np.asarray(fn(x))
    for h in (g, expand(g)):
        np.testing.assert_allclose(run(h, [x], {})[0], want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("fn", [
    # the max over one axis, the sum over another: not a softmax
    lambda x: jnp.exp(x - x.max(1, keepdims=True)) / jnp.exp(x - x.max(1, keepdims=True)).sum(
        0, keepdims=True),
    # the max of another value subtracted
    lambda x: jnp.exp(x - (x * 2).max(1, keepdims=True)) / jnp.exp(
        x - (x * 2).max(1, keepdims=True)).sum(1, keepdims=True),
], ids=["axes_differ", "other_max"])
def test_softmax_look_alikes_are_not_fused(fn) -> None:
    assert "softmax" not in _trace(fn).op_counts()


# ------------------------------------------------------------------------------ layer_norm

def _ln(x, eps=1e-5, ddof=0):
    """models/layers.layer_norm's arithmetic (without gain and shift)."""
    m = jnp.mean(x, axis=-1, keepdims=True)
    c = x - m
    n = x.shape[-1]
    v = jnp.sum(c * c, axis=-1, keepdims=True) / (n - ddof)
    return c * jax.lax.rsqrt(v + eps)


def test_layer_norm_fuses_and_expands_back() -> None:
    from models import layers as L
    from rockjit.ir.composites import expand

    p = {"g": np.linspace(0.5, 1.5, 8).astype(np.float32), "b": np.ones(8, np.float32)}
    fn = lambda x: L.layer_norm(x, p["g"], p["b"], 1e-5)  # noqa: E731
    g = _trace(fn, (3, 4, 8))
    ln = [n for n in g.nodes if n.op is Op.LAYER_NORM]
    assert len(ln) == 1 and ln[0].attrs["axes"] == (2,) and ln[0].inputs[0] == g.inputs[0]
    assert abs(ln[0].attrs["eps"] - 1e-5) < 1e-10
    assert "rsqrt" not in g.op_counts() and "reduce_sum" not in g.op_counts()
    assert parse(print_graph(g)) == g
    x = np.random.default_rng(3).normal(2.0, 3.0, (3, 4, 8)).astype(np.float32)
    want = np.asarray(fn(x))
    for h in (g, expand(g)):
        np.testing.assert_allclose(run(h, [x], {})[0], want, rtol=1e-5, atol=2e-6)
    assert "layer_norm" not in expand(g).op_counts()


def test_layer_norm_look_alikes_are_not_fused() -> None:
    # the unbiased variance (divide by n - 1) is not LayerNorm's
    assert "layer_norm" not in _trace(lambda x: _ln(x, ddof=1)).op_counts()
    assert "layer_norm" in _trace(lambda x: _ln(x)).op_counts()
