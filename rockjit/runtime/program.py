"""ProgramBuilder / Program: the API the compiler drives.

Build once: BOs (an arena with placed regions, weights uploaded once, regcmd words), the
relocations that patch address words at load, jobs, and a step list of NPU steps and host
steps. ``Program.run()`` then executes the whole step list in one C call
(``rj_program_run``), so no Python runs between steps."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from ._ffi import call, check, ffi, lib, new_err
from .device import BufferInfo, Device
from .errors import ProgramError
from .. import debugflags
from ..weight_timing import timed

ROLES = {"arena": lib.RJ_BO_ARENA, "weights": lib.RJ_BO_WEIGHTS, "regcmd": lib.RJ_BO_REGCMD,
         "io": lib.RJ_BO_IO}

# rj_reloc (rj_runtime.h) as a numpy record, so a whole relocation table crosses in one call
RELOC_DTYPE = np.dtype({"names": ["regcmd_bo", "target_bo", "word_offset", "target_offset",
                                  "keep_mask", "reserved"],
                        "formats": ["<u4", "<u4", "<u8", "<u8", "<u4", "<u4"],
                        "offsets": [ffi.offsetof("rj_reloc", f) for f in (
                            "regcmd_bo", "target_bo", "word_offset", "target_offset",
                            "keep_mask", "reserved")],
                        "itemsize": ffi.sizeof("rj_reloc")})

PROGRAM_STATS_FIELDS = ("runs", "steps", "npu_steps", "jobs", "tasks", "kicks", "host_steps",
                        "host_bytes", "upload_bytes", "readback_bytes", "relocs_applied",
                        "host_threads")


# numpy dtype -> RJ_DT_* code, for the conversions write_as / read_as do in C
_FLOAT_CODES = {np.dtype(np.float32): lib.RJ_DT_F32, np.dtype(np.float16): lib.RJ_DT_F16}


@lru_cache(maxsize=64)
def _convert_codes(data: np.dtype, stored: np.dtype) -> tuple[int, int] | None:
    """(data code, stored code) when C converts exactly as numpy would: float <-> float.
    Memoized: numpy's dtype names cost microseconds, asked for every input and output of
    every call."""
    if data.name == "bfloat16" or stored.name == "bfloat16":
        return None          # ml_dtypes' own rounding; kept on numpy's path
    a, b = _FLOAT_CODES.get(data), _FLOAT_CODES.get(stored)
    return None if a is None or b is None else (a, b)


@lru_cache(maxsize=64)
def _dtype(name) -> np.dtype:
    """np.dtype of a name (a signature's dtype strings), memoized for the per-call paths."""
    return np.dtype(name)


@dataclass(frozen=True)
class PlacedTask:
    """``words`` regcmd words at byte ``offset`` of regcmd BO ``bo``."""

    bo: int
    offset: int
    words: int


class _ProgramHandle:
    """Owns the C program; shared by the builder and the Program it becomes."""

    def __init__(self, device: Device) -> None:
        out = ffi.new("rj_program **")
        call(lib.rj_program_create, device._handle(), out)
        self.ptr = out[0]
        self.device = device  # keeps the device alive as long as the program
        device._programs.add(self)

    def get(self):
        if self.ptr is None:
            raise ProgramError("this program was closed (or its device was); build a new one")
        return self.ptr

    def close(self) -> None:
        if self.ptr is not None:
            lib.rj_program_destroy(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class _Access:
    """Reads, writes and BO info shared by builder and program."""

    _h: _ProgramHandle

    def bo_info(self, bo: int) -> BufferInfo:
        out = ffi.new("rj_bo *")
        call(lib.rj_program_bo_info, self._h.get(), bo, out)
        return BufferInfo(int(out.iova), int(out.size), int(out.ctx), int(out.handle))

    def write(self, bo: int, data: bytes | bytearray | memoryview | np.ndarray, offset: int = 0) -> None:
        """Copy bytes into a BO (counted as upload bytes)."""
        buf = np.ascontiguousarray(data).view(np.uint8).reshape(-1) if isinstance(data, np.ndarray) \
            else np.frombuffer(bytes(data), dtype=np.uint8)
        call(lib.rj_program_write, self._h.get(), bo, offset, ffi.from_buffer(buf), buf.nbytes)

    def read(self, bo: int, size: int, offset: int = 0) -> bytes:
        out = bytearray(size)
        call(lib.rj_program_read, self._h.get(), bo, offset, ffi.from_buffer(out), size)
        return bytes(out)

    def read_array(self, bo: int, dtype, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        dt = np.dtype(dtype)
        n = math.prod(int(d) for d in shape) * dt.itemsize
        return np.frombuffer(self.read(bo, n, offset), dtype=dt).reshape(shape).copy()

    def write_as(self, bo: int, data: np.ndarray, storage_dtype, offset: int = 0) -> None:
        """Write ``data`` converted to ``storage_dtype`` in one C pass (``rj_program_write_as``);
        float -> f16/bf16 rounds to nearest even, as ``astype`` does. Other pairs than float to
        float or same to same go through numpy's ``astype``, whose semantics they keep."""
        src = np.ascontiguousarray(data)
        codes = _convert_codes(src.dtype, _dtype(storage_dtype))
        if codes is None:
            self.write(bo, src.astype(storage_dtype), offset)
            return
        call(lib.rj_program_write_as, self._h.get(), bo, offset, codes[1], ffi.from_buffer(src),
             codes[0], src.size, src.nbytes)

    def read_as(self, bo: int, storage_dtype, dtype, shape: Sequence[int],
                offset: int = 0) -> np.ndarray:
        """A fresh array of ``dtype`` from ``shape`` elements stored as ``storage_dtype``,
        converted in one C pass (``rj_program_read_as``) where ``write_as`` would (f16 -> f32
        is exact; a signalling NaN comes back quiet, its payload kept)."""
        codes = _convert_codes(_dtype(dtype), _dtype(storage_dtype))
        if codes is None:
            return self.read_array(bo, storage_dtype, shape, offset).astype(dtype)
        out = np.empty(shape if type(shape) is tuple else tuple(int(d) for d in shape), dtype)
        call(lib.rj_program_read_as, self._h.get(), bo, offset, codes[1], ffi.from_buffer(out),
             codes[0], out.size, out.nbytes)
        return out

    def stats(self) -> dict[str, int]:
        out = ffi.new("rj_program_stats *")
        lib.rj_program_get_stats(self._h.get(), out)
        return {name: int(getattr(out, name)) for name in PROGRAM_STATS_FIELDS}


class ProgramBuilder(_Access):
    """Collects BOs, relocations, jobs and steps; ``build()`` loads and returns a Program."""

    def __init__(self, device: Device) -> None:
        self._h = _ProgramHandle(device)
        self.device = device

    def add_bo(self, size: int, role: str = "io", core: int = 0) -> int:
        """A BO of ``size`` bytes in context ``core``; returns its program index."""
        if role not in ROLES:
            raise ProgramError(f"BO role {role!r} is not one of {sorted(ROLES)}")
        out = ffi.new("uint32_t *")
        call(lib.rj_program_add_bo, self._h.get(), core, ROLES[role], size, out)
        return int(out[0])

    def place(self, bo: int, size: int, align: int = 64, offset: int | None = None) -> int:
        """Place a region in an arena BO: at ``offset`` (liveness reuse may overlap regions) or
        after the highest region; returns the region's byte offset."""
        out = ffi.new("uint64_t *")
        at = lib.RJ_PLACE_ANY if offset is None else offset
        call(lib.rj_program_place, self._h.get(), bo, at, size, align, out)
        return int(out[0])

    def upload(self, bo: int, data, offset: int = 0) -> None:
        """Weights and other constants: written once, before the first run."""
        self.write(bo, data, offset)

    def write_words(self, bo: int, words: Iterable[int] | np.ndarray, word_index: int = 0) -> None:
        """Regcmd words (u64) at word ``word_index`` of a regcmd BO."""
        arr = np.asarray(list(words) if not isinstance(words, np.ndarray) else words, dtype="<u8")
        self.write(bo, arr, offset=8 * word_index)

    def add_reloc(self, regcmd_bo: int, word_index: int, target_bo: int, target_offset: int = 0,
                  keep_mask: int = 0) -> None:
        """At load, word ``word_index`` of ``regcmd_bo`` gets value = iova(target_bo) +
        target_offset (bits 47..16; op and register kept; ``keep_mask`` keeps low value bits)."""
        r = ffi.new("rj_reloc *")
        r.regcmd_bo, r.target_bo = regcmd_bo, target_bo
        r.word_offset, r.target_offset, r.keep_mask = 8 * word_index, target_offset, keep_mask
        call(lib.rj_program_add_reloc, self._h.get(), r)

    def add_relocs(self, table: np.ndarray) -> None:
        """``add_reloc`` for every row (regcmd BO, word index, target BO, target offset, keep
        mask) of an integer table, in one C call."""
        t = np.asarray(table).reshape(-1, 5)
        if t.size and (t.min() < 0 or t[:, [0, 2, 4]].max() > 0xFFFFFFFF):
            raise ProgramError("a relocation field is negative or does not fit its C field")
        rec = np.zeros(len(t), RELOC_DTYPE)
        rec["regcmd_bo"], rec["word_offset"], rec["target_bo"] = t[:, 0], 8 * t[:, 1], t[:, 2]
        rec["target_offset"], rec["keep_mask"] = t[:, 3], t[:, 4]
        call(lib.rj_program_add_relocs, self._h.get(), ffi.from_buffer("rj_reloc[]", rec), len(rec))

    def add_job(self, tasks: Sequence[PlacedTask | tuple[int, int, int]], reads: Iterable[int] = (),
                writes: Iterable[int] = (), core: int = 0, chained: bool = False) -> int:
        """A job of tasks on context ``core``. ``reads``/``writes`` are BO indices; a BO the job
        both reads and writes is listed as written only, because the kernel signals such a
        job done without running it when a handle is in both lists (notes:
        encodings/regcmd-task-model.md). Regcmd BOs are listed as read by the runtime."""
        writes = list(dict.fromkeys(writes))
        reads = [b for b in dict.fromkeys(reads) if b not in writes]
        out = ffi.new("uint32_t *")
        h = self._h.get()
        call(lib.rj_program_add_job, h, core, lib.RJ_JOB_SELF_CHAINED if chained else 0, out)
        job = int(out[0])
        err = new_err()     # one error record for the job's calls (a model loads ~10^4 tasks)
        for t in tasks:
            bo, offset, words = (t.bo, t.offset, t.words) if isinstance(t, PlacedTask) else t
            check(lib.rj_program_job_add_task(h, job, bo, offset, words, err), err)
        for b in reads:
            check(lib.rj_program_job_add_bo(h, job, b, lib.RJ_JOB_IN, err), err)
        for b in writes:
            check(lib.rj_program_job_add_bo(h, job, b, lib.RJ_JOB_OUT, err), err)
        return job

    def add_npu_step(self, jobs: Sequence[int]) -> None:
        """Submit ``jobs`` together (different contexts run in parallel), then fence them."""
        arr = ffi.new("uint32_t[]", list(jobs))
        call(lib.rj_program_add_npu_step, self._h.get(), arr, len(jobs))

    def add_host_step(self, step) -> None:
        """A step built by rockjit.runtime.host_steps (checked against the BOs now)."""
        call(lib.rj_program_add_host_step, self._h.get(), step)

    def build(self, timeout_s: float = 10.0) -> "Program":
        """Patch relocations, check every job, hand the BOs to the device."""
        h = self._h.get()
        lib.rj_program_set_timeout(h, int(timeout_s * 1e9))
        call(lib.rj_program_load, h)
        prog = Program(self._h)
        self._h = _Closed()
        return prog


class _Closed:
    def get(self):
        raise ProgramError("this ProgramBuilder already built its Program; use the Program")


class Program(_Access):
    """A loaded program: run it, move bytes in and out, read its counters."""

    def __init__(self, handle: _ProgramHandle) -> None:
        self._h = handle
        self.device = handle.device

    def run(self) -> None:
        """Execute the whole step list in one C call."""
        call(lib.rj_program_run, self._h.get())

    def set_timeout(self, seconds: float) -> None:
        """Per-NPU-step fence timeout (becomes one absolute deadline per step)."""
        lib.rj_program_set_timeout(self._h.get(), int(seconds * 1e9))

    def close(self) -> None:
        self._h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------- program images

def _host_step_from_spec(spec):
    """An image's HostStepSpec -> the filled C ``rj_host_step``."""
    from . import host_steps as HS

    ops = {name: HS.Operand(*op) for name, op in spec.operands.items()}
    if spec.kind in HS.HOST_OP_KINDS:
        unknown = set(ops) - {"dst", "desc", "src", "src1", "src2"}
        if unknown or "dst" not in ops or "desc" not in ops:
            raise ProgramError(f"host-op step {spec.kind!r} has operands {sorted(ops)}; it "
                               f"takes dst, desc and src/src1/src2")
        return HS.host_op(spec.kind, **ops)
    ctor = HS.HOST_STEPS.get(spec.kind)
    if ctor is None:
        raise ProgramError(f"host step kind {spec.kind!r} is not one this runtime knows "
                           f"({sorted(HS.HOST_STEPS)})")
    try:
        return ctor(**ops, **spec.params)
    except TypeError as e:
        raise ProgramError(f"host step {spec.kind!r}: {e}") from None


def _task_words(image) -> dict[int, list[tuple[int, int]]]:
    """Per regcmd BO, the word ranges [start, end) its jobs' tasks fetch."""
    out: dict[int, list[tuple[int, int]]] = {}
    for j in image.jobs:
        for bo, offset, words in j.tasks:
            out.setdefault(bo, []).append((offset // 8, offset // 8 + words))
    return out


# a zero gap shorter than a 4 KB page lies on pages the words around it touch anyway
_GAP_WORDS = 512


def _written_runs(words: np.ndarray, tasks: list[tuple[int, int]],
                  first: int) -> list[tuple[int, int]]:
    """The runs of ``words`` (placed from word ``first`` of its BO) that are written at load:
    every word a task fetches and every non-zero word, joined across zero gaps shorter than a
    page (one write per run; a ModernBERT x22 image has ~10^4 job spans 64-byte aligned). The
    longer all-zero gaps outside every task (an image may reserve whole regions it only partly
    fills) are left as the BO was made (zero: never-written pages of the simulator's BOs cost
    no memory). No task fetches them, so nothing reads them."""
    n = int(words.size)
    want = words != 0
    if tasks:
        t = np.clip(np.array(tasks, np.int64).reshape(-1, 2) - first, 0, n)
        t = t[t[:, 0] < t[:, 1]]
        t = t[np.argsort(t[:, 0], kind="stable")]
        # the tasks' ranges merged where they meet or overlap: disjoint, so +1/-1 marks sum
        # to a 0/1 coverage
        reach = np.maximum.accumulate(t[:, 1])
        head = np.concatenate(([True], t[1:, 0] > reach[:-1]))
        tail = np.concatenate((head[1:], [True]))
        mark = np.zeros(n + 1, np.int8)
        mark[t[head, 0]] = 1
        mark[reach[tail]] = -1
        want |= np.cumsum(mark[:-1], dtype=np.int8).view(bool)
    edges = np.flatnonzero(np.diff(want, prepend=False, append=False))
    starts, ends = edges[0::2], edges[1::2]
    if starts.size > 1:
        gap = starts[1:] - ends[:-1] >= _GAP_WORDS
        starts = starts[np.concatenate(([True], gap))]
        ends = ends[np.concatenate((gap, [True]))]
    return list(zip(starts.tolist(), ends.tolist()))


class LoadedImage:
    """A ProgramImage loaded on a device: ``run(inputs) -> outputs`` with numpy arrays in the
    image's input signature, ``stats()``, ``report()``. Built only from the image's data."""

    def __init__(self, image, device: Device, timeout_s: float = 10.0) -> None:
        image.check()
        if image.contexts > device.cores:
            raise ProgramError(f"this program uses {image.contexts} device contexts; the "
                               f"{device.kind} device has {device.cores}; open the device with "
                               f"cores={image.contexts}")
        self.image = image
        self.device = device
        try:
            self.program = self._build(image, device, timeout_s)
        except (OverflowError, TypeError, ValueError) as e:
            # a value no C field can hold (a hand-made or hostile image): refused, not cast
            raise ProgramError(f"the program image holds a value the runtime cannot take: "
                               f"{type(e).__name__}: {e}") from None
        self._in_sig = image.signature("input")
        self._out_sig = image.signature("output")
        # each boundary tensor with its shape as the tuple numpy reports (compared per call)
        self._in_io = [(s, tuple(int(d) for d in s.shape)) for s in image.inputs]
        self._out_io = [(s, tuple(int(d) for d in s.shape)) for s in self._out_sig]
        # write inputs -> run -> read outputs goes through one arena and one C step list (its
        # job scratch included), so two calls at once would mix their tensors: one at a time
        self._run_lock = threading.Lock()

    @staticmethod
    def _build(image, device: Device, timeout_s: float) -> "Program":
        b = ProgramBuilder(device)
        for k, bo in enumerate(image.bos):
            got = b.add_bo(bo.size, role=bo.role, core=bo.core)
            if got != k:
                raise ProgramError(f"the runtime numbered BO {k} as {got}")
        with timed("upload") as uploaded:
            for u in image.uploads:
                b.upload(u.bo, image.arrays[u.array], u.offset)
                uploaded[0] += image.arrays[u.array].nbytes
        # A zero fill is written only into a BO that something else is written into (an
        # upload, regcmd words: the fill may cover part of them), or when RJ_POISON_BOS fills
        # new BOs with 0xAA. Every BO above was created just now, and a fresh BO reads as zero
        # on every backend (rj_bo_create: an anonymous mmap for the sim and null devices and
        # the fake driver; on rocket a new GEM shmem object, whose never-written pages read as
        # zero -- Linux drm_gem_shmem_helper.c over mm/shmem.c), so the arenas' fills change
        # nothing and would fault in 130 MB of pages on ModernBERT x22 at load.
        # tests/runtime/test_fresh_bos_zero.py holds the backends to it.
        poisoned = debugflags.enabled("RJ_POISON_BOS")
        written = {u.bo for u in image.uploads} | {w.bo for w in image.words}
        fills = [z for z in image.zero_fills if poisoned or z.bo in written]
        zeros = np.zeros(max((z.size for z in fills), default=0), np.uint8)
        for z in fills:
            b.upload(z.bo, zeros[:z.size], z.offset)
        tasks = _task_words(image)
        for w in image.words:
            words = image.arrays[w.array]
            for lo, hi in _written_runs(words, tasks.get(w.bo, []), w.word_index):
                b.write_words(w.bo, words[lo:hi], w.word_index + lo)
        b.add_relocs(image.arrays[image.relocs])
        ids = [b.add_job(j.tasks, reads=j.reads, writes=j.writes,
                         core=j.core, chained=j.chained) for j in image.jobs]
        for s in image.steps:
            if s.kind == "npu":
                b.add_npu_step([ids[j] for j in s.jobs])
            else:
                b.add_host_step(_host_step_from_spec(s.host))
        return b.build(timeout_s)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Write the inputs (cast to the dtype the image stores them in), run the whole step
        list in one C call, read the outputs (cast back to their logical dtypes)."""
        n = len(self._in_sig)
        if len(inputs) != n:
            raise ProgramError(f"the program takes {n} input(s), got {len(inputs)}")
        xs = [np.asarray(x) for x in inputs]
        for sig, shape in self._in_io:
            if xs[sig.index].shape != shape:
                raise ProgramError(f"input {sig.name!r}: expected shape {shape}, "
                                   f"got {xs[sig.index].shape}")
        prog = self.program
        with self._run_lock:
            for sig, _ in self._in_io:
                prog.write_as(sig.bo, xs[sig.index], sig.storage_dtype, sig.offset)
            prog.run()
            return [prog.read_as(s.bo, s.storage_dtype, s.dtype, shape, s.offset)
                    for s, shape in self._out_io]

    __call__ = run

    def stats(self) -> dict[str, int]:
        """The image's static counts, plus the runtime's cumulative counters (``rt_*``)."""
        out = dict(self.image.stats)
        for k, v in self.program.stats().items():
            out[f"rt_{k}"] = v
        return out

    def report(self) -> str:
        return self.image.report()

    def close(self) -> None:
        self.program.close()


def load_image(image, device: Device, timeout_s: float = 10.0) -> LoadedImage:
    """Build a runnable program from a ProgramImage (runtime/image.py) on ``device``."""
    return LoadedImage(image, device, timeout_s)
