"""Assembling tasks: regcmd words, relocations, the PC trailer and self-chained kicks.

A task is a complete register program (notes: encodings/regcmd-task-model.md -- a delta task
does not fire, so every task rewrites its whole configuration) that ends in the 4-word PC
trailer the conformance programs end with:

    [count-4]  filler (op 0)                      -- becomes PC_BASE_ADDRESS when chained
    [count-3]  PC_REGISTER_AMOUNTS                -- 0; the kernel programs the first length
    [count-2]  OP_40 word                         -- "must precede op_en" (Mesa rkt_regcmd.c, TRM)
    [count-1]  OP_ENABLE -> PC_OPERATION_ENABLE   -- the bitmap of blocks the task fires

Every register word is built by ``registers.emit``/``emit_raw``; the two special trailer ops
(OP_40, OP_ENABLE) by ``registers.word`` with the op constants registers.py defines for them.
Address words are relocations: the word holds 0 until ``patch`` (or ``EmittedTask.array``)
writes in the buffer's device address + offset.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..errors import RockjitError
from . import registers as R
from .profile import ChipProfile

TRAILER_WORDS = 4


class LoweringError(RockjitError, ValueError):
    """A shape, tile or program the lowering cannot turn into a correct NPU task."""


@dataclass(frozen=True)
class Reloc:
    """An address word: its 32-bit value is the device address of ``buffer`` plus ``offset``."""

    buffer: str
    offset: int = 0


# Which enable-bit group a block's register writes belong to (see profile.enable_bits).
_BLOCK_GROUP = {"CNA": "CNA+CORE", "CORE": "CNA+CORE", "DPU": "DPU", "DPU_RDMA": "DPU_RDMA",
                "PPU": "PPU", "PPU_RDMA": "PPU_RDMA"}


def enable_mask(profile: ChipProfile, blocks: Iterable[str]) -> int:
    """The PC_OPERATION_ENABLE bitmap that fires ``blocks`` (conformance: conv 0x1d, DPU-only
    0x18, pooling 0x60; seeds 003 section 3: one participation bit per block)."""
    blocks = set(blocks) - {"PC"}
    if ("CNA" in blocks) != ("CORE" in blocks):
        raise LoweringError(
            f"a task drives {'CNA' if 'CNA' in blocks else 'CORE'} without "
            f"{'CORE' if 'CNA' in blocks else 'CNA'}: the enable bits are only known for the "
            f"pair (a convolution); program both or neither")
    mask = 0
    for b in blocks:
        try:
            mask |= profile.enable_bits[_BLOCK_GROUP[b]]
        except KeyError:
            raise LoweringError(f"no enable bit is known for block {b!r} on {profile.name}") from None
    if not mask:
        raise LoweringError("a task must drive at least one block")
    return mask


@dataclass(frozen=True)
class Access:
    """One DMA stream of a task: ``nbytes`` moved within [offset, offset + extent) of buffer
    ``buffer`` (a strided cube spans more than it moves). The emitter that programs the
    registers states it from the same geometry, so the program's device-byte counts and the
    multicore copy ranges are exactly what the task's DMA touches."""

    buffer: str
    offset: int
    extent: int
    nbytes: int
    pieces: int = 1        # the bytes are ``pieces`` runs of nbytes / pieces, ``pitch`` apart
    pitch: int = 0         # (a cube's channel-group surfaces)

    @property
    def chunk(self) -> int:
        return self.nbytes // max(self.pieces, 1)


@dataclass(frozen=True)
class EmittedTask:
    """One finished task: words (with the trailer), address relocations, enable mask."""

    name: str
    words: tuple[int, ...]
    relocs: Mapping[int, Reloc]
    enable: int
    chainable: bool
    chain_refusal: str = ""   # why the task may not be self-chained, when it may not
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()

    def __len__(self) -> int:
        return len(self.words)

    def array(self, addresses: Mapping[str, int] | None = None) -> np.ndarray:
        """The words as little-endian u64, relocations patched when ``addresses`` is given."""
        words = list(self.words)
        if addresses is not None:
            words = patch(words, self.relocs, addresses)
        return np.asarray(words, dtype="<u8")


def _patched_word(w: int, value: int) -> int:
    op, _, offset = R.decode(w)
    reg = R.lookup(op & 0xFF00, offset)
    if reg is None or op & 0xFF != R.OP_WRITE:
        raise LoweringError(f"relocation on word {w:#018x}, which is not a register write")
    # an address field that starts above bit 0 (e.g. PC_BASE_ADDRESS.PC_SOURCE_ADDR, bits 4..31)
    # can only hold addresses aligned to its low bit
    top = [f for f in reg.fields if f.hi == 31]
    if top and top[0].lo and value % (1 << top[0].lo):
        raise LoweringError(f"{reg.full_name} needs a {1 << top[0].lo}-byte aligned address, "
                            f"got {value:#x}")
    return R.emit_raw(reg.full_name, value)


def patch(words: Sequence[int], relocs: Mapping[int, Reloc],
          addresses: Mapping[str, int]) -> list[int]:
    """Fill every relocated word with its buffer's device address + offset."""
    out = list(words)
    for i, rel in relocs.items():
        if rel.buffer not in addresses:
            raise LoweringError(f"word {i} refers to buffer {rel.buffer!r}, which has no device "
                                f"address; place it first (known: {', '.join(sorted(addresses))})")
        value = addresses[rel.buffer] + rel.offset
        if not 0 <= value < 1 << 32:
            raise LoweringError(f"word {i}: {rel.buffer}+{rel.offset:#x} = {value:#x} is outside "
                                f"the NPU's 32-bit address space")
        out[i] = _patched_word(out[i], value)
    return out


# Registers a userspace program must not write, with the reason.
_FORBIDDEN = {
    name: "the kernel arms it with its per-core bit before every task; a regcmd write without "
          "that bit makes the task never complete (seeds 003 section 4, rocket_job.c)"
    for name in ("CNA_S_POINTER", "CORE_S_POINTER")
}
# register name -> block, for the registers TaskBuilder._allow has let through
_ALLOWED: dict[str, str] = {}


def _access(where: Reloc, chunk: int, pieces: int, pitch: int) -> Access:
    pieces = max(int(pieces), 1)
    if pieces > 1 and pitch < chunk:
        raise LoweringError(f"a DMA stream of {pieces} runs of {chunk} B cannot be {pitch} B apart")
    return Access(where.buffer, where.offset, (pieces - 1) * int(pitch) + int(chunk),
                  pieces * int(chunk), pieces, int(pitch) if pieces > 1 else 0)


class TaskBuilder:
    """Builder: add register writes in program order, then ``finish``."""

    def __init__(self, name: str, profile: ChipProfile) -> None:
        self.name = name
        self.profile = profile
        self._words: list[int] = []
        self._relocs: dict[int, Reloc] = {}
        self._blocks: set[str] = set()
        self._chain_refusal = ""
        self._reads: list[Access] = []
        self._writes: list[Access] = []

    def reads(self, where: Reloc, chunk: int, pieces: int = 1, pitch: int = 0) -> None:
        """Declare a DMA read of ``pieces`` runs of ``chunk`` bytes, ``pitch`` apart."""
        self._reads.append(_access(where, chunk, pieces, pitch))

    def writes(self, where: Reloc, chunk: int, pieces: int = 1, pitch: int = 0) -> None:
        """Declare a DMA write of ``pieces`` runs of ``chunk`` bytes, ``pitch`` apart."""
        self._writes.append(_access(where, chunk, pieces, pitch))

    def write(self, reg: str, **fields: int) -> None:
        self._append(reg, R.emit(reg, **fields))

    def write_each(self, reg: str, field: str, values) -> None:
        """``write(reg, field=v)`` for each v of ``values``, in order (a LUT's entries)."""
        words = R.emit_each(reg, field, values)
        block = _ALLOWED.get(reg)
        if block is None:
            block = self._allow(reg)
        self._blocks.add(block)
        self._words.extend(words)

    def write_raw(self, reg: str, value: int) -> None:
        self._append(reg, R.emit_raw(reg, value))

    def write_addr(self, reg: str, buffer: str, offset: int = 0) -> None:
        """An address register: the word is patched with ``buffer``'s address + ``offset``."""
        self._relocs[len(self._words)] = Reloc(buffer, offset)
        self._append(reg, R.emit_raw(reg, 0))

    def refuse_chaining(self, reason: str) -> None:
        self._chain_refusal = reason

    def _append(self, reg: str, word: int) -> None:
        block = _ALLOWED.get(reg)
        if block is None:
            block = self._allow(reg)
        self._blocks.add(block)
        self._words.append(word)

    def _allow(self, reg: str) -> str:
        """``reg``'s block once it passes the checks below; remembered in _ALLOWED, since
        every emitted word comes through _append and the answer depends on ``reg`` alone."""
        block = R.register(reg).block
        if reg in _FORBIDDEN:
            raise LoweringError(f"task {self.name!r}: {reg} must not be written from a regcmd: "
                                f"{_FORBIDDEN[reg]}")
        if block == "PC":
            raise LoweringError(f"task {self.name!r}: {reg} is a PC register; the PC trailer "
                                f"(finish/link) is the only place a task programs the PC")
        _ALLOWED[reg] = block
        return block

    def finish(self) -> EmittedTask:
        mask = enable_mask(self.profile, self._blocks)
        trailer = [
            0,                                            # filler; PC_BASE_ADDRESS when chained
            R.emit("PC_REGISTER_AMOUNTS", PC_DATA_AMOUNT=0),
            R.word(R.OP_40, 0, 0),
            R.word(R.OP_ENABLE, mask, R.register("PC_OPERATION_ENABLE").offset),
        ]
        return EmittedTask(self.name, tuple(self._words + trailer),
                           MappingProxyType(dict(self._relocs)), mask,
                           chainable=not self._chain_refusal, chain_refusal=self._chain_refusal,
                           reads=tuple(self._reads), writes=tuple(self._writes))


@dataclass(frozen=True)
class TaskTemplate:
    """A finished task whose addresses are *roles* (``Reloc(role, delta)``) rather than
    buffers: the words never depend on addresses (address words hold 0 until ``patch``), so a
    task emitter builds the template once per description and ``bind`` fills the roles in --
    the compile-time lever of emitting the same task shape thousands of times (issue 9)."""

    words: tuple[int, ...]
    relocs: tuple[tuple[int, str, int], ...]                     # (word index, role, delta)
    enable: int
    chain_refusal: str
    reads: tuple[Access, ...]                                    # Access.buffer is the role
    writes: tuple[Access, ...]

    def bind(self, name: str, where: Mapping[str, Reloc]) -> EmittedTask:
        """The task with every role replaced by its Reloc in ``where`` (offsets added)."""
        def at(a: Access) -> Access:
            r = where[a.buffer]
            return Access(r.buffer, r.offset + a.offset, a.extent, a.nbytes, a.pieces, a.pitch)

        relocs = {}
        for i, role, delta in self.relocs:
            r = where[role]
            relocs[i] = Reloc(r.buffer, r.offset + delta)
        return EmittedTask(name, self.words, MappingProxyType(relocs), self.enable,
                           chainable=not self.chain_refusal, chain_refusal=self.chain_refusal,
                           reads=tuple(at(a) for a in self.reads),
                           writes=tuple(at(a) for a in self.writes))


def template_of(task: EmittedTask) -> TaskTemplate:
    """The template of a task built with role names as its buffer names."""
    return TaskTemplate(task.words, tuple((i, r.buffer, r.offset) for i, r in task.relocs.items()),
                        task.enable, task.chain_refusal, task.reads, task.writes)


# ---------------------------------------------------------------------------------------------
# self-chaining: N tasks, one kick
# ---------------------------------------------------------------------------------------------

def pc_data_amount(words: int) -> int:
    """PC_REGISTER_AMOUNTS.PC_DATA_AMOUNT for a segment of ``words`` words: the PC fetches
    128-bit pairs and the field holds the pair count minus one (Linux rocket_job.c programs
    (regcmd_count + 1) / 2 - 1 for a job's first task; Mesa's chained value agrees for the
    126-word conv tasks)."""
    if words < TRAILER_WORDS:
        raise LoweringError(f"a regcmd segment of {words} words cannot hold the PC trailer")
    return (words + 1) // 2 - 1


def redirect_words(next_count: int) -> tuple[int, int]:
    """The trailer's filler and the word after it when the PC goes on to a segment of
    ``next_count`` words: PC_BASE_ADDRESS (its address a relocation to that segment) and the
    segment's PC_REGISTER_AMOUNTS (notes: regcmd-task-model.md, "Contiguous chaining")."""
    return (R.emit_raw("PC_BASE_ADDRESS", 0),
            R.emit("PC_REGISTER_AMOUNTS", PC_DATA_AMOUNT=pc_data_amount(next_count)))


@dataclass(frozen=True)
class Kick:
    """Tasks laid out contiguously in one regcmd buffer and linked into one hardware kick.

    The PC starts at the first segment and follows each trailer's PC_BASE_ADDRESS to the next.
    ``task_number`` is what the submitter must program into PC_TASK_CON.TASK_NUMBER -- it, not
    the trailer chain, stops the PC (notes: regcmd-task-model.md, "TASK_NUMBER = N is the true
    stop"). The mainline kernel always writes 1 (rocket_job.c); the batched-submit kernel of the
    notes' library takes a job listing every segment and writes TASK_NUMBER = task count, and
    that job's task list is ``job_tasks``.
    """

    regcmd_buffer: str
    base_offset: int
    words: tuple[int, ...]          # the whole laid-out region, padding words are 0
    relocs: Mapping[int, Reloc]     # word index in ``words`` -> address
    task_offsets: tuple[int, ...]   # word index where each task starts
    task_counts: tuple[int, ...]
    enables: tuple[int, ...]
    reads: tuple[Access, ...] = ()      # every task's DMA reads / writes (EmittedTask)
    writes: tuple[Access, ...] = ()
    chainable: bool = True              # every task may run self-chained (EmittedTask)

    @property
    def task_number(self) -> int:
        return len(self.task_offsets)

    @property
    def first_count(self) -> int:
        return self.task_counts[0]

    @property
    def nbytes(self) -> int:
        return 8 * len(self.words)

    def array(self, addresses: Mapping[str, int]) -> np.ndarray:
        return np.asarray(patch(self.words, self.relocs, addresses), dtype="<u8")

    def job_tasks(self, regcmd_address: int) -> list[tuple[int, int]]:
        """(regcmd address, word count) per segment, for a batched SUBMIT of this kick."""
        start = regcmd_address + self.base_offset
        return [(start + 8 * off, n) for off, n in zip(self.task_offsets, self.task_counts)]


def link(tasks: Sequence[EmittedTask], profile: ChipProfile, regcmd_buffer: str,
         base_offset: int = 0) -> Kick:
    """Lay ``tasks`` out back to back in ``regcmd_buffer`` from ``base_offset`` and chain them.

    Each segment starts at the previous one's word count rounded up to ``chain_word_align``
    (even: a segment start must be 16-byte aligned for PC_BASE_ADDRESS). Each non-final
    trailer's filler becomes PC_BASE_ADDRESS -> next segment and its PC_REGISTER_AMOUNTS the
    next segment's length (notes: regcmd-task-model.md "Contiguous chaining"; seeds 003 section
    4); the final trailer keeps its filler (the chain seal).
    """
    if not tasks:
        raise LoweringError("link() needs at least one task")
    if base_offset % profile.regcmd_align_bytes:
        raise LoweringError(f"a chained kick must start {profile.regcmd_align_bytes}-byte "
                            f"aligned; offset {base_offset:#x} is not")
    if len(tasks) > 1:
        for t in tasks:
            if not t.chainable:
                raise LoweringError(
                    f"task {t.name!r} cannot be self-chained: {t.chain_refusal}. Submit it as a "
                    f"separate task of the job instead (one kick per task)")
    cap = (1 << R.register("PC_TASK_CON").field("TASK_NUMBER").width) - 1
    if len(tasks) > cap:
        raise LoweringError(f"{len(tasks)} tasks exceed PC_TASK_CON.TASK_NUMBER's maximum "
                            f"{cap}; split them over several kicks")
    align = profile.chain_word_align
    offsets, pos = [], 0
    for t in tasks:
        offsets.append(pos)
        pos += -(-len(t) // align) * align
    words = [0] * pos
    relocs: dict[int, Reloc] = {}
    for i, (t, off) in enumerate(zip(tasks, offsets)):
        words[off:off + len(t)] = t.words
        for wi, rel in t.relocs.items():
            relocs[off + wi] = rel
        if i + 1 < len(tasks):
            nxt = tasks[i + 1]
            filler = off + len(t) - TRAILER_WORDS
            if words[filler] != 0:
                raise LoweringError(f"task {t.name!r} does not end in the standard trailer")
            words[filler:filler + 2] = redirect_words(len(nxt))
            relocs[filler] = Reloc(regcmd_buffer, base_offset + 8 * offsets[i + 1])
    return Kick(regcmd_buffer, base_offset, tuple(words), MappingProxyType(relocs),
                tuple(offsets), tuple(len(t) for t in tasks), tuple(t.enable for t in tasks),
                tuple(a for t in tasks for a in t.reads), tuple(a for t in tasks for a in t.writes),
                all(t.chainable for t in tasks))
