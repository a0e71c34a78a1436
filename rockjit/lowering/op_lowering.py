"""What one IR op becomes: the contract between the per-op emitters and the pipeline.

An emitter returns an ``OpLowering``: the named buffers it touches and an ordered list of steps.
Buffer names are local to the op; the pipeline binds them (``BufferSpec.bind``) to the op's
input/output values and places everything else (scratch, constants) in the program's arena or
its resident-weight buffer.  Steps are either NPU steps (jobs of self-chained kicks, the jobs of
one step being independent so they may run on different cores at once) or host steps (a kind
the runtime's C host-step library implements, with operands given as buffer slices).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence, Union

import numpy as np

from .layouts import CubeLayout
from .regcmd import Kick

Role = Literal["input", "output", "scratch", "const", "regcmd"]


@dataclass(frozen=True)
class BufferSpec:
    """A buffer an op reads or writes.

    input/output: bound by the pipeline to the op's operand/result number ``bind``; ``layout``
    is the cube layout the op reads or writes there (None: row-major ``dtype`` ``shape``).
    scratch: op-private device memory of ``nbytes``.  const: bytes fixed at compile time
    (prepacked weights, bias cubes, ones vectors), uploaded once with the resident weights.
    regcmd: where the op's kicks are laid out (each Kick names it and its base offset); the
    pipeline places it in the program's regcmd buffer and patches relocations at load.
    """

    name: str
    role: Role
    nbytes: int
    layout: CubeLayout | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    bind: int | None = None
    data: np.ndarray | None = None
    align: int = 64
    # scratch or output: bytes the op's steps never write (cube padding) must read as zero,
    # so the buffer is zero-filled once at load and never shared with another buffer
    zero: bool = False


@dataclass(frozen=True)
class Slice:
    """``nbytes`` of buffer ``buffer`` starting at ``offset``."""

    buffer: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class NpuJob:
    """One SUBMIT job: its kicks run in order on one core."""

    kicks: tuple[Kick, ...]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    integer: bool = False       # int8 jobs: never self-chained, partials summed on the host

    @property
    def tasks(self) -> int:
        return sum(k.task_number for k in self.kicks)


@dataclass(frozen=True)
class NpuStep:
    """Independent jobs; the scheduler spreads them over the cores and fences them together."""

    jobs: tuple[NpuJob, ...]


@dataclass(frozen=True)
class HostStep:
    """One call into the runtime's host-step library (``kind`` names the C routine)."""

    kind: str
    operands: Mapping[str, Slice]
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def moved_bytes(self) -> int:
        """The bytes the step moves, as stats and the cost model count them: a layout step's
        tensor, or what a strided step over part of its buffers says it moves (``bytes``),
        else every operand slice once."""
        p = self.params
        if "bytes" in p:
            return int(p["bytes"])
        if "height" in p:
            return int(p["height"] * p["width"] * p["channels"] * p["esize"])
        if "kernels" in p:
            return int(p["kernels"] * p["channels"] * p["kh"] * p["kw"] * p["esize"])
        return sum(s.nbytes for s in self.operands.values())

    def footprints(self) -> list[tuple[str, str, tuple[int, int, int, int]]]:
        """(operand, buffer name, the bytes of that buffer the step touches) of every operand
        with bytes, its output last. The bytes are a strided run (byte offset in the buffer,
        pieces, pitch, chunk): what a strided step declares (``runs``, by buffer name), else
        the operand's whole slice."""
        declared = self.params.get("runs", {})
        out = []
        for opname in sorted(self.operands, key=lambda o: o == "dst"):
            sl = self.operands[opname]
            if sl.nbytes > 0:
                run = declared.get(sl.buffer) or (sl.offset, 1, sl.nbytes, sl.nbytes)
                out.append((opname, sl.buffer, run))
        return out


Step = Union[NpuStep, HostStep]


@dataclass(frozen=True)
class OpLowering:
    buffers: tuple[BufferSpec, ...]
    steps: tuple[Step, ...]
    macs: int = 0
    # tile_choice.TileChoice of each conv/matmul plan the op runs (the tiling decisions)
    tile_choices: tuple[Any, ...] = ()

    def buffer(self, name: str) -> BufferSpec:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"op lowering has no buffer {name!r}")

    def jobs(self) -> Sequence[NpuJob]:
        return [j for s in self.steps if isinstance(s, NpuStep) for j in s.jobs]

    @property
    def macs_per_task(self) -> float:
        """The op's MACs shared evenly over its NPU tasks (how stats and the cost model charge
        a task: the emitters report MACs per op, not per task)."""
        return self.macs / max(1, sum(j.tasks for j in self.jobs()))
