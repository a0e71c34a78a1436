"""Whisper encoder (openai/whisper-tiny, -base) as a plain JAX function.

Parameter names are those of transformers' WhisperEncoder state_dict; WhisperModel stores them
under 'encoder.', WhisperForConditionalGeneration (the published checkpoints) under
'model.encoder.'; load_params detects either.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import layers as L
from .specs import configure, encoder_spec, require_divisible
from .weights import load_safetensors

_LN_EPS = 1e-5  # torch.nn.LayerNorm's default; Whisper's norms do not set one


@dataclass(frozen=True)
class WhisperEncoderConfig:
    """Defaults are openai/whisper-base; see `tiny()`."""
    d_model: int = 512
    encoder_layers: int = 6
    encoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    num_mel_bins: int = 80
    max_source_positions: int = 1500

    def __post_init__(self) -> None:
        require_divisible(self, "d_model", "encoder_attention_heads")

    @classmethod
    def base(cls) -> "WhisperEncoderConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "WhisperEncoderConfig":
        return cls(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536)

    @property
    def num_frames(self) -> int:
        """Mel frames per input: conv2 halves the time axis down to max_source_positions."""
        return 2 * self.max_source_positions

    def to_hf(self):
        """transformers' WhisperConfig of the same encoder (eager attention): HF's model built
        from it is the tests' reference."""
        from transformers import WhisperConfig

        return WhisperConfig(
            d_model=self.d_model, encoder_layers=self.encoder_layers,
            encoder_attention_heads=self.encoder_attention_heads,
            encoder_ffn_dim=self.encoder_ffn_dim, num_mel_bins=self.num_mel_bins,
            max_source_positions=self.max_source_positions, activation_function="gelu",
            attn_implementation="eager")


def expected_shapes(config: WhisperEncoderConfig) -> dict[str, tuple[int, ...]]:
    d, f = config.d_model, config.encoder_ffn_dim
    shapes: dict[str, tuple[int, ...]] = {
        "conv1.weight": (d, config.num_mel_bins, 3),
        "conv1.bias": (d,),
        "conv2.weight": (d, d, 3),
        "conv2.bias": (d,),
        "embed_positions.weight": (config.max_source_positions, d),
    }
    for i in range(config.encoder_layers):
        pre = f"layers.{i}."
        shapes[pre + "self_attn.k_proj.weight"] = (d, d)  # k_proj has no bias in Whisper
        for proj in ("v_proj", "q_proj", "out_proj"):
            shapes[pre + f"self_attn.{proj}.weight"] = (d, d)
            shapes[pre + f"self_attn.{proj}.bias"] = (d,)
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            shapes[pre + norm + ".weight"] = (d,)
            shapes[pre + norm + ".bias"] = (d,)
        shapes[pre + "fc1.weight"] = (f, d)
        shapes[pre + "fc1.bias"] = (f,)
        shapes[pre + "fc2.weight"] = (d, f)
        shapes[pre + "fc2.bias"] = (d,)
    shapes["layer_norm.weight"] = (d,)
    shapes["layer_norm.bias"] = (d,)
    return shapes


def load_params(path, config: WhisperEncoderConfig = WhisperEncoderConfig(), *,
                prefix: str | None = None) -> dict[str, np.ndarray]:
    return load_safetensors(path, expected_shapes(config), prefix=prefix)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's fixed position table [length, channels]: [sin | cos] halves.

    Timescales are geometric from 1 to max_timescale over channels/2 entries:
    inv_ts[i] = exp(-i * ln(max_timescale) / (channels/2 - 1)), angle[t, i] = t * inv_ts[i].
    """
    if channels % 2:
        raise ValueError(f"sinusoid positions need an even channel count, got {channels}")
    half = channels // 2
    inv_ts = np.exp(-math.log(max_timescale) / (half - 1) * np.arange(half, dtype=np.float64))
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_ts[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def _conv1d(x: jax.Array, w: jax.Array, b: jax.Array, stride: int) -> jax.Array:
    """Kernel-3, pad-1 1-D convolution on [B, C, T] with a torch [O, I, K] weight."""
    y = lax.conv_general_dilated(x, w, window_strides=(stride,), padding=((1, 1),),
                                 dimension_numbers=("NCH", "OIH", "NCH"))
    return y + b[None, :, None]


def _encoder_layer(params: dict, i: int, x: jax.Array, config: WhisperEncoderConfig) -> jax.Array:
    pre = f"layers.{i}."
    h = L.layer_norm(x, params[pre + "self_attn_layer_norm.weight"],
                     params[pre + "self_attn_layer_norm.bias"], _LN_EPS)
    a = pre + "self_attn."
    # HF scales q before q k^T instead of scaling the scores: the same maths up to rounding.
    h = L.multi_head_attention(
        h, h,
        params[a + "q_proj.weight"], params[a + "q_proj.bias"],
        params[a + "k_proj.weight"], None,
        params[a + "v_proj.weight"], params[a + "v_proj.bias"],
        params[a + "out_proj.weight"], params[a + "out_proj.bias"],
        config.encoder_attention_heads)
    x = x + h
    h = L.layer_norm(x, params[pre + "final_layer_norm.weight"],
                     params[pre + "final_layer_norm.bias"], _LN_EPS)
    h = L.gelu_exact(L.linear(h, params[pre + "fc1.weight"], params[pre + "fc1.bias"]))
    return x + L.linear(h, params[pre + "fc2.weight"], params[pre + "fc2.bias"])


def forward(params: dict, input_features: jax.Array,
            config: WhisperEncoderConfig = WhisperEncoderConfig(),
            output_hidden_states: bool = False) -> jax.Array | tuple:
    """input_features [B, num_mel_bins, 2*max_source_positions] log-mel -> [B, 1500, d_model]
    (last_hidden_state), and with ``output_hidden_states`` the pair (last_hidden_state,
    hidden_states) as HF's: the embeddings, then each layer's output, the last one replaced by
    the final LayerNorm's (so hidden_states[-1] is last_hidden_state): encoder_layers + 1."""
    expect = (config.num_mel_bins, config.num_frames)
    if tuple(input_features.shape[1:]) != expect:
        raise ValueError(f"Whisper encoder: input_features has shape "
                         f"{tuple(input_features.shape)}, expected [B, {expect[0]}, {expect[1]}]; "
                         f"pad or trim the log-mel spectrogram to {expect[1]} frames")
    x = L.gelu_exact(_conv1d(input_features, params["conv1.weight"], params["conv1.bias"], 1))
    x = L.gelu_exact(_conv1d(x, params["conv2.weight"], params["conv2.bias"], 2))
    x = jnp.transpose(x, (0, 2, 1)) + params["embed_positions.weight"]
    states = [x]
    for i in range(config.encoder_layers):
        x = _encoder_layer(params, i, x, config)
        states.append(x)
    x = L.layer_norm(x, params["layer_norm.weight"], params["layer_norm.bias"], _LN_EPS)
    if output_hidden_states:
        return x, tuple(states[:-1]) + (x,)
    return x


PRESETS = {"base": WhisperEncoderConfig.base, "tiny": WhisperEncoderConfig.tiny}


def trace_spec(preset: str = "base", batch: int = 1, **overrides):
    """What `rockjit trace models.whisper:trace_spec [preset=tiny] [field=value ...]` traces:
    forward on a [batch, 80, 3000] log-mel at the preset config with `overrides` applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown Whisper preset {preset!r}; choose one of {sorted(PRESETS)}")
    config = configure(PRESETS[preset](), overrides)
    feats = jax.ShapeDtypeStruct((batch, config.num_mel_bins, config.num_frames), jnp.float32)
    return encoder_spec(forward, config, expected_shapes(config), feats)
