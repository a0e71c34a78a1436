"""Constant folding right after import: tables built from shapes (RoPE, masks, iota) arrive as
constants, checked against tables computed independently with numpy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from rockjit.ir.ops import Op

SEQ, DIM, BASE = 6, 8, 10000.0


def rope(x):
    """Rotary embedding in the rotate-half form (as in Llama/ModernBERT), tables from iota."""
    inv_freq = 1.0 / (BASE ** (jnp.arange(0, DIM, 2, dtype=jnp.float32) / DIM))
    pos = jnp.arange(x.shape[-2], dtype=jnp.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    x1, x2 = x[..., : DIM // 2], x[..., DIM // 2:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rotated * sin


def numpy_rope(x: np.ndarray) -> np.ndarray:
    inv_freq = 1.0 / (BASE ** (np.arange(0, DIM, 2, dtype=np.float64) / DIM))
    ang = np.arange(x.shape[-2])[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], -1)
    rotated = np.concatenate([-x[..., DIM // 2:], x[..., : DIM // 2]], -1)
    return x * np.cos(ang) + rotated * np.sin(ang)


def test_rope_tables_fold_to_constants() -> None:
    x = np.random.default_rng(0).standard_normal((2, SEQ, DIM)).astype(np.float32)
    f = rockjit.compile(rope, backend="interpreter")
    g = f.lower(x).graph
    ops = {n.op for n in g.nodes}
    assert not ops & {Op.SIN, Op.COS, Op.IOTA, Op.POW, Op.DIV}, sorted(o.text for o in ops)
    # The folded cos/sin tables are among the constants, with numpy's values.
    ang = np.arange(SEQ)[:, None] / (BASE ** (np.arange(0, DIM, 2) / DIM))[None, :]
    ang = np.concatenate([ang, ang], -1)
    consts = [n.attrs["value"] for n in g.nodes if n.op is Op.CONSTANT]
    for table in (np.cos(ang), np.sin(ang)):
        assert any(c.shape == table.shape and np.allclose(c, table, atol=2e-6) for c in consts)
    np.testing.assert_allclose(f(x), numpy_rope(x.astype(np.float64)), rtol=1e-5, atol=2e-6)


def test_causal_mask_folds() -> None:
    def attn_scores(q, k):
        s = q @ k.T
        mask = jnp.tril(jnp.ones((q.shape[0], k.shape[0]), bool))
        return jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)

    q = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    k = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    f = rockjit.compile(attn_scores, backend="interpreter")
    g = f.lower(q, k).graph
    ops = {n.op for n in g.nodes}
    assert Op.IOTA not in ops and Op.GE not in ops
    s = (q @ k.T).astype(np.float64)
    s[np.triu_indices(5, 1)] = -1e9
    want = np.exp(s - s.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(f(q, k), want, rtol=1e-5, atol=1e-6)
