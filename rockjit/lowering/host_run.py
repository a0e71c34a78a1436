"""Running a host-only ``OpLowering`` (host_rules.py) directly through the C host-op library,
without a runtime Program: tests, and compile-time folding of a node on the host."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.graph import Node
from ..ir.types import DType
from .host_rules import DESC_BYTES, INPUT_SLOTS, lower_on_host
from .op_lowering import BufferSpec, HostStep, OpLowering
from .regcmd import LoweringError


def run_on_host(program: OpLowering, inputs: Sequence[np.ndarray],
                stats: dict[str, int] | None = None) -> list[np.ndarray]:
    """Run a host-only OpLowering through the C library on fresh numpy buffers.

    ``inputs[i]`` binds input buffer ``bind=i``; returns the outputs by ``bind``. ``stats``,
    when given, receives ``steps`` and ``bytes`` (the bytes the C kernels report moving)."""
    from ..runtime._ffi import ffi, lib, check  # the C core; lowering itself does not need it

    mem: dict[str, np.ndarray] = {}
    outs: dict[int, tuple[str, BufferSpec]] = {}
    for b in program.buffers:
        buf = np.zeros(max(b.nbytes, 1), np.uint8)
        if b.role == "input":
            arr = np.array(inputs[b.bind], dtype=DType(b.dtype).to_numpy(), order="C")
            if arr.shape != tuple(b.shape):
                raise LoweringError(f"run_on_host: input {b.bind} has shape {arr.shape}, the "
                                    f"program expects {b.shape}")
            buf[:arr.nbytes] = arr.reshape(-1).view(np.uint8)
        elif b.role == "const":
            buf[:b.nbytes] = b.data
        elif b.role == "output":
            outs[b.bind] = (b.name, b)
        mem[b.name] = buf
    moved = 0
    for s in program.steps:
        if not isinstance(s, HostStep):
            raise LoweringError("run_on_host runs host steps only; this program has NPU steps")
        d = s.operands["desc"]
        desc = ffi.new("rj_host_op *")
        ffi.memmove(desc, mem[d.buffer][d.offset:d.offset + DESC_BYTES].tobytes(), DESC_BYTES)
        slots = ["dst", *[k for k in INPUT_SLOTS if k in s.operands]]
        bufs = ffi.new("rj_host_buf[]", len(slots))
        for i, k in enumerate(slots):
            sl = s.operands[k]
            arr = mem[sl.buffer]
            bufs[i].data = ffi.from_buffer(arr) + sl.offset
            bufs[i].size = sl.nbytes
        nbytes = ffi.new("uint64_t *")
        err = ffi.new("rj_err *")
        check(lib.rj_host_op_run(desc, bufs, len(slots), nbytes, err), err)
        moved += int(nbytes[0])
    if stats is not None:
        stats["steps"] = len(program.steps)
        stats["bytes"] = moved
    result = []
    for i in sorted(outs):
        name, b = outs[i]
        dt = DType(b.dtype).to_numpy()
        result.append(mem[name][:b.nbytes].view(dt).reshape(b.shape).copy())
    return result


def run_node_on_host(node: Node, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Lower one node with ``HOST_RULES`` and run it: the node's result."""
    (out,) = run_on_host(lower_on_host(node), inputs)
    return out
