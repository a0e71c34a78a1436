"""SigLIP vision tower (google/siglip-base-patch16-224) as a plain JAX function.

Parameter names are those of transformers' SiglipVisionModel state_dict (5.x: no
'vision_model.' wrapper; a full SiglipModel checkpoint stores the same names under
'vision_model.', which load_params detects).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import layers as L
from .specs import configure, encoder_spec, require_divisible
from .weights import load_safetensors


@dataclass(frozen=True)
class SiglipVisionConfig:
    """Defaults are google/siglip-base-patch16-224's vision_config."""
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        require_divisible(self, "image_size", "patch_size", "a multiple of")
        require_divisible(self, "hidden_size", "num_attention_heads")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_hf(self):
        """transformers' SiglipVisionConfig of the same tower (eager attention): HF's model
        built from it is the tests' reference."""
        from transformers import SiglipVisionConfig as HFConfig

        return HFConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_channels=self.num_channels, image_size=self.image_size, patch_size=self.patch_size,
            layer_norm_eps=self.layer_norm_eps, hidden_act="gelu_pytorch_tanh",
            attn_implementation="eager")


def expected_shapes(config: SiglipVisionConfig) -> dict[str, tuple[int, ...]]:
    d, f, c, p = config.hidden_size, config.intermediate_size, config.num_channels, config.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.patch_embedding.weight": (d, c, p, p),
        "embeddings.patch_embedding.bias": (d,),
        "embeddings.position_embedding.weight": (config.num_patches, d),
    }
    for i in range(config.num_hidden_layers):
        pre = f"encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[pre + norm + ".weight"] = (d,)
            shapes[pre + norm + ".bias"] = (d,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[pre + f"self_attn.{proj}.weight"] = (d, d)
            shapes[pre + f"self_attn.{proj}.bias"] = (d,)
        shapes[pre + "mlp.fc1.weight"] = (f, d)
        shapes[pre + "mlp.fc1.bias"] = (f,)
        shapes[pre + "mlp.fc2.weight"] = (d, f)
        shapes[pre + "mlp.fc2.bias"] = (d,)
    shapes.update({
        "post_layernorm.weight": (d,),
        "post_layernorm.bias": (d,),
        "head.probe": (1, 1, d),
        "head.attention.in_proj_weight": (3 * d, d),
        "head.attention.in_proj_bias": (3 * d,),
        "head.attention.out_proj.weight": (d, d),
        "head.attention.out_proj.bias": (d,),
        "head.layernorm.weight": (d,),
        "head.layernorm.bias": (d,),
        "head.mlp.fc1.weight": (f, d),
        "head.mlp.fc1.bias": (f,),
        "head.mlp.fc2.weight": (d, f),
        "head.mlp.fc2.bias": (d,),
    })
    return shapes


def load_params(path, config: SiglipVisionConfig = SiglipVisionConfig(), *,
                prefix: str | None = None) -> dict[str, np.ndarray]:
    return load_safetensors(path, expected_shapes(config), prefix=prefix)


def _mlp(params: dict, pre: str, x: jax.Array) -> jax.Array:
    h = L.gelu_tanh(L.linear(x, params[pre + "fc1.weight"], params[pre + "fc1.bias"]))
    return L.linear(h, params[pre + "fc2.weight"], params[pre + "fc2.bias"])


def _patch_embed(params: dict, pixel_values: jax.Array, config: SiglipVisionConfig) -> jax.Array:
    p = config.patch_size
    # A p x p, stride p convolution: one output pixel per non-overlapping patch.
    x = lax.conv_general_dilated(pixel_values, params["embeddings.patch_embedding.weight"],
                                 window_strides=(p, p), padding="VALID",
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    x = x + params["embeddings.patch_embedding.bias"][None, :, None, None]
    b, d, gh, gw = x.shape
    x = jnp.transpose(x.reshape(b, d, gh * gw), (0, 2, 1))  # row-major patch order, as HF flatten(2)
    return x + params["embeddings.position_embedding.weight"]


def _encoder_layer(params: dict, i: int, x: jax.Array, config: SiglipVisionConfig) -> jax.Array:
    pre = f"encoder.layers.{i}."
    eps = config.layer_norm_eps
    h = L.layer_norm(x, params[pre + "layer_norm1.weight"], params[pre + "layer_norm1.bias"], eps)
    a = pre + "self_attn."
    h = L.multi_head_attention(
        h, h,
        params[a + "q_proj.weight"], params[a + "q_proj.bias"],
        params[a + "k_proj.weight"], params[a + "k_proj.bias"],
        params[a + "v_proj.weight"], params[a + "v_proj.bias"],
        params[a + "out_proj.weight"], params[a + "out_proj.bias"],
        config.num_attention_heads)
    x = x + h
    h = L.layer_norm(x, params[pre + "layer_norm2.weight"], params[pre + "layer_norm2.bias"], eps)
    return x + _mlp(params, pre + "mlp.", h)


def _pooling_head(params: dict, x: jax.Array, config: SiglipVisionConfig) -> jax.Array:
    """Attention pooling: one learned probe query attends over all tokens (torch MHA layout)."""
    d = config.hidden_size
    w_in, b_in = params["head.attention.in_proj_weight"], params["head.attention.in_proj_bias"]
    probe = jnp.broadcast_to(params["head.probe"], (x.shape[0], 1, d))
    h = L.multi_head_attention(
        probe, x,
        w_in[:d], b_in[:d], w_in[d:2 * d], b_in[d:2 * d], w_in[2 * d:], b_in[2 * d:],
        params["head.attention.out_proj.weight"], params["head.attention.out_proj.bias"],
        config.num_attention_heads)
    n = L.layer_norm(h, params["head.layernorm.weight"], params["head.layernorm.bias"],
                     config.layer_norm_eps)
    h = h + _mlp(params, "head.mlp.", n)
    return h[:, 0]


def forward(params: dict, pixel_values: jax.Array,
            config: SiglipVisionConfig = SiglipVisionConfig(),
            output_hidden_states: bool = False) -> tuple:
    """pixel_values [B, C, H, W] (H = W = config.image_size) ->
    (last_hidden_state [B, num_patches, D], pooler_output [B, D]), and with
    ``output_hidden_states`` a third item as HF's: the embeddings and every encoder layer's
    output (before post_layernorm), num_hidden_layers + 1 tensors [B, num_patches, D]."""
    expect = (config.num_channels, config.image_size, config.image_size)
    if tuple(pixel_values.shape[1:]) != expect:
        raise ValueError(f"SigLIP forward: pixel_values has shape {tuple(pixel_values.shape)}, "
                         f"expected [B, {expect[0]}, {expect[1]}, {expect[2]}] for this config; "
                         f"build the config with image_size={pixel_values.shape[-1]} "
                         f"(and a matching position table) to use another size")
    x = _patch_embed(params, pixel_values, config)
    states = [x]
    for i in range(config.num_hidden_layers):
        x = _encoder_layer(params, i, x, config)
        states.append(x)
    x = L.layer_norm(x, params["post_layernorm.weight"], params["post_layernorm.bias"],
                     config.layer_norm_eps)
    if output_hidden_states:
        return x, _pooling_head(params, x, config), tuple(states)
    return x, _pooling_head(params, x, config)


def trace_spec(batch: int = 1, **overrides):
    """What `rockjit trace models.siglip:trace_spec [image_size=N] [field=value ...]` traces:
    forward at the SigLIP-B/16 224 config with `overrides` applied."""
    config = configure(SiglipVisionConfig(), overrides)
    pixels = jax.ShapeDtypeStruct((batch, config.num_channels, config.image_size,
                                   config.image_size), jnp.float32)
    return encoder_spec(forward, config, expected_shapes(config), pixels)
