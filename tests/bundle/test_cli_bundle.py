"""The bundle verbs: compile (a TraceSpec target or a model preset), run, inspect, bench; each
verb's --help; refusals as one-line messages with exit codes (1: rockjit refused, 2: usage)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import rockjit
from rockjit.cli import main
from rockjit.cli.common import EXIT_COMPILE_ERROR, EXIT_OK, EXIT_USAGE

from .bundle_testutil import block, check_against_jax, weights

REPO = Path(__file__).resolve().parents[2]
TARGET = "tests.bundle.cli_targets:block_spec"


@pytest.mark.parametrize("verb", ["compile", "run", "inspect", "bench"])
def test_each_verb_has_help(verb) -> None:
    r = subprocess.run([sys.executable, "-m", "rockjit", verb, "--help"], capture_output=True,
                       text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"usage: rockjit {verb}" in r.stdout


@pytest.fixture(scope="module")
def compiled_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    out = d / "block.rjb"
    assert main(["compile", TARGET, "--set", "rows=8", "-o", str(out)]) == EXIT_OK
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    np.savez(d / "in.npz", x=x)
    return d, out, x


def test_compile_then_run_matches_jax(compiled_bundle, capsys) -> None:
    d, out, x = compiled_bundle
    capsys.readouterr()
    assert main(["run", str(out), str(d / "in.npz"), "--backend", "sim", "-n", "3",
                 "-o", str(d / "out.npz")]) == EXIT_OK
    text = capsys.readouterr().out
    assert "first call" in text and "steady" in text and "per forward" in text
    got = dict(np.load(d / "out.npz"))
    assert sorted(got) == ["probs", "y"]
    # against JAX on the CPU, within the graph's fp16 bound
    p = weights()
    c = rockjit.compile(block, resident_argnums=0, backend="sim").compiled(p, x)
    check_against_jax(c, p, x, got)
    # the same program as an in-process export of the same spec: the same bits
    e = rockjit.export(block, p, jax.ShapeDtypeStruct((8, 64), jnp.float32),
                       resident_argnums=0, backend="sim")
    want = e(p, x)
    for k in got:
        assert np.array_equal(got[k], want[k])


def test_inspect_prints_manifest_stats_steps_and_placement(compiled_bundle, capsys) -> None:
    d, out, x = compiled_bundle
    capsys.readouterr()
    assert main(["inspect", str(out)]) == EXIT_OK
    text = capsys.readouterr().out
    for section in ("# manifest", "# stats", "# steps", "# modelled", "# placement"):
        assert section in text
    assert "chip profile  rk3588" in text and "input         x: float32[8, 64]" in text
    npu_steps = [ln for ln in text.splitlines() if " npu  " in ln and " job(s) " in ln]
    assert npu_steps and all("bundle_testutil.py:" in ln for ln in npu_steps)
    # why the row max stays on the host: the modelled cost of both ways (8 x 64 scores)
    assert any("= reduce_max" in ln and "host row max (rockjit.cost)" in ln
               for ln in text.splitlines()), text
    # each conv/matmul tiling, and whether the cost model overruled the fixed rule
    assert "# conv/matmul tilings, by modelled cost" in text and "modelled" in text
    assert main(["inspect", str(out), "--only", "stats"]) == EXIT_OK
    only = capsys.readouterr().out
    assert "# stats" in only and "# steps" not in only


def test_inspect_prints_the_modelled_time_per_step(compiled_bundle, capsys) -> None:
    """The manifest keeps the cost model's estimate, so a bundle shows it without the compiler:
    one row per modelled step, a total that is their sum, and the same estimate the program
    gives in-process (``stats()['modelled_ms']``) for the same function and weights."""
    d, out, x = compiled_bundle
    capsys.readouterr()
    assert main(["inspect", str(out), "--only", "modelled"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "# modelled time per step at NPU 600 MHz" in text and "not a measurement" in text
    lines = text.splitlines()
    rows = [ln.split() for ln in lines if ln[:5].strip().isdigit()]
    assert rows and all(r[1] in ("npu", "host") for r in rows)
    assert any(r[1] == "npu" for r in rows)
    total = next(ln for ln in lines if ln.startswith("total"))
    assert "modelled ms per forward" in total
    t = float(total.split()[1])
    assert t == pytest.approx(sum(float(r[2]) for r in rows), rel=1e-3, abs=1e-3)
    c = rockjit.compile(block, resident_argnums=0, backend="sim").compiled(weights(), x)
    assert t == pytest.approx(c.stats()["modelled_ms"], rel=1e-3)


def test_bench_prints_median_and_min(compiled_bundle, capsys) -> None:
    d, out, x = compiled_bundle
    capsys.readouterr()
    assert main(["bench", str(out), "-n", "3", "--backend", "sim"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "median" in text and "min" in text and "over 3 run(s)" in text


def test_weights_fill_an_abstract_spec(tmp_path, capsys) -> None:
    target = "tests.bundle.cli_targets:abstract_block_spec"
    save_file(weights(), str(tmp_path / "w.safetensors"))
    assert main(["compile", target, "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "a.rjb")]) == EXIT_OK
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    with rockjit.load(tmp_path / "a.rjb", backend="sim") as b:
        got = b(x)
    c = rockjit.compile(block, resident_argnums=0, backend="sim").compiled(weights(), x)
    check_against_jax(c, weights(), x, got)


def test_usage_and_refusals(compiled_bundle, tmp_path, capsys) -> None:
    d, out, x = compiled_bundle
    capsys.readouterr()
    # abstract weights without --weights: a usage error naming the fix
    assert main(["compile", "tests.bundle.cli_targets:abstract_block_spec",
                 "-o", str(tmp_path / "a.rjb")]) == EXIT_USAGE
    assert "pass --weights FILE" in capsys.readouterr().err
    # a preset needs weights
    assert main(["compile", "siglip", "-o", str(tmp_path / "s.rjb")]) == EXIT_USAGE
    assert "needs --weights FILE" in capsys.readouterr().err
    # a missing weights file is a WeightError (exit 1), not a traceback
    assert main(["compile", "siglip", "--weights", str(tmp_path / "nope.safetensors"),
                 "-o", str(tmp_path / "s.rjb")]) == EXIT_COMPILE_ERROR
    assert "WeightError" in capsys.readouterr().err
    # inputs of the wrong shape: the bundle refuses (exit 1)
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 64), np.float32))
    assert main(["run", str(out), str(tmp_path / "bad.npz"), "--backend", "sim"]) == \
        EXIT_COMPILE_ERROR
    assert "BundleError: input x" in capsys.readouterr().err
    # inputs under other names: usage
    np.savez(tmp_path / "named.npz", pixels=x)
    assert main(["run", str(out), str(tmp_path / "named.npz"), "--backend", "sim"]) == EXIT_USAGE
    assert "takes ['x']" in capsys.readouterr().err
    # a damaged bundle
    bad = tmp_path / "bad.rjb"
    bad.write_bytes(out.read_bytes()[:1000])
    for verb in (["run", str(bad), str(d / "in.npz")], ["inspect", str(bad)],
                 ["bench", str(bad)]):
        assert main(verb) == EXIT_COMPILE_ERROR
        assert "BundleError" in capsys.readouterr().err


def test_compile_a_preset_at_reduced_size(tmp_path, capsys) -> None:
    """whisper-tiny with one small layer and seeded weights: compile, run, compare with JAX."""
    from models.presets import MODELS

    sets = ["encoder_layers=1", "d_model=64", "encoder_attention_heads=2",
            "encoder_ffn_dim=128", "max_source_positions=16"]
    out = tmp_path / "w.rjb"
    assert main(["compile", "whisper-tiny", "--seeded-weights", "--out-dir", str(tmp_path),
                 "--set", *sets, "-o", str(out)]) == EXIT_OK
    assert "bundle" in capsys.readouterr().out
    entry = MODELS["whisper-tiny"]
    from rockjit.cli.common import parse_assignments

    overrides = parse_assignments(sets)
    config = entry.configure(overrides)
    from models.presets import default_weights

    params = entry.module.load_params(default_weights("whisper-tiny", entry.module, config,
                                                      tmp_path, overrides), config)
    x, = entry.make_inputs(np.random.default_rng(1), config, 0)
    with rockjit.load(out, backend="sim") as b:
        got = np.asarray(b(x))
    from rockjit.oracle import tolerance as T

    fn = entry.forward(config)
    c = rockjit.compile(fn, resident_argnums=0, backend="sim").compiled(params, x)
    ref = np.asarray(jax.jit(fn)(params, x), np.float64)
    bound = T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref)
    T.check(got, ref, bound, "whisper-tiny (1 small layer) from a CLI-compiled bundle")
