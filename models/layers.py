"""Building blocks shared by the encoders, written with jax.numpy / jax.lax / jax.nn only.

Every function is shape-generic over leading batch dimensions and keeps fp32 throughout, so
the traced jaxpr contains only the primitives the rockjit importer is expected to handle
(dot_general, add, mul, reductions, exp, erf/tanh, conv_general_dilated, reshape, transpose).
Weights follow the PyTorch convention of the HF checkpoints: a Linear weight is [out, in].
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """y = x @ W^T (+ b) with W stored as [out, in] like torch.nn.Linear."""
    # Contract x's last axis with W's axis 1 directly, so no transpose of the (resident)
    # weight appears in the graph.
    y = lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))
    if bias is not None:
        y = y + bias
    return y


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array | None, eps: float) -> jax.Array:
    """LayerNorm over the last axis with the biased variance, as torch.nn.LayerNorm."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * lax.rsqrt(var + eps) * weight
    if bias is not None:
        y = y + bias
    return y


def gelu_exact(x: jax.Array) -> jax.Array:
    """GELU with erf (HF "gelu", torch.nn.functional.gelu default)."""
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU with the tanh approximation (HF "gelu_pytorch_tanh")."""
    return jax.nn.gelu(x, approximate=True)


def split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """[B, S, H*d] -> [B, H, S, d]."""
    b, s, hd = x.shape
    return jnp.transpose(x.reshape(b, s, num_heads, hd // num_heads), (0, 2, 1, 3))


def merge_heads(x: jax.Array) -> jax.Array:
    """[B, H, S, d] -> [B, S, H*d]."""
    b, h, s, d = x.shape
    return jnp.transpose(x, (0, 2, 1, 3)).reshape(b, s, h * d)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float,
                          bias: jax.Array | None = None) -> jax.Array:
    """softmax(q k^T * scale + bias) v on [B, H, S, d] operands.

    `bias` broadcasts against the [B, H, Sq, Sk] scores; masked entries carry a large negative
    finite value (not -inf) so a row whose keys are all masked stays finite, as in HF's eager path.
    """
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        scores = scores + bias
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def multi_head_attention(x_q: jax.Array, x_kv: jax.Array, wq: jax.Array, bq: jax.Array | None,
                         wk: jax.Array, bk: jax.Array | None, wv: jax.Array, bv: jax.Array | None,
                         wo: jax.Array, bo: jax.Array | None, num_heads: int,
                         bias: jax.Array | None = None) -> jax.Array:
    """Standard MHA with separate q/k/v/out projections and 1/sqrt(head_dim) scaling."""
    head_dim = wq.shape[0] // num_heads
    q = split_heads(linear(x_q, wq, bq), num_heads)
    k = split_heads(linear(x_kv, wk, bk), num_heads)
    v = split_heads(linear(x_kv, wv, bv), num_heads)
    out = dot_product_attention(q, k, v, 1.0 / math.sqrt(head_dim), bias)
    return linear(merge_heads(out), wo, bo)


def mask_bias(allowed: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Boolean "may attend" mask -> additive bias (0 or the most negative finite value)."""
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.asarray(jnp.finfo(dtype).min, dtype))


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [S, head_dim] for rotate-half RoPE, built at trace time as constants.

    Computed in float32 in the same order as HF (inv_freq = 1/theta^(2i/d), angle = pos*inv_freq,
    the half table repeated twice) so the angles round the same way; positions are static, so
    the tables enter the graph as constants instead of iota/cos/sin ops.
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)
    angles = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin on [B, H, S, d], rotate_half(x) = [-x2, x1]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
