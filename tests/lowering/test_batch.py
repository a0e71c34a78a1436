"""Batches above 1 on the strict simulator, each against JAX on CPU under tolerance.graph_bound
(issue 13): the smallest graphs that were wrong at batch > 1, and batched variants of the
encoder paths.

Three bugs, none visible at batch 1:

* multicore scratch (image_builder.py): the patchify conv's im2col cube is op scratch filled by a
  host step (context 0); the matmul job of image 1 runs on core 1 and read that core's mirror,
  which nothing had copied: every image but the first came out 0.
* element-wise padded spans (pipeline.py, eltwise.py): the flat view reads past the bytes its
  producer writes, and its identity conv sums each flat row's 32 channels, so a stale NaN in
  that tail (or in the row broadcast's unwritten scratch tail) turned real outputs to NaN.
  Whether the stale bytes were NaN depended on the arena plan, which the batch changed; the
  poisoned-arena runs below fill every byte nothing declares zero with fp16 NaN.
* a batch folded into one cube's rows (pipeline.py): packed one item at a time, each item's
  zero fill of the layout wiped the earlier items' lines (ModernBERT b3 T=128: cosine 0.53).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from graphs_testutil import assert_npu, check_bound, run_poisoned, run_sim
from models import layers as L
from models.weights import seeded_tensor


# ---------------------------------------------------------------------------------------------
# patchify conv: one matmul job per image, dealt over the cores
# ---------------------------------------------------------------------------------------------

def _patchify(p, x):
    return lax.conv_general_dilated(x, p["w"], (16, 16), "VALID",
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


@pytest.mark.parametrize("batch", [2, 3, 4])
def test_patchify_conv_batched_over_the_cores(batch: int) -> None:
    rng = np.random.default_rng(100 + batch)
    p = {"w": (rng.standard_normal((64, 3, 16, 16)) / 28).astype(np.float32)}
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_patchify, p, x)
    conv = [l for l in rep.splitlines() if "= conv" in l]
    assert len(conv) == 1 and "im2col + matmul" in conv[0], rep
    assert st["cores_used"] >= 2 and st["jobs_core1"] >= 1, st
    for b in range(batch):
        check_bound(got[b], ref[b], bound[b], f"patchify, image {b} of {batch}")


# ---------------------------------------------------------------------------------------------
# a batch folded into one cube's rows
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,seq", [(2, 128), (3, 64), (3, 128), (4, 128)])
def test_channel_scale_of_a_batch_folded_into_rows(batch: int, seq: int) -> None:
    """x * g (a per-channel weight) on [B, T, C] from the host: the B x T rows are one cube."""
    rng = np.random.default_rng(200 + batch)
    p = {"g": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)}
    x = rng.standard_normal((batch, seq, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(lambda p, x: x * p["g"], p, x)
    assert_npu(rep, "mul")
    for b in range(batch):
        check_bound(got[b], ref[b], bound[b], f"x * g, batch element {b} of {batch}")


def test_layer_norm_of_a_batch_folded_into_rows() -> None:
    rng = np.random.default_rng(210)
    p = {"g": (1 + 0.05 * rng.standard_normal(64)).astype(np.float32)}
    x = rng.standard_normal((3, 128, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(lambda p, x: L.layer_norm(x, p["g"], None, 1e-5), p, x)
    for b in range(3):
        check_bound(got[b], ref[b], bound[b], f"LayerNorm, batch element {b} of 3")


# ---------------------------------------------------------------------------------------------
# element-wise padded spans on a poisoned arena
# ---------------------------------------------------------------------------------------------

D_, H_ = 64, 4


def _head_params(rng: np.random.Generator) -> dict:
    p = {k: (rng.standard_normal((D_, D_)) / 8).astype(np.float32) for k in ("wq", "wk", "wv", "wo")}
    p.update({"b" + k: (rng.standard_normal(D_) * 0.1).astype(np.float32) for k in "qkvo"})
    p["probe"] = rng.standard_normal((1, 1, D_)).astype(np.float32)
    p["g"] = (1 + 0.05 * rng.standard_normal(D_)).astype(np.float32)
    p["b"] = (0.1 * rng.standard_normal(D_)).astype(np.float32)
    return p


def _pool_then_norm(p, x):
    """SigLIP's head up to its LayerNorm: one probe query attends over the tokens, then
    LayerNorm: matmuls of fewer than 4 rows whose cubes are shorter than the element-wise
    flat view's span, and a per-row scale whose broadcast cube is shorter too."""
    probe = jnp.broadcast_to(p["probe"], (x.shape[0], 1, D_))
    h = L.multi_head_attention(probe, x, p["wq"], p["bq"], p["wk"], p["bk"], p["wv"], p["bv"],
                               p["wo"], p["bo"], H_)
    return L.layer_norm(h, p["g"], p["b"], 1e-6)


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_short_cubes_on_a_poisoned_arena(batch: int) -> None:
    rng = np.random.default_rng(300 + batch)
    p = _head_params(rng)
    x = rng.standard_normal((batch, 4, D_)).astype(np.float32)
    (got,), (ref,), (bound,) = run_poisoned(_pool_then_norm, p, x)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, f"attention pooling + LayerNorm, batch {batch}, poisoned arena")


@pytest.mark.parametrize("batch", [2, 3])
def test_patchify_then_pooling_head_on_a_poisoned_arena(batch: int) -> None:
    """The graph that gave SigLIP's pooled output NaN at batch 2: patch embedding, then the
    pooling head, on an arena whose unplanned bytes are NaN."""
    rng = np.random.default_rng(310 + batch)
    p = _head_params(rng)
    p["w"] = (rng.standard_normal((D_, 3, 16, 16)) / 28).astype(np.float32)
    p["pos"] = rng.standard_normal((4, D_)).astype(np.float32)

    def fn(p, x):
        e = _patchify(p, x)
        e = jnp.transpose(e.reshape(x.shape[0], D_, 4), (0, 2, 1)) + p["pos"]
        return _pool_then_norm(p, e)[:, 0]

    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    (got,), (ref,), (bound,) = run_poisoned(fn, p, x)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, f"patchify + pooling head, batch {batch}, poisoned arena")


# ---------------------------------------------------------------------------------------------
# batched encoder paths
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_modernbert_small_padded_batch3_rows_of_different_lengths() -> None:
    """ModernBERT at a small config, three rows of 64 / 40 / 13 tokens under one pad mask
    (global and local layers): every position within the graph's bound, each row on its own."""
    from models import modernbert

    cfg = modernbert.ModernBertConfig(vocab_size=101, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      local_attention=16)
    rng = np.random.default_rng(400)
    params = {k: seeded_tensor(k, shape, rng) for k, shape in modernbert.expected_shapes(cfg).items()}
    ids = rng.integers(0, cfg.vocab_size, (3, 64)).astype(np.int32)
    mask = np.zeros((3, 64), np.int32)
    for b, n in enumerate((64, 40, 13)):
        mask[b, :n] = 1
    fn = lambda p, i, m: modernbert.forward(p, i, m, config=cfg)  # noqa: E731
    got, ref, bound, st, rep = run_sim(fn, params, ids, mask)
    assert np.isfinite(got).all()
    for b in range(3):
        check_bound(got[b], ref[b], bound[b], f"ModernBERT padded row {b}")
    assert_npu(rep, "exp")


@pytest.mark.parametrize("batch", [1, 2])
def test_attention_over_196_keys_on_a_poisoned_arena(batch: int) -> None:
    """SigLIP-224's attention (196 keys): K is packed at run time into a weight layout of 224
    kernels (the matmul's padded N) while the packer writes 208; the 16 kernels past them fed
    the scores' padding channels, which the softmax's ones-vector row sum multiplies by 0."""
    rng = np.random.default_rng(320 + batch)
    q, k, v = (rng.standard_normal((batch, 2, 196, 16)).astype(np.float32) for _ in range(3))
    p = {"s": np.float32(1.0)}

    def fn(p, q, k, v):
        return L.dot_product_attention(q * p["s"], k, v, 0.25)

    (got,), (ref,), (bound,) = run_poisoned(fn, p, q, k, v)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, f"attention over 196 keys, batch {batch}, poisoned arena")


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_layer_norm_of_short_rows_on_a_poisoned_arena(batch: int) -> None:
    """linear -> LayerNorm on [B, 1, D]: the per-row centring and scaling broadcast a 4-row
    cube whose broadcast scratch is shorter than the element-wise span; its unwritten tail
    made NaN padding results, which the per-channel scale's flat view mixed into real rows."""
    rng = np.random.default_rng(330 + batch)
    p = {"w": (rng.standard_normal((D_, D_)) / 8).astype(np.float32),
         "g": (1 + 0.1 * rng.standard_normal(D_)).astype(np.float32)}
    x = rng.standard_normal((batch, 1, D_)).astype(np.float32)

    def fn(p, x):
        return L.layer_norm(L.linear(x, p["w"]), p["g"], None, 1e-5)

    (got,), (ref,), (bound,) = run_poisoned(fn, p, x)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, f"linear + LayerNorm on [{batch}, 1, {D_}], poisoned arena")


# the lowering fuzzer's batched LayerNorm specs (test_fuzz_lowering.py REGRESSIONS), poisoned
_FOLDED_LN = [
    dict(op="chain", batch=(2, 4), rows=41, d=3, steps=["layernorm"], units=["tanh"],
         widths=[1], seed=0, profile="rk3588"),
    dict(op="chain", batch=(2,), rows=255, d=113, steps=["unary", "layernorm"],
         units=["tanh", "tanh"], widths=[1, 1], seed=0, profile="rk3588"),
    # 6 rows in an 8-row cube: the two padding positions of the row vector
    dict(op="chain", batch=(3,), rows=2, d=3, steps=["layernorm"], units=["tanh"],
         widths=[1], seed=0, profile="rk3588"),
]


@pytest.mark.parametrize("spec", _FOLDED_LN, ids=["8x41x3", "tanh-2x255x113", "3x2x3"])
def test_per_row_division_of_a_folded_batch_on_a_poisoned_arena(spec: dict) -> None:
    """LayerNorm's x / s[row] on a batch folded into one cube's rows: the per-row rules made
    one call per item, each over the whole folded layout, with a row vector that held only
    that item's rows; the positions nothing wrote (NaN here) gave NaN padding results that
    x * g's flat view mixed into real rows. One call over the folded cube writes every row.
    The host reciprocal writes only the real rows of the row vector; the broadcast reads every
    position of the cube (rows padded to 4: 3 x 2 rows in 8), so the rest is zero-filled."""
    import fuzz_graphs as FG

    fn, p, xs = FG.build(spec)
    (got,), (ref,), (bound,) = run_poisoned(fn, p, *xs)
    assert np.isfinite(got).all()
    check_bound(got, ref, bound, f"{FG.describe(spec)}, poisoned arena")
