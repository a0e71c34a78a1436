"""`rockjit convert ctranslate2 SRC -o OUT`: help, a conversion, and its error exits."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ct2_writer import model_bin_bytes, whisper_ct2_variables, write_model_bin
from safetensors.numpy import load_file

from rockjit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def rockjit_cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "rockjit", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_convert_help_in_subprocess() -> None:
    r = rockjit_cli("convert", "ctranslate2", "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: rockjit convert ctranslate2" in r.stdout
    assert "-o OUTPUT" in r.stdout and "WhisperSpec" in r.stdout
    r = rockjit_cli("--help")
    assert r.returncode == 0 and "convert" in r.stdout


def _tiny_whisper_state() -> dict[str, np.ndarray]:
    """HF-named tensors of a 1+1-layer Whisper (d=16, 2 heads, vocab 11), drawn from a seed."""
    rng = np.random.default_rng(0)
    d, f, v = 16, 24, 11
    sd = {"model.encoder.conv1.weight": (d, 4, 3), "model.encoder.conv1.bias": (d,),
          "model.encoder.conv2.weight": (d, d, 3), "model.encoder.conv2.bias": (d,),
          "model.encoder.embed_positions.weight": (6, d),
          "model.decoder.embed_tokens.weight": (v, d),
          "model.decoder.embed_positions.weight": (5, d)}
    for stack, attns in (("encoder", ("self_attn",)), ("decoder", ("self_attn", "encoder_attn"))):
        pre = f"model.{stack}.layers.0."
        for a in attns:
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                sd[pre + f"{a}.{p}.weight"] = (d, d)
                if p != "k_proj":
                    sd[pre + f"{a}.{p}.bias"] = (d,)
            sd[pre + f"{a}_layer_norm.weight"] = sd[pre + f"{a}_layer_norm.bias"] = (d,)
        sd[pre + "final_layer_norm.weight"] = sd[pre + "final_layer_norm.bias"] = (d,)
        sd[pre + "fc1.weight"], sd[pre + "fc1.bias"] = (f, d), (f,)
        sd[pre + "fc2.weight"], sd[pre + "fc2.bias"] = (d, f), (d,)
        sd[f"model.{stack}.layer_norm.weight"] = sd[f"model.{stack}.layer_norm.bias"] = (d,)
    return {k: rng.standard_normal(s).astype(np.float16) for k, s in sd.items()}


def test_convert_writes_hf_names(tmp_path, capsys) -> None:
    sd = _tiny_whisper_state()
    src = write_model_bin(tmp_path / "model.bin", whisper_ct2_variables(sd, 1, 1, 2),
                          {"decoder/projection/weight": "decoder/embeddings/weight"})
    out = tmp_path / "out" / "whisper.safetensors"
    assert main(["convert", "ctranslate2", str(tmp_path), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    got = load_file(str(out))
    assert set(got) == set(sd)
    for k in sd:
        np.testing.assert_array_equal(got[k], sd[k], err_msg=k)
    assert not [p for p in out.parent.iterdir() if p != out]  # no temp file left behind
    assert main(["convert", "ctranslate2", str(src), "-o", str(out), "--dtype", "float32"]) == 0
    assert load_file(str(out))["model.encoder.conv1.weight"].dtype == np.float32


def test_convert_errors(tmp_path, capsys) -> None:
    sd = _tiny_whisper_state()
    data = model_bin_bytes(whisper_ct2_variables(sd, 1, 1, 2))
    bad = tmp_path / "model.bin"
    bad.write_bytes(data[:-100])
    out = tmp_path / "o.safetensors"
    assert main(["convert", "ctranslate2", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rockjit convert: CTranslate2 model ") and str(bad) in err
    assert "truncated" in err and not out.exists()
    assert main(["convert", "ctranslate2", str(tmp_path / "nope.bin"), "-o", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # -o is required
        main(["convert", "ctranslate2", str(bad)])
    assert e.value.code == 2
