"""Reader for CTranslate2's ``model.bin`` (binary version 6), written from the format's public
description in the ctranslate2 sources (``specs/model_spec.py``, ``include/ctranslate2/types.h``).

Layout, all integers little-endian:

    u32 binary_version          # 6
    str spec_name               # e.g. "WhisperSpec"
    u32 spec_revision
    u32 num_variables
    num_variables x { str name; u8 rank; u32 dims[rank]; u8 dtype_id; u32 num_bytes;
                      u8 data[num_bytes] }
    u32 num_aliases
    num_aliases x { str alias; str variable_name }

where ``str`` is a u16 byte count that includes a trailing NUL, then the UTF-8 bytes and the NUL.
A model may ship split into parts (``model.bin.part1``, ``model.bin.part2``, ...): the parts
are read as one byte stream.  Anything that does not parse exactly - a short file, a size that
disagrees with the shape, a dtype id we do not know, bytes left over - is refused with the path
and byte offset, never guessed at.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import ml_dtypes
import numpy as np

from ..errors import WeightError

SUPPORTED_VERSIONS = (6,)
# The order of ctranslate2's DataType enum (types.h): the id is the index.
DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.int16),
                                np.dtype(np.int32), np.dtype(np.float16),
                                np.dtype(ml_dtypes.bfloat16))
_MAX_RANK = 8  # no CTranslate2 spec has more; a larger rank means we are reading garbage


class ModelFileError(WeightError):
    """A CTranslate2 model file that is truncated, corrupt or of an unsupported version."""


@dataclass
class CT2Model:
    """A parsed model.bin: its spec name and revision, variables by name, and aliases (another
    name for a variable, e.g. a tied output projection)."""
    spec: str
    revision: int
    version: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)
    source: str = ""
    # names a converter has read: what is left over is a variable it does not understand
    used: set[str] = field(default_factory=set)

    def get(self, name: str) -> np.ndarray:
        """A variable by its name or an alias."""
        key = self.aliases.get(name, name)
        self.used.add(key)
        if key not in self.variables:
            raise ModelFileError(f"{self.source}: no variable '{name}' in this {self.spec} "
                                 f"model; is it a different architecture or spec revision?")
        return self.variables[key]

    def scalar(self, name: str) -> int | float:
        v = self.get(name)
        if v.size != 1:
            raise ModelFileError(f"{self.source}: variable '{name}' has shape {v.shape}, "
                                 f"expected a scalar")
        return v.reshape(()).item()


def _part_number(path: Path) -> int:
    m = re.search(r"\.part(\d+)$", path.name)
    return int(m.group(1)) if m else -1


def resolve_model_files(src: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The file(s) making up one model: a model.bin, its parts listed in order, or a directory
    holding either ``model.bin`` or ``model.bin.part1..N``."""
    if isinstance(src, (str, os.PathLike)):
        src = [src]
    paths = [Path(p) for p in src]
    if len(paths) == 1 and paths[0].is_dir():
        d = paths[0]
        if (d / "model.bin").is_file():
            return [d / "model.bin"]
        parts = sorted(d.glob("model.bin.part*"), key=_part_number)
        if not parts:
            raise ModelFileError(f"directory '{d}' holds neither model.bin nor "
                                 f"model.bin.part1, part2, ...; pass the model file itself")
        numbers = [_part_number(p) for p in parts]
        if numbers != list(range(1, len(parts) + 1)):
            raise ModelFileError(f"directory '{d}': model parts {numbers} are not numbered "
                                 f"1..{len(parts)}; a part is missing")
        return parts
    for p in paths:
        if not p.is_file():
            raise ModelFileError(f"CTranslate2 model file '{p}' does not exist")
    return paths


class _Stream:
    """Bounds-checked little-endian reads over the concatenated parts; errors name the part
    and the offset within it."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.starts: list[int] = []
        chunks = []
        total = 0
        for p in paths:
            self.starts.append(total)
            data = p.read_bytes()
            chunks.append(data)
            total += len(data)
        self.buf = bytearray(b"".join(chunks)) if len(chunks) > 1 else bytearray(chunks[0])
        self.pos = 0
        self.label = (str(paths[0]) if len(paths) == 1
                      else " + ".join(str(p) for p in paths))

    def where(self, offset: int | None = None) -> str:
        offset = self.pos if offset is None else offset
        i = max(k for k, s in enumerate(self.starts) if s <= offset) if self.paths else 0
        if len(self.paths) == 1:
            return f"'{self.paths[0]}' at byte {offset}"
        return (f"'{self.paths[i]}' at byte {offset - self.starts[i]} "
                f"(byte {offset} of the joined parts {self.label})")

    def fail(self, what: str, offset: int | None = None) -> ModelFileError:
        return ModelFileError(f"CTranslate2 model {self.where(offset)}: {what}")

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes; return where they start."""
        if self.pos + n > len(self.buf):
            # a truncation is at the end of the last part, wherever the cut-off read began
            raise self.fail(f"the file ends {len(self.buf) - self.pos} bytes into {what} "
                            f"(which needs {n} bytes from joined offset {self.pos}): the file "
                            f"is truncated; re-download or re-join it", len(self.buf))
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str, what: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        return struct.unpack_from("<" + fmt, self.buf, self.take(size, what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("H", f"the length of {what}")
        start = self.take(n, what)
        raw = bytes(self.buf[start:start + n])
        if n == 0 or raw[-1] != 0:
            raise self.fail(f"{what} is not NUL-terminated: the file is corrupt", start)
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text: the file is corrupt", start) from None


def read_model_bin(src: str | os.PathLike | Sequence[str | os.PathLike]) -> CT2Model:
    """Parse a CTranslate2 model (see resolve_model_files for what ``src`` may be).

    Arrays are views of one buffer holding the file, in the stored dtype and shape."""
    paths = resolve_model_files(src)
    s = _Stream(paths)
    (version,) = s.unpack("I", "the binary version")
    if version not in SUPPORTED_VERSIONS:
        raise s.fail(f"binary version {version} is not supported (this reader knows "
                     f"{SUPPORTED_VERSIONS}); is this a CTranslate2 model.bin?", 0)
    spec = s.string("the spec name")
    (revision,) = s.unpack("I", "the spec revision")
    (count,) = s.unpack("I", "the variable count")
    variables: dict[str, np.ndarray] = {}
    for i in range(count):
        at = s.pos
        name = s.string(f"the name of variable {i}")
        (rank,) = s.unpack("B", f"the rank of '{name}'")
        if rank > _MAX_RANK:
            raise s.fail(f"variable '{name}' claims rank {rank}: the file is corrupt", at)
        dims = s.unpack("I" * rank, f"the shape of '{name}'")
        dtype_id, nbytes = s.unpack("BI", f"the dtype and size of '{name}'")
        if dtype_id >= len(DTYPES):
            raise s.fail(f"variable '{name}' has dtype id {dtype_id}, not one of the known "
                         f"{len(DTYPES)} (float32, int8, int16, int32, float16, bfloat16): "
                         f"a newer format or a corrupt file", at)
        dtype = DTYPES[dtype_id]
        want = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        if nbytes != want:
            raise s.fail(f"variable '{name}' of shape {tuple(dims)} {dtype.name} should hold "
                         f"{want} bytes but says {nbytes}: the file is corrupt", at)
        if name in variables:
            raise s.fail(f"variable '{name}' appears twice: the file is corrupt", at)
        start = s.take(nbytes, f"the data of '{name}'")
        variables[name] = np.frombuffer(s.buf, dtype, count=want // dtype.itemsize,
                                        offset=start).reshape(dims)
    (n_alias,) = s.unpack("I", "the alias count")
    aliases: dict[str, str] = {}
    for i in range(n_alias):
        at = s.pos
        alias = s.string(f"alias {i}")
        target = s.string(f"the target of alias '{alias}'")
        if target not in variables:
            raise s.fail(f"alias '{alias}' points at '{target}', which is not a variable", at)
        aliases[alias] = target
    if s.pos != len(s.buf):
        raise s.fail(f"{len(s.buf) - s.pos} bytes follow the last alias: the file is corrupt, "
                     f"or parts were joined that do not belong together")
    return CT2Model(spec, revision, version, variables, aliases, source=s.label)
