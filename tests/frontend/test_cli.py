"""`rockjit trace` end to end, in a subprocess like a user runs it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rockjit.cli import main
from rockjit.ir.parser import parse

from .cli_targets import small_mlp

HERE = Path(__file__).parent


def rockjit_cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "rockjit.cli", *argv], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=120)


def test_trace_prints_parseable_ir() -> None:
    r = rockjit_cli("trace", "cli_targets:small_mlp")
    assert r.returncode == 0, r.stderr
    graph = parse(r.stdout)
    assert graph == small_mlp().lower().graph
    assert sorted(graph.params()) == ["fc1.bias", "fc1.weight", "fc2.weight"]
    # the softmax is one fused op in the printed IR (ir/passes/fuse.py)
    assert "dot_general" in r.stdout and "softmax(" in r.stdout


def test_trace_stats_counts_ops() -> None:
    r = rockjit_cli("trace", "cli_targets:with_values", "--stats")
    assert r.returncode == 0, r.stderr
    ir_text, stats = r.stdout.split("# op counts")
    counts = dict(line.split() for line in stats.strip().splitlines())
    graph = parse(ir_text)
    assert {k: int(v) for k, v in counts.items() if k != "total"} == graph.op_counts()
    assert int(counts["total"]) == len(graph.nodes)
    assert counts["mul"] == "1"


def test_bad_target_in_subprocess_exits_2() -> None:
    r = rockjit_cli("trace", "no_such_module_xyz:f")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.strip() == ("rockjit trace: cannot import module 'no_such_module_xyz': "
                                "ModuleNotFoundError: No module named 'no_such_module_xyz'")


@pytest.mark.parametrize("target,needle", [
    ("no_colon_here", "must look like 'package.module:function'"),
    ("cli_targets:missing", "has no attribute 'missing'"),
    ("cli_targets:NOT_CALLABLE", "is a int, not a callable"),
    ("cli_targets:not_a_spec", "returned str, expected rockjit.api.TraceSpec"),
    ("cli_targets:mlp", "cannot be called with no arguments"),
])
def test_bad_target_is_one_line_and_exit_2(target: str, needle: str, capsys, monkeypatch
                                           ) -> None:
    # In-process (a subprocess per case would cost a jax import each): the CLI resolves
    # modules from the current directory, as `python -m` does.
    monkeypatch.chdir(HERE)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(HERE))])
    assert main(["trace", target]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rockjit trace: ") and needle in lines[0]


def test_unsupported_primitive_reports_and_exits_1() -> None:
    r = rockjit_cli("trace", "cli_targets:unsupported")
    assert r.returncode == 1
    assert "UnsupportedError" in r.stderr and "'cumsum'" in r.stderr


def test_console_script_has_subcommands() -> None:
    # `pip install -e .` puts a `rockjit` script on PATH that dispatches to subcommands.
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "rockjit"]
    assert ep.value == "rockjit.cli:main"
    script = shutil.which("rockjit")
    assert script is not None, "no `rockjit` on PATH: install the package with pip install -e ."
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s+trace\s", r.stdout, re.M), r.stdout  # the verb list
    r = subprocess.run([script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "required: VERB" in r.stderr


def test_python_dash_m_rockjit_is_the_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "rockjit", "trace", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: rockjit trace" in r.stdout
