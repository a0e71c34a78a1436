"""Shared helpers: conformance programs loaded through ProgramBuilder, fake-rocket hygiene."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rockjit.runtime import ProgramBuilder, fake_rocket

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO.parent / "shared" / "conformance"

ROLE = {"input": "io", "weight": "weights", "output": "io", "scratch": "arena"}


def case_dir(name: str) -> Path:
    d = CONFORMANCE / name
    if not (d / "program" / "buffers.json").is_file():
        pytest.skip(f"conformance case {name} not found under {CONFORMANCE}")
    return d


@dataclass
class LoadedCase:
    name: str
    bos: dict[str, int]
    jobs: list[int]
    out_bo: int
    out_offset: int
    expected: bytes
    dtype: str
    tolerance: dict
    original_iova: dict[str, int]
    relocated_words: int


def add_case(b: ProgramBuilder, name: str, core: int = 0) -> LoadedCase:
    """Lay a conformance case out in our own BOs. Its regcmd words hold the stand-in driver's
    absolute IOVAs; every address register buffers.json lists is turned into a relocation to
    (buffer, offset), so the program runs wherever our device puts the BOs. Each job gets its
    own regcmd BO (case 02's jobs reuse one slot in the original)."""
    d = case_dir(name)
    meta = json.loads((d / "program" / "buffers.json").read_text())
    bos: dict[str, int] = {}
    iova: dict[str, int] = {}
    regcmd_meta = None
    for buf in meta["buffers"]:
        iova[buf["name"]] = buf["iova"]
        if buf["role"] == "regcmd":
            regcmd_meta = buf
            continue
        idx = b.add_bo(buf["size"], ROLE[buf["role"]], core)
        if buf["file"]:
            b.upload(idx, (d / "program" / buf["file"]).read_bytes())
        bos[buf["name"]] = idx
    assert regcmd_meta is not None
    jobs, relocated = [], 0
    for job in meta["jobs"]:
        rc = b.add_bo(regcmd_meta["size"], "regcmd", core)
        tasks = []
        for t in job["tasks"]:
            words = np.fromfile(d / "program" / t["file"], dtype="<u8")
            assert len(words) == t["words"]
            off = t["regcmd_iova"] - regcmd_meta["iova"]
            b.write_words(rc, words, off // 8)
            values = (words >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
            is_write = ((words >> np.uint64(48)) & np.uint64(0xFF)) == 1
            for reg, ar in t["address_registers"].items():
                hits = np.flatnonzero(is_write & (values == int(ar["iova_hex"], 16)))
                assert len(hits) >= 1, f"{name} {t['file']}: {reg} not found"
                for w in hits:
                    b.add_reloc(rc, off // 8 + int(w), bos[ar["buffer"]], ar["offset"])
                    relocated += 1
            tasks.append((rc, off, t["words"]))
        reads = [rc if n == "regcmd" else bos[n] for n in job["in_buffers"]]
        writes = [bos[n] for n in job["out_buffers"]]
        jobs.append(b.add_job(tasks, reads=reads, writes=writes, core=core))
    e = meta["expected_output"]
    return LoadedCase(name, bos, jobs, bos[e["buffer"]], e["offset"],
                      (d / "expected_output.bin").read_bytes(), e["dtype"], e["tolerance"], iova,
                      relocated)


def check_output(prog, lc: LoadedCase) -> None:
    got = np.frombuffer(prog.read(lc.out_bo, len(lc.expected), lc.out_offset), lc.dtype)
    want = np.frombuffer(lc.expected, lc.dtype)
    if lc.tolerance["kind"] == "exact":
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{lc.name}: {bad.size} of {want.size} elements differ " \
                              f"(first {bad[:5]}: got {got[bad[:5]]} want {want[bad[:5]]})"
    else:
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert not np.isnan(diff).any() and diff.max() <= lc.tolerance["atol"]


@pytest.fixture
def fake():
    """A clean fake kernel; after the test every fd and BO must be gone."""
    fake_rocket.reset()
    yield fake_rocket
    fake_rocket.set_faults()
    s = fake_rocket.stats()
    assert s["open_fds"] == 0 and s["live_bos"] == 0, f"fake rocket leaked: {s}"
