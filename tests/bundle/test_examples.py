"""The examples a user copies, at reduced size, in a subprocess: each loads weights through the
checked loader, compiles, runs, compares with JAX (cosine, and every element within the
graph's fp16 bound: --check-bound makes the script's exit status depend on it), saves a bundle
and runs it back bit-identically. And run_model.py's flag and weight refusals."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SMALL = {
    "siglip.py": ["--layers", "1", "--image-size", "48", "--set", "hidden_size=64",
                  "intermediate_size=96", "num_attention_heads=4"],
    "modernbert.py": ["--layers", "2", "--seq-len", "24", "--pad", "4", "--set",
                      "vocab_size=101", "hidden_size=64", "intermediate_size=96",
                      "num_attention_heads=4", "local_attention=8"],
}


def _script(name: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "examples" / name), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_example_at_reduced_size(name: str, tmp_path: Path) -> None:
    r = _script(name, [*SMALL[name], "--backend", "sim", "--check-bound", "--runs", "2",
                       "--out", str(tmp_path)], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    cosines = [float(c) for c in re.findall(r"(?:state|output) (\d\.\d+)", out)]
    assert cosines and min(cosines) > 0.999, out
    ratios = [float(x) for x in re.findall(r"fp16 bound = (\S+)", out)]
    assert ratios and max(ratios) <= 1.0, out
    assert re.search(r"^steady\s+\S+ s per forward", out, re.M), out
    assert "bit-identical" in out, out
    assert (tmp_path / name.replace(".py", ".rjb")).stat().st_size > 0


def test_example_refuses_a_missing_weights_file(tmp_path: Path) -> None:
    r = _script("siglip.py", ["--weights", str(tmp_path / "missing.safetensors")], tmp_path)
    assert r.returncode == 1
    assert "WeightError" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr


def test_run_model_refuses_bad_flags_and_missing_weights(tmp_path: Path) -> None:
    r = _script("run_model.py", ["--backend", "gpu"], tmp_path)
    assert r.returncode == 2
    assert "unknown backend 'gpu'" in r.stderr and "Traceback" not in r.stderr
    r = _script("run_model.py", ["--weights", str(tmp_path / "missing.safetensors")], tmp_path)
    assert r.returncode == 1
    assert "WeightError" in r.stderr and "Traceback" not in r.stderr
