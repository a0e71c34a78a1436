"""Helpers for the DPU / LUT / PPU simulator tests (sim B), plus tests of the helpers themselves.

The tests run conformance programs (``/work/shared/conformance``) on the C simulator, optionally
with some register words changed through ``rockjit.lowering.registers`` (the one way to build a
regcmd word) and the initial memory patched, and compare with references computed here in numpy
from the case's own input blobs -- never with the simulator's own output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from harness import CONFORMANCE, SimError, Simulator, open_case  # sim A's harness
from programs import get_raw, insert_before_trailer, set_fields, set_raw  # noqa: F401 (re-exported)

# rj_err.h codes
RJ_EHAZARD = -4
RJ_EUNSUPP = -5


def case_name(prefix: str) -> str:
    hits = [d.name for d in sorted(CONFORMANCE.iterdir()) if d.name.startswith(prefix)]
    assert len(hits) == 1, f"no unique conformance case {prefix!r} in {CONFORMANCE}"
    return hits[0]


def blob(prefix: str, buffer: str) -> bytes:
    """Initial content of one buffer of a case (its blob file)."""
    case = open_case(case_name(prefix))
    return bytes(case.initial_memory()[buffer][1])


def expected(prefix: str) -> bytes:
    return open_case(case_name(prefix)).expected()


@dataclass
class Result:
    rc: int
    msg: str
    mem: dict[str, tuple[int, bytearray]]
    stats: dict[str, int]
    case: object

    def buf(self, name: str) -> bytearray:
        return self.mem[name][1]

    def output(self) -> bytes:
        return self.case.read_output(self.mem)


Mutator = Callable[[int, int, np.ndarray], np.ndarray]


def run_case(prefix: str, mutate: Mutator | None = None, strict: bool = True,
             patch: Callable[[dict], None] | None = None) -> Result:
    """Run a conformance case (sim A's harness.Simulator); ``mutate(job, task, words)`` may
    return changed words and ``patch(mem)`` may change the initial memory. Errors come back as
    ``rc``/``msg`` instead of an exception so tests can assert on refusals."""
    case = open_case(case_name(prefix))
    mem = case.initial_memory()
    if patch:
        patch(mem)
    sim = Simulator(strict=strict)
    rc, msg = 0, ""
    for j, job in enumerate(case.jobs()):
        placed = []
        for k, (iova, words) in enumerate(job):
            if mutate:
                words = np.asarray(mutate(j, k, words.copy()), dtype="<u8")
            case.write(mem, iova, words.tobytes())
            placed.append((iova, len(words)))
        try:
            sim.run_job(mem, placed)
        except SimError as e:
            rc, msg = e.code, e.message
            break
    return Result(rc, msg, mem, sim.stats(), case)


# ---- cube layouts (notes: encodings/tile-layouts.md; conformance case.md formulas) ----------

def cube_to_pc(buf: bytes | bytearray, offset: int, positions: int, channels: int, dtype: str,
               surf_stride: int) -> np.ndarray:
    """[positions, channels] from a cube of 16-byte atoms (C2 = 16 / itemsize) whose surfaces are
    ``surf_stride`` bytes apart."""
    dt = np.dtype(dtype)
    c2 = 16 // dt.itemsize
    out = np.zeros((positions, channels), dtype=dt)
    for s in range((channels + c2 - 1) // c2):
        raw = np.frombuffer(bytes(buf[offset + s * surf_stride: offset + s * surf_stride + positions * 16]), dtype=dt)
        raw = raw.reshape(positions, c2)
        n = min(c2, channels - s * c2)
        out[:, s * c2:s * c2 + n] = raw[:, :n]
    return out


def pc_to_cube(arr: np.ndarray, surf_stride: int) -> bytes:
    positions, channels = arr.shape
    c2 = 16 // arr.dtype.itemsize
    nsurf = (channels + c2 - 1) // c2
    out = bytearray(surf_stride * (nsurf - 1) + positions * 16)
    for s in range(nsurf):
        blk = np.zeros((positions, c2), dtype=arr.dtype)
        n = min(c2, channels - s * c2)
        blk[:, :n] = arr[:, s * c2:s * c2 + n]
        out[s * surf_stride:s * surf_stride + positions * 16] = blk.tobytes()
    return bytes(out)


def f16_bits(x: float) -> int:
    return int(np.array(x, dtype=np.float16).view(np.uint16))


def f32_bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


# ---- tests of the helpers ---------------------------------------------------------------------

def test_cube_round_trip_matches_case_layout():
    """The helper's cube reader reproduces case 06's documented operand formula
    byte(B[m,n]) = 2*((n//8)*16*8 + m*8 + n%8)."""
    op = blob("06", "operand")
    raw = np.frombuffer(op, dtype=np.float16)
    b = cube_to_pc(op, 0, 16, 32, "float16", 0x100)
    m, n = np.meshgrid(np.arange(16), np.arange(32), indexing="ij")
    assert np.array_equal(b.view(np.uint16), raw[(n // 8) * 128 + m * 8 + n % 8].view(np.uint16))
    assert pc_to_cube(b, 0x100) == op[:1024]


def test_run_case_reports_refusal_codes():
    """A refused program comes back as (rc, message), not an exception: an unknown EW ALU
    algorithm (3) is not modelled."""
    r = run_case("06", mutate=lambda j, t, w: set_fields(w, "DPU_EW_CFG", EW_OP_TYPE=0, EW_ALU_ALGO=3))
    assert r.rc == RJ_EUNSUPP and "EW_ALU_ALGO = 3" in r.msg, r.msg
