"""Norm gains folded into the projections' weights (rockjit/lowering/gain_fold.py).

References are independent: the IR interpreter on the *original* graph (the fold must not
change what the graph computes) and numpy float64."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import rockjit
from models import layers as L
from rockjit.ir import interpreter
from rockjit.ir.ops import Op
from rockjit.ir.verifier import verify
from rockjit.lowering.fold import fold_consts
from rockjit.lowering.gain_fold import bias_through, fold_norm_gains

H, S = 64, 16


def _norm_proj(p, x):
    """ModernBERT's shape: a LayerNorm without bias read only by two projections."""
    h = L.layer_norm(x, p["g"], None, 1e-5)
    return L.linear(h, p["w1"]) + L.linear(h, p["w2"])


def _norm_out_too(p, x):
    h = L.layer_norm(x, p["g"], None, 1e-5)
    return L.linear(h, p["w1"]), h


def _norm_add(p, x):
    h = L.layer_norm(x, p["g"], None, 1e-5)
    return L.linear(h, p["w1"]) + jnp.sum(h)


def _params(gain_peak: float = 40.0, w_scale: float = 1.0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(3)
    g = (1.0 + 0.05 * rng.standard_normal(H)).astype(np.float32)
    g[[3, 17, 40, 59]] = np.array([10.0, 25.0, 33.0, gain_peak], np.float32)  # real-checkpoint gains
    p = {"g": g}
    for k in ("w1", "w2"):
        p[k] = (w_scale * rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    x = (3.0 * rng.standard_normal((1, S, H)) + 1.0).astype(np.float32)
    return p, x


def _graph(fn, p, x):
    c = rockjit.compile(fn, resident_argnums=0, backend="interpreter").compiled(p, x)
    return c.graph, dict(c.params)


def _folds(fn, p, x):
    g, params = _graph(fn, p, x)
    g2, sites = fold_norm_gains(g, fold_consts(g, params))
    return g, g2, params, sites


def test_fold_keeps_the_graph_meaning() -> None:
    p, x = _params()
    g, g2, params, sites = _folds(_norm_proj, p, x)
    assert [s.matmuls for s in sites] == [2]
    verify(g2)
    assert sum(n.op is Op.MUL for n in g2.nodes) == sum(n.op is Op.MUL for n in g.nodes) - 1
    want = np.asarray(interpreter.run(g, [x], params)[0], np.float64)
    got = np.asarray(interpreter.run(g2, [x], params)[0], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_no_fold_where_the_product_is_read_otherwise() -> None:
    p, x = _params()
    for fn in (_norm_out_too, _norm_add):
        _, _, _, sites = _folds(fn, p, x)
        assert sites == [], fn.__name__


def test_no_fold_past_fp16() -> None:
    """Weights up to ~2500 times a gain of 40 would leave fp16: the gain stays apart."""
    p, x = _params(w_scale=5000.0)
    assert np.abs(p["w1"] * p["g"]).max() > 65504
    _, _, _, sites = _folds(_norm_proj, p, x)
    assert sites == []


def _check_close(got: np.ndarray, ref: np.ndarray, rel: float) -> None:
    """Cosine above 0.99999 and the largest error under ``rel`` of the largest reference."""
    cos = float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.99999, cos
    assert np.abs(got - ref).max() / np.abs(ref).max() < rel


def test_folded_program_on_the_simulator() -> None:
    p, x = _params()
    f = rockjit.compile(_norm_proj, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    xd = x.astype(np.float64)
    h = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * p["g"]
    ref = h @ p["w1"].T.astype(np.float64) + h @ p["w2"].T.astype(np.float64)
    _check_close(got, ref, 2e-3)
    assert f.compiled(p, x).stats()["range_gain_folds"] == 1


def test_feature_vector_of_broadcast_views() -> None:
    """A gain reaches the fold as a broadcast view (stride-0 leading axes): only its distinct
    bytes are compared; the answer is numpy's whole-array comparison's, view or copy."""
    from rockjit.ir.graph import Value
    from rockjit.ir.types import DType, TensorType
    from rockjit.lowering.gain_fold import feature_vector

    rng = np.random.default_rng(0)
    vec = rng.standard_normal(8).astype(np.float32)
    table = rng.standard_normal((5, 8)).astype(np.float32)
    odd = np.broadcast_to(vec, (3, 5, 8)).copy()
    odd[2, 4, 1] += 1.0
    cases = [np.broadcast_to(vec, (1, 3, 5, 8)),            # a gain over rows: a vector
             np.broadcast_to(table, (2, 3, 5, 8)),          # a table over heads: not one
             np.broadcast_to(vec, (3, 5, 8)).copy(),        # materialized, uniform
             odd,                                           # materialized, one row differs
             np.broadcast_to(np.float32(2.0), (4, 8))]      # a scalar
    for c in cases:
        want = np.array_equal(c, np.broadcast_to(c.reshape(-1, 8)[0], c.shape))
        got = feature_vector(Value(1, TensorType(DType.F32, c.shape)), {1: c})
        assert (got is not None) == want, c.strides
        if want:
            np.testing.assert_array_equal(got, c.reshape(-1, 8)[0])


def _biased_norm_proj(p, x):
    """SigLIP's / Whisper's shape: a LayerNorm with a bias read only by projections, one with
    a bias of its own (q_proj) and one without (Whisper's k_proj)."""
    h = L.layer_norm(x, p["g"], p["b"], 1e-5)
    return L.linear(h, p["w1"], p["c1"]) * L.linear(h, p["w2"])


def _biased_params() -> tuple[dict, np.ndarray]:
    p, x = _params()
    rng = np.random.default_rng(5)
    p["b"] = (0.5 * rng.standard_normal(H)).astype(np.float32)
    p["b"][7] = 6.0
    p["c1"] = (0.3 * rng.standard_normal(H)).astype(np.float32)
    return p, x


def test_bias_fold_keeps_the_graph_meaning() -> None:
    """n * g + b read by two projections: b @ W^T goes into the first projection's bias and
    a new bias add after the second; the bias's pass is gone, the gain's stays (module
    docstring: folding it too moved real Whisper the wrong way)."""
    p, x = _biased_params()
    g, g2, params, sites = _folds(_biased_norm_proj, p, x)
    assert [(s.matmuls, s.bias) for s in sites] == [(2, True)]
    verify(g2)
    n_op = lambda gr, op: sum(n.op is op for n in gr.nodes)   # noqa: E731
    assert n_op(g2, Op.MUL) == n_op(g, Op.MUL)
    # the norm's bias add is gone; the bias-less projection gained one
    assert n_op(g2, Op.ADD) == n_op(g, Op.ADD)
    adds = [n for n in g2.nodes if n.op is Op.ADD]
    assert not any(n.inputs[0].id == sites[0].product.id or n.inputs[1].id == sites[0].product.id
                   for n in adds)
    want = np.asarray(interpreter.run(g, [x], params)[0], np.float64)
    got = np.asarray(interpreter.run(g2, [x], params)[0], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_no_bias_fold_where_the_normed_value_is_read_otherwise() -> None:
    def fn(p, x):
        h = L.layer_norm(x, p["g"], p["b"], 1e-5)
        return L.linear(h, p["w1"], p["c1"]), h

    p, x = _biased_params()
    _, _, _, sites = _folds(fn, p, x)
    assert sites == []


def test_bias_folded_program_on_the_simulator() -> None:
    """Against numpy float64 on the original formula."""
    p, x = _biased_params()
    f = rockjit.compile(_biased_norm_proj, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    xd = x.astype(np.float64)
    h = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * p["g"] \
        + p["b"]
    ref = (h @ p["w1"].T.astype(np.float64) + p["c1"]) * (h @ p["w2"].T.astype(np.float64))
    _check_close(got, ref, 4e-3)
    assert f.compiled(p, x).stats()["range_gain_folds"] == 1


def test_bias_through_has_the_bits_of_tensordot_with_one_scratch_for_all() -> None:
    """The norm bias through a projection, with the float64 copy of each weight in one reused
    buffer: bit for bit numpy's tensordot on fresh float64 copies, whatever came before in
    the buffer (a larger weight, the other axis)."""
    rng = np.random.default_rng(3)
    scratch = [np.empty(0, np.float64)]
    for shape, ax, dt in [((96, 40), 1, np.float32), ((300, 96), 0, np.float32),
                          ((40, 96), 0, np.float16), ((96, 300), 1, np.float32),
                          ((7, 5), 0, np.float64)]:
        w = (rng.standard_normal(shape) / 9).astype(dt)
        b = rng.standard_normal(shape[ax]).astype(np.float32)
        want = np.tensordot(np.asarray(w, np.float64), b.astype(np.float64), axes=([ax], [0]))
        got = bias_through(w, b, ax, scratch)
        assert got.dtype == np.float64 and got.shape == want.shape
        assert np.array_equal(got, want), (shape, ax, dt)
    assert scratch[0].size == 300 * 96


def test_bias_through_keeps_the_bits_on_real_sized_weights() -> None:
    """Row blocks of real-sized projections (SigLIP/ModernBERT/Whisper: q/k/v, fc1, fc2, an
    odd row count) give numpy's tensordot of the whole float64 copy, bit for
    bit: the fp16 bias they feed (and so the simulator's output) must not move."""
    rng = np.random.default_rng(7)
    scratch = [np.empty(0, np.float64)]
    for shape in [(768, 768), (3072, 768), (768, 3072), (1001, 771)]:
        w = rng.standard_normal(shape, np.float32) * np.float32(rng.uniform(0.01, 0.2))
        b = (3 * rng.standard_normal(shape[1])).astype(np.float32)
        want = np.tensordot(w.astype(np.float64), b.astype(np.float64), axes=([1], [0]))
        got = bias_through(w, b, 1, scratch)
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), shape
