"""ModernBERT-base encoder (answerdotai/ModernBERT-base) as a plain JAX function.

Follows transformers 5.24.0 modeling_modernbert.py on its eager/sdpa path (not flash-attention):
  * embeddings: token lookup, then LayerNorm (no bias anywhere in the model);
  * layer i uses global attention when i % global_attn_every_n_layers == 0, else local attention;
  * local attention: key allowed iff |q - k| <= local_attention // 2 (masking_utils'
    sliding_window_bidirectional_overlay with config.sliding_window = local_attention // 2);
    the "+1" HF adds to the module's sliding_window only feeds flash-attention;
  * padding: a key is allowed iff attention_mask[b, k] != 0 (queries are not masked, so the
    outputs at padded positions are meaningless but finite);
  * RoPE rotate-half with theta 160000 (global) / 10000 (local), positions 0..S-1;
  * layer 0 has no attention LayerNorm (Identity); GeGLU MLP with exact GELU.
Parameter names are those of ModernBertModel's state_dict; a ModernBertForMaskedLM checkpoint
(the published one) stores them under 'model.', which load_params detects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import layers as L
from .specs import configure, encoder_spec, require_divisible
from .weights import load_safetensors


@dataclass(frozen=True)
class ModernBertConfig:
    """Defaults are answerdotai/ModernBERT-base (= transformers' ModernBertConfig defaults)."""
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    norm_eps: float = 1e-5
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    pad_token_id: int = 50283

    def __post_init__(self) -> None:
        require_divisible(self, "hidden_size", "num_attention_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def is_global(self, layer: int) -> bool:
        return layer % self.global_attn_every_n_layers == 0

    def to_hf(self):
        """transformers' ModernBertConfig of the same encoder (eager attention): HF's model
        built from it is the tests' reference."""
        from transformers import ModernBertConfig as HFConfig

        return HFConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, norm_eps=self.norm_eps,
            global_attn_every_n_layers=self.global_attn_every_n_layers,
            local_attention=self.local_attention, global_rope_theta=self.global_rope_theta,
            local_rope_theta=self.local_rope_theta, hidden_activation="gelu",
            pad_token_id=self.pad_token_id, attn_implementation="eager")


def expected_shapes(config: ModernBertConfig) -> dict[str, tuple[int, ...]]:
    d, f = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.tok_embeddings.weight": (config.vocab_size, d),
        "embeddings.norm.weight": (d,),
    }
    for i in range(config.num_hidden_layers):
        pre = f"layers.{i}."
        if i != 0:  # layer 0's attention norm is an Identity: no tensor
            shapes[pre + "attn_norm.weight"] = (d,)
        shapes[pre + "attn.Wqkv.weight"] = (3 * d, d)
        shapes[pre + "attn.Wo.weight"] = (d, d)
        shapes[pre + "mlp_norm.weight"] = (d,)
        shapes[pre + "mlp.Wi.weight"] = (2 * f, d)
        shapes[pre + "mlp.Wo.weight"] = (d, f)
    shapes["final_norm.weight"] = (d,)
    return shapes


def load_params(path, config: ModernBertConfig = ModernBertConfig(), *,
                prefix: str | None = None) -> dict[str, np.ndarray]:
    return load_safetensors(path, expected_shapes(config), prefix=prefix)


def attention_biases(attention_mask: jax.Array, config: ModernBertConfig
                     ) -> tuple[jax.Array, jax.Array]:
    """Additive biases (global [B,1,1,S], local [B,1,S,S]) from a [B,S] padding mask."""
    seq = attention_mask.shape[1]
    keys_ok = (attention_mask != 0)[:, None, None, :]
    pos = np.arange(seq)
    # The band depends only on the static length: a trace-time constant.
    band = np.abs(pos[:, None] - pos[None, :]) <= config.local_attention // 2
    return L.mask_bias(keys_ok), L.mask_bias(keys_ok & band[None, None])


def _attention(params: dict, pre: str, x: jax.Array, bias: jax.Array, cos: np.ndarray,
               sin: np.ndarray, config: ModernBertConfig) -> jax.Array:
    d, h = config.hidden_size, config.num_attention_heads
    qkv = L.linear(x, params[pre + "Wqkv.weight"])  # [B, S, 3D]: q | k | v, heads inside each
    q = L.apply_rope(L.split_heads(qkv[..., :d], h), cos, sin)
    k = L.apply_rope(L.split_heads(qkv[..., d:2 * d], h), cos, sin)
    v = L.split_heads(qkv[..., 2 * d:], h)
    out = L.dot_product_attention(q, k, v, 1.0 / math.sqrt(config.head_dim), bias)
    return L.linear(L.merge_heads(out), params[pre + "Wo.weight"])


def _mlp(params: dict, pre: str, x: jax.Array, config: ModernBertConfig) -> jax.Array:
    f = config.intermediate_size
    wi = L.linear(x, params[pre + "Wi.weight"])
    return L.linear(L.gelu_exact(wi[..., :f]) * wi[..., f:], params[pre + "Wo.weight"])


def forward(params: dict, input_ids: jax.Array, attention_mask: jax.Array,
            config: ModernBertConfig = ModernBertConfig(),
            output_hidden_states: bool = False) -> jax.Array | tuple:
    """input_ids [B, S] int, attention_mask [B, S] (1 = token, 0 = padding) -> [B, S, D]
    (last_hidden_state); with ``output_hidden_states`` the pair (last_hidden_state,
    hidden_states) as HF's: the residual stream after the embedding norm and after each layer
    but the last, then the final normed output; num_hidden_layers + 1 tensors, each [B, S, D].

    Rows at padded positions are finite but meaningless; compare only unpadded positions.
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"ModernBERT forward: input_ids {tuple(input_ids.shape)} and "
                         f"attention_mask {tuple(attention_mask.shape)} must have the same [B, S]")
    eps = config.norm_eps
    seq = input_ids.shape[1]
    x = jnp.take(params["embeddings.tok_embeddings.weight"], input_ids, axis=0)
    x = L.layer_norm(x, params["embeddings.norm.weight"], None, eps)
    global_bias, local_bias = attention_biases(attention_mask, config)
    tables = {
        True: L.rope_tables(seq, config.head_dim, config.global_rope_theta),
        False: L.rope_tables(seq, config.head_dim, config.local_rope_theta),
    }
    states = [x]
    for i in range(config.num_hidden_layers):
        pre = f"layers.{i}."
        is_global = config.is_global(i)
        h = x if i == 0 else L.layer_norm(x, params[pre + "attn_norm.weight"], None, eps)
        cos, sin = tables[is_global]
        x = x + _attention(params, pre + "attn.", h, global_bias if is_global else local_bias,
                           cos, sin, config)
        h = L.layer_norm(x, params[pre + "mlp_norm.weight"], None, eps)
        x = x + _mlp(params, pre + "mlp.", h, config)
        if i < config.num_hidden_layers - 1:
            states.append(x)
    last = L.layer_norm(x, params["final_norm.weight"], None, eps)
    if output_hidden_states:
        return last, tuple(states) + (last,)
    return last


def trace_spec(batch: int = 1, seq_len: int = 512, **overrides):
    """What `rockjit trace models.modernbert:trace_spec [seq_len=N] [field=value ...]` traces:
    forward on [batch, seq_len] ids and mask, at the base config with `overrides` applied."""
    config = configure(ModernBertConfig(), overrides)
    ids = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    return encoder_spec(forward, config, expected_shapes(config), ids, mask)
