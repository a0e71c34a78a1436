"""Shared helpers for the lowering tests: the conformance cases and their own reference code."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

CONF = Path(__file__).resolve().parents[2].parent / "shared" / "conformance"


def case_dir(prefix: str) -> Path:
    hits = sorted(CONF.glob(f"{prefix}_*"))
    if not hits:
        pytest.skip(f"conformance case {prefix} is not available under {CONF}")
    return hits[0]


def reference(prefix: str) -> ModuleType:
    """Import a case's own reference.py (it only reads its buffers at import; main() is never run)."""
    d = case_dir(prefix)
    spec = importlib.util.spec_from_file_location(f"conf_ref_{prefix}", d / "reference.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def meta(prefix: str) -> dict:
    return json.loads((case_dir(prefix) / "program" / "buffers.json").read_text())


def blob(prefix: str, buffer: str) -> bytes:
    m = meta(prefix)
    b = next(b for b in m["buffers"] if b["name"] == buffer)
    return (case_dir(prefix) / "program" / b["file"]).read_bytes()


def expected_output(prefix: str) -> bytes:
    return (case_dir(prefix) / "expected_output.bin").read_bytes()


def task_words(prefix: str, job: int = 0, task: int = 0) -> np.ndarray:
    return np.fromfile(case_dir(prefix) / "program" / f"j{job}_t{task:03d}.regcmd", "<u8")
