"""RoPE's rotate_half folded into a second projection with rotated weights
(lowering/rotation_fold.py): a RoPE attention block over a fused qkv projection, as ModernBERT's,
runs on the simulator with no host step between the projection and the scores, and matches JAX
on the CPU."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from models import layers as L
from rockjit.ir.interpreter import run
from rockjit.ir.ops import Op
from rockjit.ir.verifier import verify
from rockjit.lowering.fold import fold_consts
from rockjit.lowering.rotation_fold import fold_rotations


def _block(p, x, *, heads: int, theta: float = 10000.0, rotate=L.apply_rope,
           separate: bool = False):
    """ModernBERT's attention: one fused q|k|v projection, RoPE on q and k, softmax, Wo.
    ``separate``: Llama's layout, q, k and v projected apart (slices of the same weight), so
    RoPE's chain starts at the head split (a reshape), not at a slice of one projection."""
    d = x.shape[-1]
    cos, sin = L.rope_tables(x.shape[1], d // heads, theta)
    if separate:
        w = p["wqkv"]
        q, k, v = (L.linear(x, w[i * d:(i + 1) * d]) for i in range(3))
    else:
        qkv = L.linear(x, p["wqkv"], p.get("bqkv"))
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    q = rotate(L.split_heads(q, heads), cos, sin)
    k = rotate(L.split_heads(k, heads), cos, sin)
    v = L.split_heads(v, heads)
    out = L.dot_product_attention(q, k, v, (d // heads) ** -0.5)
    return L.linear(L.merge_heads(out), p["wo"])


def _swapped_rope(x, cos, sin):
    """rotate_half with the sign on the other half: what a wrong fold would compute."""
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([x[..., half:], -x[..., :half]], axis=-1) * sin


def _params(rng, d: int, bias: bool) -> dict:
    p = {"wqkv": (rng.standard_normal((3 * d, d)) / np.sqrt(d)).astype(np.float32),
         "wo": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)}
    if bias:
        p["bqkv"] = (0.3 * rng.standard_normal(3 * d)).astype(np.float32)
    return p


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("batch,seq,heads,head_dim,bias", [
    (1, 32, 2, 64, False),      # ModernBERT's head dim
    (1, 13, 3, 24, True),       # odd sequence, a head dim that is no channel-group multiple
], ids=["d64", "odd_d24_bias"])
def test_rope_attention_on_the_npu_matches_jax(batch, seq, heads, head_dim, bias) -> None:
    rng = np.random.default_rng(11)
    d = heads * head_dim
    p = _params(rng, d, bias)
    x = (2 * rng.standard_normal((batch, seq, d))).astype(np.float32)
    fn = jax.tree_util.Partial(_block, heads=heads)
    f = rockjit.compile(lambda p, x: _block(p, x, heads=heads), resident_argnums=0,
                        backend="sim")
    got = np.asarray(f(p, x))
    with jax.default_device(jax.devices("cpu")[0]):
        want = np.asarray(jax.jit(fn)(p, x))
        wrong = np.asarray(jax.jit(lambda p, x: _block(p, x, heads=heads,
                                                       rotate=_swapped_rope))(p, x))
    err = _rel(got, want)
    assert err < 4e-3, err
    # the check can see a wrong rotation: one sign moved is far outside the tolerance
    assert _rel(wrong, want) > 20 * err
    decisions = f.compiled(p, x)._runner.lowered.decisions
    ops = {dc.node.split("=")[1].strip(): dc.where for dc in decisions}
    # the rotation's neg and concatenate are gone: its weights did them at compile time
    assert not [n for n in ops if n in ("neg", "concatenate")], ops
    # nothing between the projection and the scores runs on the host: no host op of the
    # projection, the head split or the rotation, and no re-tile (host unpack/pack) either
    lines = {f"{L.__file__}:{fn.__code__.co_firstlineno + i}" for fn in
             (L.linear, L.split_heads, L.apply_rope) for i in range(len(inspect.getsource(fn)
                                                                         .splitlines()))}
    host = [dc for dc in decisions if dc.where == "host" and dc.loc in lines]
    assert not host, [(dc.node, dc.why) for dc in host]
    assert [dc for dc in decisions if dc.loc in lines and dc.where == "npu"]
    # the score scale went into the cos/sin tables (score_scales.py): a power of two (head_dim
    # 64) leaves no pass of its own, the rest of 24^-0.5 one
    att = L.dot_product_attention.__code__
    att_lines = {f"{L.__file__}:{att.co_firstlineno + i}" for i in range(
        len(inspect.getsource(L.dot_product_attention).splitlines()))}
    scale_muls = [dc for dc in decisions if dc.loc in att_lines and dc.node.endswith("= mul")
                  and dc.where == "npu"]
    assert len(scale_muls) == (0 if head_dim == 64 else 1), scale_muls
    assert f.compiled(p, x).stats()["range_score_scale_rewrites"] == 1


def _graph(fn, p, x):
    low = rockjit.compile(fn, resident_argnums=0, backend="interpreter").lower(p, x)
    return low.graph, low.compile().params


def _folded_exactly(fn, p, x):
    """(graph, folded graph): q's and k's rotations folded (2 sites), no neg or concatenate
    left, the same result on the interpreter."""
    g, params = _graph(fn, p, x)
    g2, sites = fold_rotations(g, fold_consts(g, params))
    verify(g2)
    assert len(sites) == 2                                     # q's and k's
    assert not [n for n in g2.nodes if n.op in (Op.NEG, Op.CONCATENATE)]
    assert _rel(run(g2, [x], params)[0], run(g, [x], params)[0]) < 1e-6
    return g, g2


def test_fold_is_exact_and_only_for_a_signed_column_selection_of_a_projection() -> None:
    rng = np.random.default_rng(3)
    heads, d = 2, 16
    p = _params(rng, d, True)
    x = rng.standard_normal((2, 6, d)).astype(np.float32)
    g, g2 = _folded_exactly(lambda p, x: _block(p, x, heads=heads), p, x)
    assert sum(n.op is Op.DOT_GENERAL for n in g2.nodes) == \
        sum(n.op is Op.DOT_GENERAL for n in g.nodes) + 1       # one projection for both

    # any signed selection of the projection's columns folds (a half read twice), exactly
    def dup(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., half:]], axis=-1) * sin
    g, params = _graph(lambda p, x: _block(p, x, heads=heads, rotate=dup), p, x)
    g2, sites = fold_rotations(g, fold_consts(g, params))
    assert len(sites) == 2
    assert _rel(run(g2, [x], params)[0], run(g, [x], params)[0]) < 1e-6

    # a plain swap of a projection's halves: its weights swapped, the original matmul gone
    def swap(p, x):
        h = x @ p["wo"]
        return jnp.concatenate([h[..., d // 2:], h[..., :d // 2]], axis=-1) * 2.0
    g, params = _graph(swap, p, x)
    g2, sites = fold_rotations(g, fold_consts(g, params))
    verify(g2)
    assert len(sites) == 1 and sum(n.op is Op.DOT_GENERAL for n in g2.nodes) == 1
    assert not [n for n in g2.nodes if n.op in (Op.SLICE, Op.CONCATENATE)]
    assert _rel(run(g2, [x], params)[0], run(g, [x], params)[0]) < 1e-6

    # a roll over the positions mixes rows: no column selection, nothing to fold
    def roll(x, cos, sin):
        return x * cos + jnp.concatenate([-x[:, :, 2:], x[:, :, :2]], axis=2) * sin
    g, params = _graph(lambda p, x: _block(p, x, heads=heads, rotate=roll), p, x)
    assert fold_rotations(g, fold_consts(g, params))[1] == []

    # a rotation of a product of two run-time values: no weights to fold it into
    def act(p, x):
        q = L.split_heads(x * x, heads)
        half = q.shape[-1] // 2
        return jnp.concatenate([-q[..., half:], q[..., :half]], axis=-1) + q
    g, params = _graph(act, p, x)
    assert fold_rotations(g, fold_consts(g, params))[1] == []


def test_rotation_of_a_separate_projection_folds_whole() -> None:
    # the chain from a projection to its rotation need not begin with a slice: here it reads
    # every column of q's own projection (this once raised KeyError 'start' while compiling)
    rng = np.random.default_rng(5)
    heads, d = 2, 32
    p = _params(rng, d, False)
    x = rng.standard_normal((1, 8, d)).astype(np.float32)

    def fn(p, x):
        return _block(p, x, heads=heads, separate=True)
    _folded_exactly(fn, p, x)
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    with jax.default_device(jax.devices("cpu")[0]):
        want = np.asarray(jax.jit(fn)(p, x))
    assert _rel(np.asarray(f(p, x)), want) < 4e-3
