"""Run one ``OpLowering`` through the real runtime (ProgramBuilder -> Program.run on a device).

The emitter tests use this instead of a model of the runtime: every buffer of the op becomes
its own BO, relocations are patched by the runtime at load, NPU steps run as runtime jobs and
host steps as the C host-step / host-op library steps the compiled programs use
(``program.runtime_host_step``), all in one ``rj_program_run``.

Outputs and scratch start filled with a sentinel byte, so a byte the program should write but
does not is visible; ``zero`` scratch (BufferSpec.zero) starts as zeros, as the pipeline
guarantees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .arith import round_up
from .op_lowering import HostStep, NpuStep, OpLowering
from .schedule import runtime_jobs

PAGE = 4096
SENTINEL = 0xAA
_ROLE = {"const": "weights", "regcmd": "regcmd"}


@dataclass
class OpRun:
    """Every buffer's bytes after the run (by name) and the runtime's counters."""

    mem: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    host_steps: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.mem[name]

    @property
    def kicks(self) -> int:
        return self.stats.get("kicks", 0)


def run_op_lowering(prog: OpLowering, inputs: Mapping[str, Any], device: Any = None,
                   sentinel: int = SENTINEL) -> OpRun:
    """``inputs``: bytes for every input buffer, by name. ``device``: a runtime device (default:
    a strict single-core SimDevice made for this run)."""
    from ..runtime import ProgramBuilder, SimDevice
    from ..runtime.program import PlacedTask as RtTask
    from .host_step_spec import runtime_host_step

    own = device is None
    dev = SimDevice(cores=1, strict=True) if own else device
    try:
        b = ProgramBuilder(dev)
        bos: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for spec in prog.buffers:
            size = round_up(max(spec.nbytes, 1), PAGE)
            bos[spec.name] = b.add_bo(size, role=_ROLE.get(spec.role, "io"))
            sizes[spec.name] = size
            if spec.role == "const":
                data = np.zeros(size, np.uint8)
                raw = np.ascontiguousarray(spec.data).reshape(-1).view(np.uint8)
                data[:raw.size] = raw
            elif spec.role == "input":
                if spec.name not in inputs:
                    raise KeyError(f"no bytes given for input buffer {spec.name!r}")
                raw = np.ascontiguousarray(np.asarray(inputs[spec.name])).reshape(-1).view(np.uint8)
                # a previous run's whole (page-rounded) buffer may be handed on: keep what fits
                data = np.zeros(size, np.uint8)
                data[:min(raw.size, size)] = raw[:size]
            elif spec.role in ("output", "scratch") and not spec.zero:
                data = np.full(size, sentinel, np.uint8)
            else:
                data = np.zeros(size, np.uint8)
            b.upload(bos[spec.name], data)
        names = {n: (bo, 0) for n, bo in bos.items()}
        by_name = {s.name: s for s in prog.buffers}
        written: set[tuple[str, int]] = set()
        for job in prog.jobs():
            for k in job.kicks:
                if (k.regcmd_buffer, k.base_offset) in written:
                    continue
                written.add((k.regcmd_buffer, k.base_offset))
                rbo = bos[k.regcmd_buffer]
                b.write_words(rbo, np.asarray(k.words, dtype="<u8"), k.base_offset // 8)
                for wi, rel in k.relocs.items():
                    b.add_reloc(rbo, k.base_offset // 8 + wi, bos[rel.buffer], rel.offset)
        for step in prog.steps:
            if isinstance(step, NpuStep):
                ids = []
                for job in step.jobs:
                    wr = {bos[n] for n in job.writes}
                    rd = {bos[n] for n in job.reads} | {
                        bos[r.buffer] for k in job.kicks for r in k.relocs.values()}
                    rd -= wr
                    rd -= {bos[k.regcmd_buffer] for k in job.kicks}
                    for kicks, chained in runtime_jobs(job):
                        tl = [RtTask(bos[k.regcmd_buffer], k.base_offset + 8 * off, cnt)
                              for k in kicks for off, cnt in zip(k.task_offsets, k.task_counts)]
                        ids.append(b.add_job(tl, reads=sorted(rd), writes=sorted(wr),
                                             chained=chained))
                b.add_npu_step(ids)
            else:
                assert isinstance(step, HostStep)
                b.add_host_step(runtime_host_step(step, names, by_name.get))
        program = b.build()
        try:
            program.run()
            out = OpRun(stats=program.stats(),
                        host_steps=[s.kind for s in prog.steps if isinstance(s, HostStep)])
            for spec in prog.buffers:
                out.mem[spec.name] = np.frombuffer(program.read(bos[spec.name], sizes[spec.name]),
                                                   np.uint8).copy()
            return out
        finally:
            program.close()
    finally:
        if own:
            dev.close()
