"""The README's main job, `examples/run_model.py`, on each encoder at a small config: seeded
weights written and loaded through the HF-name loader, traced, then run

* on the IR interpreter and checked against jax.jit on CPU (the script exits non-zero above
  its REL_TOL = 1e-5 relative error), and
* on the strict simulator (the default backend), checked element by element against the
  graph's end-to-end fp16 error bound (rockjit.oracle.tolerance.graph_bound, printed by the
  script and turned into its exit code). REL_TOL does not apply there: fp16 is ~1e-3.
"""
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
# SigLIP returns (last_hidden_state, pooler_output): the pooler is the M = 1 probe-query
# attention head, checked like every other output
OUTPUTS = {"siglip": 2, "modernbert": 1, "whisper-tiny": 1}


def _run(model: str, backend: str, tmp_path: Path, capsys) -> tuple[int, str]:
    rc = run_model.main(["--model", model, "--backend", backend, "--seq-len", "24",
                         "--out", str(tmp_path), "--set", *SMALL[model]])
    out = capsys.readouterr().out
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    assert re.search(r"^IR\s+\d+ ops$", out, re.M), out
    assert re.search(rf"^backend\s+{backend}$", out, re.M), out
    return rc, out


def _rel_errors(out: str) -> list[float]:
    return [float(e) for e in re.findall(r"max \|ours - jax\| / max \|jax\| = (\S+)", out)]


@pytest.mark.parametrize("model", sorted(SMALL))
def test_main_job_interpreter_matches_jax(model: str, tmp_path: Path, capsys) -> None:
    rc, out = _run(model, "interpreter", tmp_path, capsys)
    errs = _rel_errors(out)
    assert rc == 0, out
    assert len(errs) == OUTPUTS[model], out
    assert max(errs) <= run_model.REL_TOL, out


@pytest.mark.parametrize("model", sorted(SMALL))
def test_main_job_sim_within_fp16_bound(model: str, tmp_path: Path, capsys) -> None:
    rc, out = _run(model, "sim", tmp_path, capsys)
    errs = _rel_errors(out)
    ratios = [float(r) for r in re.findall(r"worst \|ours - jax\| / fp16 bound = (\S+)", out)]
    widths = [float(w) for w in re.findall(r"fp16 bound: max (\S+) of max \|jax\|", out)]
    assert len(errs) == len(ratios) == len(widths) == OUTPUTS[model], out
    assert rc == 0, out
    assert all(r <= 1.0 for r in ratios), out
    # an fp16 program: a real (non-zero) error, far above the interpreter's REL_TOL, which
    # therefore must not be what the script holds the simulator to
    assert min(errs) > run_model.REL_TOL, out
    # the bound is tight enough to reject a wrong answer: a 5 % error anywhere would fail it
    assert max(widths) < 0.05, out
    assert "within the bound" in out and "OUT OF" not in out, out
    stats = dict(re.findall(r"(\w+)=(\d+)", out.split("stats", 1)[1]))
    assert int(stats["jobs"]) > 0 and int(stats["macs"]) > 0, out


def test_main_job_refuses_unknown_config_field(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        run_model.main(["--model", "siglip", "--set", "num_layers=1"])
    assert e.value.code == 2
    assert "SiglipVisionConfig has no field(s) ['num_layers']" in capsys.readouterr().err
