"""Attention's 1/sqrt(head_dim) scale folded into q's projection (lowering/score_scales.py): the
program has no pass over the scores (or over q) for it, and the result matches numpy float64."""
from __future__ import annotations

import numpy as np
import pytest

import rockjit
from models import layers as L


def _attention(p, x):
    return L.multi_head_attention(x, x, p["wq"], p["bq"], p["wk"], p["bk"], p["wv"], p["bv"],
                                  p["wo"], p["bo"], 2)


def _reference(p, x, head_dim):
    xd = x.astype(np.float64)
    s, d = x.shape[1], x.shape[2]

    def heads(w, b):
        return (xd @ w.T.astype(np.float64) + b).reshape(1, s, 2, head_dim).transpose(0, 2, 1, 3)
    q, k, v = (heads(p["w" + n], p["b" + n]) for n in "qkv")
    logits = q @ k.transpose(0, 1, 3, 2) * head_dim ** -0.5
    pr = np.exp(logits - logits.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    return (pr @ v).transpose(0, 2, 1, 3).reshape(1, s, d) @ p["wo"].T + p["bo"]


@pytest.mark.parametrize("head_dim", [64, 48])
def test_score_scale_goes_into_the_q_projection(head_dim: int) -> None:
    rng = np.random.default_rng(5)
    d, s = 2 * head_dim, 24
    p = {k: (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
         for k in ("wq", "wk", "wv", "wo")}
    p.update({k: (0.3 * rng.standard_normal(d)).astype(np.float32) for k in ("bq", "bk", "bv", "bo")})
    x = (2 * rng.standard_normal((1, s, d))).astype(np.float32)
    f = rockjit.compile(_attention, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    ref = _reference(p, x, head_dim)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 4e-3, err
    c = f.compiled(p, x)
    assert c.stats()["range_score_scale_rewrites"] == 1
    muls = [ln for ln in c._runner.report().splitlines() if "= mul" in ln]
    # head_dim 64: 1/8 is a power of two, all of it in the weights; 48: the rest (1.15) stays
    assert len(muls) == (0 if head_dim == 64 else 1), muls
    # the scale really is in the weights: without it the logits are 8x and the softmax sharper
    p2 = dict(p, wq=p["wq"] * 8, bq=p["bq"] * 8)
    assert np.abs(_reference(p2, x, head_dim) - ref).max() / np.abs(ref).max() > 20 * err
