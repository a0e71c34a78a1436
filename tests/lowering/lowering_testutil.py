"""Shared helpers for the lowering tests: the conformance cases and their own reference code."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

try:
    from rockjit._rjc import ffi, lib
    SIM_MISSING = ""
except ImportError:  # pragma: no cover - the C core is part of the install
    ffi = lib = None
    SIM_MISSING = "the C simulator (rockjit._rjc) is not built; run pip install -e ."

PAGE = 4096

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


class SimRunError(AssertionError):
    pass


class Memory:
    """Device buffers at IOVAs from a bump allocator with an unmapped page between them."""

    def __init__(self) -> None:
        self.bufs: dict[str, tuple[int, np.ndarray]] = {}
        self._next = 0x01000000

    def add(self, name: str, size: int, data=None, fill: int = 0, iova: int | None = None) -> int:
        size = -(-max(size, 1) // PAGE) * PAGE
        buf = np.full(size, fill, np.uint8)
        if data is not None:
            raw = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) \
                else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            buf[:raw.size] = raw
        if iova is not None:
            self._next = iova
        addr = self._next
        self.bufs[name] = (addr, buf)
        self._next += size + PAGE
        return addr

    def addresses(self) -> dict[str, int]:
        return {k: v[0] for k, v in self.bufs.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.bufs[name][1]

    def run(self, tasks: list[tuple[int, int]], strict: bool = True) -> None:
        regions = ffi.new("rj_region[]", len(self.bufs))
        keep = []
        for r, (iova, buf) in zip(regions, self.bufs.values()):
            ptr = ffi.from_buffer("uint8_t[]", buf)
            keep.append(ptr)
            r.iova, r.size, r.host = iova, buf.size, ptr
        jt = ffi.new("rj_task[]", len(tasks))
        for d, (iova, n) in zip(jt, tasks):
            d.regcmd_iova, d.regcmd_count = iova, n
        err = ffi.new("rj_err *")
        simp = ffi.new("rj_sim **")
        flags = lib.RJ_SIM_STRICT if strict else 0
        assert lib.rj_sim_create(simp, flags, err) == 0, ffi.string(err.msg).decode()
        try:
            rc = lib.rj_sim_run_job(simp[0], regions, len(self.bufs), jt, len(tasks), err)
            if rc != 0:
                raise SimRunError(f"simulator refused/failed ({rc}): {ffi.string(err.msg).decode()}")
        finally:
            lib.rj_sim_destroy(simp[0])
