"""Shared helpers: conformance programs loaded through ProgramBuilder, fake-rocket hygiene."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rockjit.runtime import ProgramBuilder

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO.parent / "shared" / "conformance"

ROLE = {"input": "io", "weight": "weights", "output": "io", "scratch": "arena"}


def case_dir(name: str) -> Path:
    """A conformance case's folder. Skips only when the whole set is absent; a set that exists
    but lacks the case is a failure, not a skip (a skip would hide a broken checkout)."""
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance set not present at {CONFORMANCE} (expected ../shared/conformance "
                    "next to the repository)")
    d = CONFORMANCE / name
    assert (d / "program" / "buffers.json").is_file(), \
        f"conformance case {name} is missing from {CONFORMANCE} (no program/buffers.json)"
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


def add_case(b: ProgramBuilder, name: str, core: int = 0, mutate=None) -> LoadedCase:
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
            if mutate is not None:  # a test's deliberate change to the foreign words
                words = np.asarray(mutate(len(jobs), len(tasks), words.copy()), dtype="<u8")
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
            tasks.append((rc, off, len(words)))
        reads = [rc if n == "regcmd" else bos[n] for n in job["in_buffers"]]
        writes = [bos[n] for n in job["out_buffers"]]
        jobs.append(b.add_job(tasks, reads=reads, writes=writes, core=core))
    e = meta["expected_output"]
    return LoadedCase(name, bos, jobs, bos[e["buffer"]], e["offset"],
                      (d / "expected_output.bin").read_bytes(), e["dtype"], e["tolerance"], iova,
                      relocated)


def add_case_chained(b: ProgramBuilder, name: str, core: int = 0, link: bool = True) -> LoadedCase:
    """Lay every task of every job of a case back to back in one regcmd BO and self-chain them
    into ONE job that runs as one kick: each trailer's OP_NONE slot (count-4) becomes a
    PC_BASE_ADDRESS redirect to the next task (relocated to regcmd BO + offset) and the next
    slot the next segment's PC_REGISTER_AMOUNTS, the layout of notes:
    encodings/regcmd-task-model.md "Contiguous chaining" (stride = even-rounded word count).
    ``link=False`` lays them out the same way and flags the job, but leaves the trailers alone."""
    from rockjit.lowering.registers import emit, emit_raw

    d = case_dir(name)
    meta = json.loads((d / "program" / "buffers.json").read_text())
    bos: dict[str, int] = {}
    iova: dict[str, int] = {}
    for buf in meta["buffers"]:
        iova[buf["name"]] = buf["iova"]
        if buf["role"] == "regcmd":
            continue
        idx = b.add_bo(buf["size"], ROLE[buf["role"]], core)
        if buf["file"]:
            b.upload(idx, (d / "program" / buf["file"]).read_bytes())
        bos[buf["name"]] = idx
    tasks = [t for job in meta["jobs"] for t in job["tasks"]]
    offsets, at = [], 0
    for t in tasks:
        offsets.append(at)
        at += 8 * ((t["words"] + 1) & ~1)
    rc = b.add_bo(at, "regcmd", core)
    relocated = 0
    for i, t in enumerate(tasks):
        words = np.fromfile(d / "program" / t["file"], dtype="<u8").copy()
        values = (words >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
        is_write = ((words >> np.uint64(48)) & np.uint64(0xFF)) == 1
        relocs = []
        for ar in t["address_registers"].values():
            for w in np.flatnonzero(is_write & (values == int(ar["iova_hex"], 16))):
                relocs.append((int(w), bos[ar["buffer"]], ar["offset"]))
        if link and i + 1 < len(tasks):
            n = len(words)
            assert int(words[n - 4]) == 0, f"{name} {t['file']}: trailer slot count-4 is not OP_NONE"
            words[n - 4] = emit_raw("PC_BASE_ADDRESS", 0)
            words[n - 3] = emit("PC_REGISTER_AMOUNTS", PC_DATA_AMOUNT=(tasks[i + 1]["words"] + 1) // 2 - 1)
            relocs.append((n - 4, rc, offsets[i + 1]))
        b.write_words(rc, words, offsets[i] // 8)
        for w, target, off in relocs:
            b.add_reloc(rc, offsets[i] // 8 + w, target, off)
            relocated += 1
    reads = {bos[n] for job in meta["jobs"] for n in job["in_buffers"] if n != "regcmd"}
    writes = [bos[n] for job in meta["jobs"] for n in job["out_buffers"]]
    job = b.add_job([(rc, off, t["words"]) for off, t in zip(offsets, tasks)], reads=sorted(reads),
                    writes=writes, core=core, chained=True)
    e = meta["expected_output"]
    return LoadedCase(name, bos, [job], bos[e["buffer"]], e["offset"],
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
