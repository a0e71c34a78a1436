"""The safetensors loader: every expected name and shape is checked, errors name the culprit."""
from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from models import modernbert, siglip, whisper
from models.weights import check_params, load_safetensors
from rockjit.errors import WeightError

SMALL = {
    "siglip": (siglip, siglip.SiglipVisionConfig(hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4,
                                                 image_size=32, patch_size=16)),
    "modernbert": (modernbert, modernbert.ModernBertConfig(vocab_size=40, hidden_size=32,
                                                           intermediate_size=48,
                                                           num_hidden_layers=4,
                                                           num_attention_heads=4)),
    "whisper": (whisper, whisper.WhisperEncoderConfig(d_model=32, encoder_layers=2,
                                                      encoder_attention_heads=4,
                                                      encoder_ffn_dim=64,
                                                      max_source_positions=10)),
}


def _write(tmp_path, tensors) -> Path:
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    return path


def _load_error(tmp_path, mod, cfg, tensors) -> tuple[str, Path]:
    """(the WeightError message, the file) of loading ``tensors`` for ``cfg``."""
    path = _write(tmp_path, tensors)
    with pytest.raises(WeightError) as info:
        mod.load_params(path, cfg)
    return str(info.value), path


def _tensors(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_roundtrip_loads_every_tensor(tmp_path, name):
    mod, cfg = SMALL[name]
    tensors = _tensors(mod.expected_shapes(cfg))
    path = _write(tmp_path, tensors)
    params = mod.load_params(path, cfg)
    assert set(params) == set(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(params[k], v)
        assert params[k].dtype == np.float32


@pytest.mark.parametrize("name", sorted(SMALL))
def test_missing_tensor_names_key_and_shape(tmp_path, name):
    mod, cfg = SMALL[name]
    shapes = mod.expected_shapes(cfg)
    tensors = _tensors(shapes)
    victim = sorted(shapes)[len(shapes) // 2]
    del tensors[victim]
    msg, path = _load_error(tmp_path, mod, cfg, tensors)
    assert f"'{victim}'" in msg and str(shapes[victim]) in msg and str(path) in msg


@pytest.mark.parametrize("name,victim,wrong", [
    ("siglip", "encoder.layers.1.layer_norm1.weight", "encoder.layers.1.layernorm1.weight"),
    ("modernbert", "layers.2.attn.Wqkv.weight", "layers.2.attn.Wqkv_weight"),
    ("whisper", "layers.0.self_attn.q_proj.bias", "layers.0.self_attn.query.bias"),
])
def test_misnamed_tensor_names_the_closest_present(tmp_path, name, victim, wrong):
    mod, cfg = SMALL[name]
    shapes = mod.expected_shapes(cfg)
    tensors = _tensors(shapes)
    tensors[wrong] = tensors.pop(victim)
    msg, _ = _load_error(tmp_path, mod, cfg, tensors)
    assert f"missing tensor '{victim}'" in msg
    assert str(shapes[victim]) in msg
    assert f"closest name present is '{wrong}'" in msg


@pytest.mark.parametrize("name", sorted(SMALL))
def test_wrong_shape_names_key_expected_and_got(tmp_path, name):
    mod, cfg = SMALL[name]
    shapes = mod.expected_shapes(cfg)
    tensors = _tensors(shapes)
    victim = [k for k, s in shapes.items() if len(s) == 2][-1]
    bad = (shapes[victim][0] + 1, shapes[victim][1])
    tensors[victim] = np.zeros(bad, np.float32)
    msg, _ = _load_error(tmp_path, mod, cfg, tensors)
    assert f"'{victim}'" in msg
    assert re.search(rf"has shape \({bad[0]}, {bad[1]}\)", msg)
    assert f"expects {shapes[victim]}" in msg


def test_config_mismatch_is_a_shape_error(tmp_path):
    # A 224-px checkpoint loaded for a 512-px config: the position table is the tensor at fault.
    mod, cfg = SMALL["siglip"]
    tensors = _tensors(mod.expected_shapes(cfg))
    path = _write(tmp_path, tensors)
    with pytest.raises(WeightError, match="embeddings.position_embedding.weight"):
        mod.load_params(path, siglip.SiglipVisionConfig(**{**cfg.__dict__, "image_size": 64}))


@pytest.mark.parametrize("name,prefix,extra", [
    ("siglip", "vision_model.", "text_model.embeddings.token_embedding.weight"),
    ("modernbert", "model.", "decoder.weight"),
    ("whisper", "model.encoder.", "model.decoder.embed_tokens.weight"),
])
def test_full_checkpoint_prefix_is_detected(tmp_path, name, prefix, extra):
    mod, cfg = SMALL[name]
    tensors = _tensors(mod.expected_shapes(cfg))
    stored = {prefix + k: v for k, v in tensors.items()}
    stored[extra] = np.zeros((3, 4), np.float32)  # a tensor of another part of the model
    path = _write(tmp_path, stored)
    params = mod.load_params(path, cfg)
    assert set(params) == set(tensors)
    np.testing.assert_array_equal(params[sorted(tensors)[0]], tensors[sorted(tensors)[0]])
    # An explicit wrong prefix is reported, not guessed around.
    with pytest.raises(WeightError, match="under prefix 'nope.'"):
        mod.load_params(path, cfg, prefix="nope.")


def test_ambiguous_prefix_is_an_error(tmp_path):
    mod, cfg = SMALL["whisper"]
    tensors = _tensors(mod.expected_shapes(cfg))
    stored = {p + k: v for p in ("a.", "b.") for k, v in tensors.items()}
    path = _write(tmp_path, stored)
    with pytest.raises(WeightError, match="several prefixes"):
        mod.load_params(path, cfg)
    assert set(mod.load_params(path, cfg, prefix="b.")) == set(tensors)


def test_bf16_checkpoint_is_widened_to_fp32(tmp_path):
    mod, cfg = SMALL["whisper"]
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in _tensors(mod.expected_shapes(cfg)).items()}
    path = _write(tmp_path, tensors)
    params = mod.load_params(path, cfg)
    k = "conv1.weight"
    assert params[k].dtype == np.float32
    np.testing.assert_array_equal(params[k], tensors[k].astype(np.float32))


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(WeightError, match="does not exist"):
        load_safetensors(tmp_path / "nothing.safetensors", {"a": (1,)})


def test_check_params_on_in_memory_dicts():
    expected = {"x.weight": (2, 3), "x.bias": (2,)}
    check_params({"x.weight": np.zeros((2, 3)), "x.bias": np.zeros(2), "other": 1}, expected)
    with pytest.raises(WeightError, match=r"'x.bias' \(expected shape \(2,\)\).*'x.biass'"):
        check_params({"x.weight": np.zeros((2, 3)), "x.biass": np.zeros(2)}, expected)
    with pytest.raises(WeightError, match=r"'x.weight' has shape \(3, 2\).*expects \(2, 3\)"):
        check_params({"x.weight": np.zeros((3, 2)), "x.bias": np.zeros(2)}, expected)
