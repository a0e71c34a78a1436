"""A tiny writer of CTranslate2 model.bin files for the tests, following the format's public
description (ctranslate2's specs/model_spec.py) independently of rockjit's reader, and a
builder of a small WhisperSpec variable set from an HF WhisperForConditionalGeneration the way
ctranslate2's transformers converter fuses it (q|k|v rows, zero k bias)."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Mapping

import numpy as np

TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}


def _string(s: str) -> bytes:
    b = s.encode("utf-8") + b"\0"
    return struct.pack("<H", len(b)) + b


def model_bin_bytes(variables: Mapping[str, np.ndarray], aliases: Mapping[str, str] = {},
                    spec: str = "WhisperSpec", revision: int = 3, version: int = 6) -> bytes:
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision),
           struct.pack("<I", len(variables))]
    for name, value in variables.items():
        value = np.asarray(value)
        out += [_string(name), struct.pack("<B", value.ndim),
                struct.pack("<" + "I" * value.ndim, *value.shape),
                struct.pack("<BI", TYPE_IDS[value.dtype.name], value.nbytes),
                np.ascontiguousarray(value).tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def write_model_bin(path: Path, variables: Mapping[str, np.ndarray],
                    aliases: Mapping[str, str] = {}, **kw) -> Path:
    path.write_bytes(model_bin_bytes(variables, aliases, **kw))
    return path


def whisper_ct2_variables(sd: Mapping[str, np.ndarray], encoder_layers: int,
                          decoder_layers: int, heads: int) -> dict[str, np.ndarray]:
    """CTranslate2 WhisperSpec variables from an HF state dict (numpy, fp16)."""
    h = lambda k: np.asarray(sd[k], np.float16)  # noqa: E731
    d = sd["model.decoder.embed_tokens.weight"].shape[1]
    zeros = np.zeros(d, np.float16)
    v: dict[str, np.ndarray] = {
        "decoder/activation": np.int8(3), "decoder/alibi": np.int8(0),
        "decoder/alignment_heads": np.int16(1), "decoder/alignment_layer": np.int16(-1),
        "decoder/num_heads": np.int16(heads), "decoder/pre_norm": np.int8(1),
        "decoder/scale_embeddings": np.int8(0), "decoder/start_from_zero_embedding": np.int8(0),
        "encoder/activation": np.int8(3), "encoder/num_heads": np.int16(heads),
    }

    def norm(src: str, dst: str) -> None:
        v[dst + "/gamma"], v[dst + "/beta"] = h(src + ".weight"), h(src + ".bias")

    def lin(src: str, dst: str) -> None:
        v[dst + "/weight"], v[dst + "/bias"] = h(src + ".weight"), h(src + ".bias")

    def self_attn(src: str, dst: str) -> None:
        v[dst + "/linear_0/weight"] = np.concatenate(
            [h(src + ".q_proj.weight"), h(src + ".k_proj.weight"), h(src + ".v_proj.weight")])
        v[dst + "/linear_0/bias"] = np.concatenate(
            [h(src + ".q_proj.bias"), zeros, h(src + ".v_proj.bias")])
        lin(src + ".out_proj", dst + "/linear_1")

    def layer(s: str, t: str, cross: bool) -> None:
        norm(s + ".self_attn_layer_norm", t + "/self_attention/layer_norm")
        self_attn(s + ".self_attn", t + "/self_attention")
        if cross:
            norm(s + ".encoder_attn_layer_norm", t + "/attention/layer_norm")
            lin(s + ".encoder_attn.q_proj", t + "/attention/linear_0")
            v[t + "/attention/linear_1/weight"] = np.concatenate(
                [h(s + ".encoder_attn.k_proj.weight"), h(s + ".encoder_attn.v_proj.weight")])
            v[t + "/attention/linear_1/bias"] = np.concatenate(
                [zeros, h(s + ".encoder_attn.v_proj.bias")])
            lin(s + ".encoder_attn.out_proj", t + "/attention/linear_2")
        norm(s + ".final_layer_norm", t + "/ffn/layer_norm")
        lin(s + ".fc1", t + "/ffn/linear_0")
        lin(s + ".fc2", t + "/ffn/linear_1")

    for conv in ("conv1", "conv2"):
        lin(f"model.encoder.{conv}", f"encoder/{conv}")
    v["encoder/position_encodings/encodings"] = h("model.encoder.embed_positions.weight")
    for i in range(encoder_layers):
        layer(f"model.encoder.layers.{i}", f"encoder/layer_{i}", cross=False)
    norm("model.encoder.layer_norm", "encoder/layer_norm")
    v["decoder/embeddings/weight"] = h("model.decoder.embed_tokens.weight")
    v["decoder/position_encodings/encodings"] = h("model.decoder.embed_positions.weight")
    for i in range(decoder_layers):
        layer(f"model.decoder.layers.{i}", f"decoder/layer_{i}", cross=True)
    norm("model.decoder.layer_norm", "decoder/layer_norm")
    return v
