"""The README's main job, `examples/run_model.py`, on each encoder at a small config: seeded
weights written and loaded through the HF-name loader, traced, run on the IR interpreter and
checked against jax.jit on CPU (the script exits non-zero above 1e-5 relative error)."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_example():
    spec = importlib.util.spec_from_file_location("run_model", ROOT / "examples" / "run_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


run_model = _load_example()

SMALL = {
    "siglip": ["hidden_size=64", "intermediate_size=96", "num_hidden_layers=2",
               "num_attention_heads=4", "image_size=48"],
    "modernbert": ["vocab_size=101", "hidden_size=64", "intermediate_size=96",
                   "num_hidden_layers=4", "num_attention_heads=4", "local_attention=8"],
    "whisper-tiny": ["d_model=64", "encoder_layers=2", "encoder_attention_heads=4",
                     "encoder_ffn_dim=96", "num_mel_bins=16", "max_source_positions=30"],
}


@pytest.mark.parametrize("model", sorted(SMALL))
def test_main_job_matches_jax(model: str, tmp_path: Path, capsys) -> None:
    rc = run_model.main(["--model", model, "--seq-len", "24", "--out", str(tmp_path),
                         "--set", *SMALL[model]])
    out = capsys.readouterr().out
    errs = [float(e) for e in re.findall(r"max \|ours - jax\| / max \|jax\| = (\S+)", out)]
    assert rc == 0, out
    assert errs and max(errs) <= run_model.REL_TOL, out
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    assert re.search(r"^IR\s+\d+ ops$", out, re.M), out


def test_main_job_refuses_unknown_config_field(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        run_model.main(["--model", "siglip", "--set", "num_layers=1"])
    assert e.value.code == 2
    assert "SiglipVisionConfig has no field(s) ['num_layers']" in capsys.readouterr().err
