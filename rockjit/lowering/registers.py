"""The one way to build a regcmd word: ``emit(reg, **fields)`` over the declarative table.

Word format (design.md convention 6, confirmed by the conformance programs): bits 63..48 are
the op, whose high byte is the target block and low byte 0x01 for a register write; bits
47..16 hold the 32-bit value; bits 15..0 the register's byte offset.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from .regtable import BLOCKS

OP_WRITE = 0x01
# The PC trailer uses two special op low bytes (notes: encodings/regcmd-task-model.md; the
# conformance README): 0x41 for the OP_40 word and 0x81 for the final OPERATION_ENABLE.
OP_40 = 0x41
OP_ENABLE = 0x81


class RegisterError(ValueError):
    """A register or field name is unknown, or a value does not fit its field."""


@dataclass(frozen=True)
class Field:
    name: str
    lo: int
    hi: int

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lo


@dataclass(frozen=True)
class Register:
    block: str
    name: str
    offset: int
    target: int
    fields: tuple[Field, ...]

    @property
    def full_name(self) -> str:
        return f"{self.block}_{self.name}"

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        known = ", ".join(f.name for f in self.fields)
        raise RegisterError(f"{self.full_name} has no field {name!r}; its fields are: {known}")

    @cached_property
    def _slots(self) -> dict[str, tuple[int, int]]:
        """(lo, 1 << width) by field name: pack runs once per field of every emitted word, and
        a scan of ``fields`` per field was the compile's largest per-word cost."""
        return {f.name: (f.lo, 1 << f.width) for f in self.fields}

    def pack(self, **fields: int) -> int:
        value = 0
        slots = self._slots
        for name, v in fields.items():
            slot = slots.get(name)
            if slot is None:
                self.field(name)                      # raises, naming the known fields
            lo, limit = slot
            v = int(v)
            if v < 0 or v >= limit:
                raise RegisterError(f"{self.full_name}.{name} = {v} does not fit its "
                                    f"{self.field(name).width}-bit field")
            value |= v << lo
        return value

    def unpack(self, value: int) -> dict[str, int]:
        return {f.name: (value >> f.lo) & ((1 << f.width) - 1) for f in self.fields}


@lru_cache(maxsize=None)
def _index() -> tuple[dict[str, Register], dict[tuple[int, int], Register]]:
    by_name: dict[str, Register] = {}
    by_addr: dict[tuple[int, int], Register] = {}
    for block, (target, regs) in BLOCKS.items():
        for name, offset, fields in regs:
            reg = Register(block, name, offset, target,
                           tuple(Field(n, lo, hi) for n, lo, hi in fields))
            by_name[reg.full_name] = reg
            by_addr[(target, offset)] = reg
    return by_name, by_addr


def register(full_name: str) -> Register:
    """Look a register up by ``BLOCK_NAME``, e.g. ``CNA_CONV_CON1``."""
    try:
        return _index()[0][full_name]
    except KeyError:
        raise RegisterError(f"unknown register {full_name!r}") from None


def lookup(target: int, offset: int) -> Register | None:
    return _index()[1].get((target, offset))


def word(op: int, value: int, offset: int) -> int:
    return ((op & 0xFFFF) << 48) | ((value & 0xFFFFFFFF) << 16) | (offset & 0xFFFF)


def emit(full_name: str, **fields: int) -> int:
    """One register-write word; every field not named is zero."""
    reg = register(full_name)
    return word(reg.target | OP_WRITE, reg.pack(**fields), reg.offset)


def emit_each(full_name: str, field_name: str, values) -> list[int]:
    """``emit(full_name, field_name=v)`` for every integer v of ``values``, built as one
    numpy array: a table written through an access port is hundreds of words of one field."""
    a = np.asarray(values)
    reg = register(full_name)
    slot = reg._slots.get(field_name)
    if a.ndim != 1 or a.dtype.kind not in "iu" or slot is None or a.size == 0 \
            or int(a.min()) < 0 or int(a.max()) >= slot[1]:
        return [emit(full_name, **{field_name: v}) for v in values]  # raises on a bad value
    head = ((reg.target | OP_WRITE) & 0xFFFF) << 48 | (reg.offset & 0xFFFF)
    return ((a.astype(np.uint64) << np.uint64(slot[0] + 16)) | np.uint64(head)).tolist()


def emit_raw(full_name: str, value: int) -> int:
    """A register-write word whose value is a whole 32-bit quantity (addresses, strides)."""
    reg = register(full_name)
    if not 0 <= value < (1 << 32):
        raise RegisterError(f"{full_name} = {value:#x} does not fit 32 bits")
    return word(reg.target | OP_WRITE, value, reg.offset)


def decode(w: int) -> tuple[int, int, int]:
    """Split a word into (op, value, offset)."""
    return (w >> 48) & 0xFFFF, (w >> 16) & 0xFFFFFFFF, w & 0xFFFF
