"""Runs an emitted OpLowering on the C simulator (strict mode), plus the helpers the element-wise,
LUT, pooling and reduction tests share: the register-by-register comparison with a foreign
(conformance) program. The tests at the bottom check the harness itself against conformance
data, so a harness bug cannot hide behind the emitter tests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pytest

from rockjit.lowering import registers as R
from rockjit.lowering.op_lowering import HostStep, NpuStep, OpLowering
from rockjit.lowering.profile import get_profile

from lowering_testutil import (PAGE, SIM_MISSING, Memory, SimRunError, blob, case_dir,  # noqa: F401
                               meta, task_words)


needs_sim = pytest.mark.skipif(bool(SIM_MISSING), reason=SIM_MISSING or "simulator available")

P = get_profile("rk3588")
SENTINEL = 0xAA


HostImpl = Mapping[str, object]


def run_program(prog: OpLowering, inputs: Mapping[str, np.ndarray | bytes],
                host_impls: Mapping[str, object] | None = None) -> "OpRun":
    """Run ``prog`` through the real runtime (rockjit.lowering.oprun: one BO per buffer,
    relocations patched at load, NPU jobs on a strict SimDevice, host steps in the C
    host-step library). Outputs and scratch start as a 0xAA sentinel so an unwritten byte is
    visible. ``host_impls`` is accepted for old callers and must be empty or name only kinds
    the runtime implements: host steps never run in a Python model here."""
    from rockjit.lowering.oprun import run_op_lowering
    from rockjit.runtime.host_steps import HOST_STEPS

    unknown = set(host_impls or {}) - set(HOST_STEPS)
    if unknown:
        raise KeyError(f"host step kinds {sorted(unknown)} are not runtime host steps")
    return run_op_lowering(prog, {k: (np.frombuffer(v, np.uint8) if isinstance(v, bytes) else v)
                                 for k, v in inputs.items()}, sentinel=SENTINEL)


# ---------------------------------------------------------------------------------------------
# register-by-register comparison with a foreign program
# ---------------------------------------------------------------------------------------------

@dataclass
class RegState:
    regs: dict[str, int]            # last value written per register
    tables: dict[int, list[int]]    # LUT table id -> uploaded entries
    enable: int


def decode_program(words: np.ndarray) -> RegState:
    regs: dict[str, int] = {}
    tables: dict[int, list[int]] = {}
    cur = None
    enable = 0
    for w in map(int, words):
        op, val, off = R.decode(w)
        if op == 0:
            continue
        if op & 0xFF == R.OP_ENABLE:
            enable = val
            continue
        if op & 0xFF == R.OP_40:
            continue
        reg = R.lookup(op & 0xFF00, off)
        assert reg is not None, f"unknown register word {w:#x}"
        if reg.full_name == "DPU_LUT_ACCESS_CFG":
            f = {fl.name: (val >> fl.lo) & ((1 << (fl.hi - fl.lo + 1)) - 1) for fl in reg.fields}
            cur = f["LUT_TABLE_ID"] if f["LUT_ACCESS_TYPE"] else None
            if cur is not None:
                tables[cur] = []
        elif reg.full_name == "DPU_LUT_ACCESS_DATA" and cur is not None:
            tables[cur].append(val & 0xFFFF)
            continue
        if reg.full_name.startswith("PC_"):
            continue
        regs[reg.full_name] = val
    return RegState(regs, tables, enable)


def field_values(name: str, value: int) -> dict[str, int]:
    reg = R.register(name)
    out = {f.name: (value >> f.lo) & ((1 << (f.hi - f.lo + 1)) - 1) for f in reg.fields}
    covered = 0
    for f in reg.fields:
        covered |= ((1 << (f.hi - f.lo + 1)) - 1) << f.lo
    if value & ~covered & 0xFFFFFFFF:
        out["<undocumented bits>"] = value & ~covered & 0xFFFFFFFF
    return out


def register_diff(ours: RegState, theirs: RegState) -> dict[tuple[str, str], tuple[int | None, int | None]]:
    """Every (register, field) whose value differs, with (ours, theirs); a register only one
    side writes counts with None on the other side for each of its nonzero fields, and as
    (register, '*') when all its fields are zero (written-as-zero vs relies-on-reset)."""
    diff = {}
    for name in sorted(set(ours.regs) | set(theirs.regs)):
        a, b = ours.regs.get(name), theirs.regs.get(name)
        if a is not None and b is not None:
            fa, fb = field_values(name, a), field_values(name, b)
            for f in sorted(set(fa) | set(fb)):
                if fa.get(f, 0) != fb.get(f, 0):
                    diff[(name, f)] = (fa.get(f, 0), fb.get(f, 0))
        else:
            v = a if a is not None else b
            nonzero = {f: x for f, x in field_values(name, v).items() if x}
            if not nonzero:
                diff[(name, "*")] = (a, b)
            for f, x in nonzero.items():
                diff[(name, f)] = (x if a is not None else None, x if b is not None else None)
    if ours.enable != theirs.enable:
        diff[("PC_OPERATION_ENABLE", "mask")] = (ours.enable, theirs.enable)
    return diff


def assert_register_agreement(ours_words: np.ndarray, prefix: str,
                              allowed: Mapping[tuple[str, str], str]) -> RegState:
    """Compare with conformance case ``prefix``'s task 0 (both patched with the case's IOVAs).
    Every differing field must be listed in ``allowed`` with a reason, and every listed field
    must really differ (a stale entry fails too)."""
    theirs = decode_program(task_words(prefix))
    ours = decode_program(ours_words)
    diff = register_diff(ours, theirs)
    unexplained = {k: v for k, v in diff.items() if k not in allowed}
    stale = [k for k in allowed if k not in diff]
    msg = []
    if unexplained:
        msg.append("fields differing from the foreign program without a listed reason:\n" +
                   "\n".join(f"  {r}.{f}: ours {a!r} vs foreign {b!r}" for (r, f), (a, b)
                             in sorted(unexplained.items())))
    if stale:
        msg.append("listed differences that no longer differ (remove them): " +
                   ", ".join(f"{r}.{f}" for r, f in stale))
    for k, why in allowed.items():
        if not why.strip():
            msg.append(f"difference {k} has no reason")
    if msg:
        raise AssertionError("\n".join(msg))
    return ours


def case_addresses(prefix: str) -> dict[str, int]:
    return {b["name"]: b["iova"] for b in meta(prefix)["buffers"]}


# ---------------------------------------------------------------------------------------------
# harness self-checks
# ---------------------------------------------------------------------------------------------

def test_decode_roundtrip_of_a_foreign_program() -> None:
    st = decode_program(task_words("05"))
    assert st.enable == 0x18
    assert len(st.tables[0]) == 513 and len(st.tables[1]) == 513
    assert register_diff(st, st) == {}


@needs_sim
def test_memory_runs_foreign_case_06() -> None:
    m = meta("06")
    mem = Memory()
    for b in m["buffers"]:
        data = (case_dir("06") / "program" / b["file"]).read_bytes() if b["file"] else None
        mem.add(b["name"], b["size"], data, iova=b["iova"])
    t = m["jobs"][0]["tasks"][0]
    words = task_words("06")
    off = t["regcmd_iova"] - mem.addresses()["regcmd"]
    mem["regcmd"][off:off + words.nbytes] = words.view(np.uint8)
    mem.run([(t["regcmd_iova"], t["words"])])
    exp = (case_dir("06") / "expected_output.bin").read_bytes()
    assert mem["output"][:len(exp)].tobytes() == exp
    assert blob("06", "operand")[:16] != b"\0" * 16
