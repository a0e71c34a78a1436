"""CTranslate2 ``WhisperSpec`` -> transformers ``WhisperForConditionalGeneration`` tensor names.

CTranslate2 stores the Whisper checkpoint with its own layer names and two fusions, undone here:

* self-attention ``linear_0`` is q, k and v stacked along the output axis ([3d, d]);
* cross-attention ``linear_0`` is q alone and ``linear_1`` is k and v stacked ([2d, d]).

Whisper's k_proj has no bias; the fused bias carries zeros in its k rows, which we check (a
non-zero k bias could not be written under HF's names without changing the model's maths).
The output projection is tied to the token embedding (a CTranslate2 alias); HF ties
``proj_out.weight`` to ``model.decoder.embed_tokens.weight`` itself, so only the latter is
written.  Tensors keep the stored dtype (fp16 for the published conversions).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from .ctranslate2 import CT2Model, ModelFileError

SPEC_NAME = "WhisperSpec"
# ctranslate2's Activation enum value for exact (erf) GELU, Whisper's activation
_ACTIVATION_GELU = 3


def _layer_count(model: CT2Model, stack: str) -> int:
    found = {int(m.group(1)) for k in model.variables
             if (m := re.match(rf"{stack}/layer_(\d+)/", k))}
    if found != set(range(len(found))) or not found:
        raise ModelFileError(f"{model.source}: {stack} layers {sorted(found)} are not "
                             f"numbered 0..N-1")
    return len(found)


def _split_rows(model: CT2Model, name: str, parts: int) -> list[np.ndarray]:
    t = model.get(name)
    if t.shape[0] % parts:
        raise ModelFileError(f"{model.source}: fused '{name}' has {t.shape[0]} rows, not a "
                             f"multiple of {parts}")
    return np.split(t, parts, axis=0)


def _check_zero_k_bias(model: CT2Model, name: str, k_bias: np.ndarray) -> None:
    if np.any(k_bias != 0):
        raise ModelFileError(
            f"{model.source}: '{name}' has a non-zero k-projection bias (max |b| = "
            f"{float(np.max(np.abs(k_bias.astype(np.float32)))):.3g}); Whisper's k_proj has no "
            f"bias, so this is not a Whisper checkpoint HF names can describe")


def _norm(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[dst + ".weight"] = model.get(src + "/gamma")
    out[dst + ".bias"] = model.get(src + "/beta")


def _linear(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[dst + ".weight"] = model.get(src + "/weight")
    out[dst + ".bias"] = model.get(src + "/bias")


def _self_attention(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    qw, kw, vw = _split_rows(model, src + "/linear_0/weight", 3)
    qb, kb, vb = _split_rows(model, src + "/linear_0/bias", 3)
    _check_zero_k_bias(model, src + "/linear_0/bias", kb)
    out[dst + ".q_proj.weight"], out[dst + ".q_proj.bias"] = qw, qb
    out[dst + ".k_proj.weight"] = kw
    out[dst + ".v_proj.weight"], out[dst + ".v_proj.bias"] = vw, vb
    _linear(model, src + "/linear_1", dst + ".out_proj", out)


def _cross_attention(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    _linear(model, src + "/linear_0", dst + ".q_proj", out)
    kw, vw = _split_rows(model, src + "/linear_1/weight", 2)
    kb, vb = _split_rows(model, src + "/linear_1/bias", 2)
    _check_zero_k_bias(model, src + "/linear_1/bias", kb)
    out[dst + ".k_proj.weight"] = kw
    out[dst + ".v_proj.weight"], out[dst + ".v_proj.bias"] = vw, vb
    _linear(model, src + "/linear_2", dst + ".out_proj", out)


def _layer(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray], cross: bool
           ) -> None:
    """One pre-norm layer: self-attention, then (a decoder layer, ``cross``) attention to the
    encoder output, then the FFN."""
    _norm(model, src + "/self_attention/layer_norm", dst + ".self_attn_layer_norm", out)
    _self_attention(model, src + "/self_attention", dst + ".self_attn", out)
    if cross:
        _norm(model, src + "/attention/layer_norm", dst + ".encoder_attn_layer_norm", out)
        _cross_attention(model, src + "/attention", dst + ".encoder_attn", out)
    _norm(model, src + "/ffn/layer_norm", dst + ".final_layer_norm", out)
    _linear(model, src + "/ffn/linear_0", dst + ".fc1", out)
    _linear(model, src + "/ffn/linear_1", dst + ".fc2", out)


def _check_flags(model: CT2Model) -> None:
    """Refuse spec options that change the maths away from Whisper's (HF has no name for them)."""
    want = {"encoder/activation": _ACTIVATION_GELU, "decoder/activation": _ACTIVATION_GELU,
            "decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0,
            "decoder/start_from_zero_embedding": 0}
    for name, value in want.items():
        if name in model.variables or name in model.aliases:
            got = model.scalar(name)
            if got != value:
                raise ModelFileError(f"{model.source}: '{name}' is {got}, Whisper's is {value}; "
                                     f"this checkpoint does not compute what HF's Whisper does")


def whisper_config(model: CT2Model) -> dict[str, Any]:
    """transformers.WhisperConfig keyword arguments read off the tensor shapes."""
    if model.spec != SPEC_NAME:
        raise ModelFileError(f"{model.source}: spec is '{model.spec}', expected '{SPEC_NAME}'")
    vocab, d = model.get("decoder/embeddings/weight").shape
    return {
        "vocab_size": int(vocab),
        "d_model": int(d),
        "num_mel_bins": int(model.get("encoder/conv1/weight").shape[1]),
        "encoder_layers": _layer_count(model, "encoder"),
        "decoder_layers": _layer_count(model, "decoder"),
        "encoder_attention_heads": int(model.scalar("encoder/num_heads")),
        "decoder_attention_heads": int(model.scalar("decoder/num_heads")),
        "encoder_ffn_dim": int(model.get("encoder/layer_0/ffn/linear_0/weight").shape[0]),
        "decoder_ffn_dim": int(model.get("decoder/layer_0/ffn/linear_0/weight").shape[0]),
        "max_source_positions": int(model.get("encoder/position_encodings/encodings").shape[0]),
        "max_target_positions": int(model.get("decoder/position_encodings/encodings").shape[0]),
        "activation_function": "gelu",
    }


def whisper_to_hf(model: CT2Model) -> dict[str, np.ndarray]:
    """Every tensor of WhisperForConditionalGeneration's state_dict (bar the tied proj_out)."""
    cfg = whisper_config(model)
    _check_flags(model)
    out: dict[str, np.ndarray] = {}
    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        _linear(model, f"encoder/{conv}", f"{enc}.{conv}", out)
    out[f"{enc}.embed_positions.weight"] = model.get("encoder/position_encodings/encodings")
    for i in range(cfg["encoder_layers"]):
        _layer(model, f"encoder/layer_{i}", f"{enc}.layers.{i}", out, cross=False)
    _norm(model, "encoder/layer_norm", f"{enc}.layer_norm", out)

    out[f"{dec}.embed_tokens.weight"] = model.get("decoder/embeddings/weight")
    out[f"{dec}.embed_positions.weight"] = model.get("decoder/position_encodings/encodings")
    for i in range(cfg["decoder_layers"]):
        _layer(model, f"decoder/layer_{i}", f"{dec}.layers.{i}", out, cross=True)
    _norm(model, "decoder/layer_norm", f"{dec}.layer_norm", out)

    proj = model.get("decoder/projection/weight")
    if proj is not out[f"{dec}.embed_tokens.weight"] and not np.array_equal(
            proj, out[f"{dec}.embed_tokens.weight"]):
        out["proj_out.weight"] = proj  # untied: HF would need tie_word_embeddings=False
    # Decoding hints (which heads align words with time) with no HF tensor: read, not written.
    for name in ("decoder/alignment_heads", "decoder/alignment_layer"):
        if name in model.variables:
            model.get(name)
    left = sorted(set(model.variables) - model.used)
    if left:
        raise ModelFileError(f"{model.source}: {len(left)} variables have no HF Whisper name "
                             f"(first: {left[:3]}); this converter does not know this spec "
                             f"revision ({model.revision})")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
