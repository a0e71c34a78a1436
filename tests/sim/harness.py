"""Run conformance cases (and programs derived from them) on the C simulator.

The simulator sees exactly what a rocket SUBMIT carries: task descriptors and the buffers at
their IOVAs. Buffers are host bytearrays handed to C as ``rj_region``s, so what the
simulator writes lands straight in them.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from rockjit._rjc import ffi, lib

REPO = Path(__file__).resolve().parents[2]
# next to the checkout (/work/main -> /work/shared); a git worktree one level deeper
# (/work/wt/NAME) finds the same set one more level up
CONFORMANCE = next((p for p in (REPO.parent / "shared" / "conformance",
                                REPO.parent.parent / "shared" / "conformance") if p.is_dir()),
                   REPO.parent / "shared" / "conformance")

CASE_NAMES = (
    "01_matmul_fp16",
    "02_matmul_fp16_kacc",
    "03_matmul_int8",
    "04_conv3x3_s2_fp16",
    "05_lut_sigmoid_fp16",
    "06_ew_mul_fp16",
    "07_maxpool3x3_s2_fp16",
    "08_avgpool3x3_fp16",
    "09_dwconv3x3_s2_fp16",
)

ERR_NAMES = {0: "RJ_OK", -1: "RJ_EINVAL", -2: "RJ_ENOMEM", -3: "RJ_EFAULT", -4: "RJ_EHAZARD",
             -5: "RJ_EUNSUPP", -6: "RJ_EIO", -7: "RJ_ETIMEDOUT"}
RJ_EINVAL, RJ_EFAULT, RJ_EHAZARD, RJ_EUNSUPP = -1, -3, -4, -5


class SimError(RuntimeError):
    """A simulator call returned an error code; ``code`` and ``message`` come from rj_err."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{ERR_NAMES.get(code, code)}: {message}")
        self.code = code
        self.message = message


def load_case_module():
    """The conformance set's own loader (``load_case.py``), imported from its directory."""
    spec = importlib.util.spec_from_file_location("rj_conformance_load_case",
                                                  CONFORMANCE / "load_case.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def open_case(name: str):
    return load_case_module().Case(CONFORMANCE / name)


class Simulator:
    """One ``rj_sim`` instance (register file and CBUF persist across its jobs). ``faithful``
    reproduces the documented quirks the simulator models instead of refusing them."""

    def __init__(self, strict: bool = True, faithful: bool = False) -> None:
        self._err = ffi.new("rj_err *")
        out = ffi.new("rj_sim **")
        flags = (lib.RJ_SIM_STRICT if strict else 0) | (lib.RJ_SIM_FAITHFUL if faithful else 0)
        rc = lib.rj_sim_create(out, flags, self._err)
        if rc:
            raise SimError(rc, ffi.string(self._err.msg).decode())
        self._sim = ffi.gc(out[0], lib.rj_sim_destroy)

    def run_job(self, mem: dict[str, tuple[int, bytearray]],
                tasks: list[tuple[int, int]]) -> None:
        """Run one job: ``tasks`` = [(regcmd_iova, word count)] against ``mem``."""
        keep = []
        regions = ffi.new("rj_region[]", len(mem))
        for i, (base, data) in enumerate(mem.values()):
            buf = ffi.from_buffer(data)
            keep.append(buf)
            regions[i].iova = base
            regions[i].size = len(data)
            regions[i].host = ffi.cast("uint8_t *", buf)
        ctasks = ffi.new("rj_task[]", len(tasks))
        for i, (iova, count) in enumerate(tasks):
            ctasks[i].regcmd_iova = iova
            ctasks[i].regcmd_count = count
            ctasks[i].reserved = 0
        rc = lib.rj_sim_run_job(self._sim, regions, len(mem), ctasks, len(tasks), self._err)
        del keep
        if rc:
            raise SimError(rc, ffi.string(self._err.msg).decode())

    def stats(self) -> dict[str, int]:
        s = ffi.new("rj_sim_stats *")
        lib.rj_sim_get_stats(self._sim, s)
        return {k: getattr(s, k) for k in ("jobs", "tasks", "kicks", "macs", "bytes_read",
                                           "bytes_written")}

    def last_acc(self) -> np.ndarray:
        """The last CNA/CORE accumulator cube as [height, width, channels] (fp32 or int32)."""
        dims = ffi.new("uint32_t[4]")
        n = lib.rj_sim_last_acc(self._sim, dims, ffi.NULL, 0)
        if n < 0:
            raise AssertionError("no accumulator: no CNA/CORE task has run")
        dtype = np.int32 if dims[3] else np.float32
        out = np.empty(n, dtype=dtype)
        got = lib.rj_sim_last_acc(self._sim, dims, ffi.from_buffer(out), out.nbytes)
        assert got == n
        return out.reshape(dims[1], dims[0], dims[2])


Mutator = Callable[[int, int, np.ndarray], np.ndarray]


@dataclass
class CaseRun:
    case: object
    mem: dict[str, tuple[int, bytearray]]
    sim: Simulator
    jobs: list[list[tuple[int, np.ndarray]]] = field(default_factory=list)

    def output(self) -> bytes:
        return self.case.read_output(self.mem)


def run_case(name: str, *, strict: bool = True, mutate: Mutator | None = None,
             sim: Simulator | None = None,
             jobs: list[list[tuple[int, np.ndarray]]] | None = None) -> CaseRun:
    """Lay a case out at its IOVAs and run every job's tasks in order (README steps 1-3).

    ``mutate(job, task, words)`` may return replacement words for a task (a copy); ``jobs``
    replaces the case's job list outright (each task = (regcmd_iova, words)).
    """
    case = open_case(name)
    mem = case.initial_memory()
    sim = sim or Simulator(strict=strict)
    job_list = jobs if jobs is not None else case.jobs()
    run = CaseRun(case, mem, sim)
    for j, job in enumerate(job_list):
        placed = []
        for t, (iova, words) in enumerate(job):
            words = np.asarray(words, dtype="<u8")
            if mutate is not None:
                words = np.asarray(mutate(j, t, words.copy()), dtype="<u8")
            case.write(mem, iova, words.tobytes())
            placed.append((iova, words))
        run.jobs.append(placed)
        sim.run_job(mem, [(iova, len(words)) for iova, words in placed])
    return run


def buffer_array(run: CaseRun, name: str, dtype, offset: int = 0, count: int | None = None):
    base, data = run.mem[name]
    arr = np.frombuffer(bytes(data), dtype=dtype, offset=offset)
    return arr if count is None else arr[:count]
