"""NpuProgram: a lowered graph built into one runtime Program, run with numpy in and out.

Build (once):
  * schedule the calls (schedule.py), compute each arena buffer's live interval in steps, plan
    the arena (memory.py);
  * BOs: one ``arena`` (activations, scratch, graph inputs/outputs), one ``weights`` (every
    const BufferSpec and compile-time tensor, uploaded once), one ``regcmd`` (every kick's
    words); address words become runtime relocations (``add_reloc``);
  * jobs and host steps in schedule order.
Run (per call): write the inputs (cast to the dtype the plan holds them in), ``Program.run()``
(the whole step list in one C call), read the outputs (cast back to the graph's dtypes).

Multicore: the rocket driver gives each fd its own IOVA space and a job may only touch BOs of
its own context (notes: perf/iova-and-multicore.md), so jobs on different cores would need
the arena/weights/regcmd BOs in every context. The runtime has no cross-context BO sharing
yet, so the program runs every job in context 0; the schedule's per-job core is kept in the
stats (``planned_cores``) for when it does.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..ir.types import DType
from .memory import ArenaPlan, BufReq, align_up, check_plan, plan_arena
from .opprogram import HostStep, NpuJob
from .pipeline import LoweredGraph
from .rules.base import CubeForm, RowForm
from .schedule import Step, call_spans, runtime_jobs, schedule

_LAYOUT_PARAMS = {"height", "width", "channels", "c2", "esize", "line_stride", "surf_stride",
                  "kernels", "kh", "kw", "n_group", "k_group", "group", "rows", "cols", "eps",
                  "table_rows"}


def _spec_dtype(spec) -> str:
    if spec is None:
        return "f16"
    if spec.dtype:
        return spec.dtype
    if spec.layout is not None:
        return np.dtype(spec.layout.dtype).name
    return "f16"


def runtime_host_step(hs: HostStep, names: Mapping[str, tuple[int, int]],
                      spec_of: Callable[[str], Any]):
    """A lowering HostStep -> the runtime's ``rj_host_step``.

    ``names``: buffer name -> (program BO, byte offset of the buffer); ``spec_of(name)``: the
    op's BufferSpec (for an operand's default dtype). Runtime kinds (host_steps.HOST_STEPS)
    take per-operand dtypes and row strides from ``params["dtypes"][operand]`` /
    ``params["row_strides"][operand]`` (the emitters' convention, emitters/reduce.py), else
    from ``params["<operand>_dtype"]`` / ``"<operand>_row_stride"``, else the BufferSpec;
    the host-op kinds (host_rules.HOST_KINDS) carry everything in their descriptor."""
    from ..runtime import host_steps as HS

    ctor = HS.HOST_STEPS.get(hs.kind)
    from .host_rules import HOST_KINDS
    if ctor is None or hs.kind in HOST_KINDS:
        return _host_op_step(names, hs, HS)
    dtypes = hs.params.get("dtypes", {}) or {}
    strides = hs.params.get("row_strides", {}) or {}
    kw = {}
    for opname, sl in hs.operands.items():
        bo, base = names[sl.buffer]
        dt = dtypes.get(opname) or hs.params.get(f"{opname}_dtype") or _spec_dtype(spec_of(sl.buffer))
        rs = strides.get(opname, hs.params.get(f"{opname}_row_stride", 0))
        kw[opname] = HS.Operand(bo, base + sl.offset, dt, int(rs))
    for k, v in hs.params.items():
        if k in _LAYOUT_PARAMS:
            kw[k] = v
    return ctor(**kw)


def _host_op_step(names, hs: HostStep, HS):
    """A host-op library step (host_rules.HOST_KINDS; csrc/runtime/rj_host_ops.h): dst =
    output, src = input 1, aux = the descriptor, param[0..1]/param64[0..1] = inputs 2..3."""
    from .host_rules import HOST_KINDS

    if hs.kind not in HOST_KINDS:
        raise ValueError(f"host step kind {hs.kind!r} is neither a runtime host step "
                         f"({sorted(HS.HOST_STEPS)}) nor a host-op kind ({sorted(HOST_KINDS)})")

    def opnd(name):
        if name not in hs.operands:
            return None
        sl = hs.operands[name]
        bo, base = names[sl.buffer]
        return HS.Operand(bo, base + sl.offset, "u8", 0)

    return HS.host_op(hs.kind, opnd("dst"), opnd("desc"), opnd("src"), opnd("src1"), opnd("src2"))


class NpuProgram:
    """A compiled graph on a device: ``run(inputs) -> outputs``, ``stats()``."""

    def __init__(self, lowered: LoweredGraph, device: Any, cores: int | None = None) -> None:
        from ..runtime import ProgramBuilder

        self.lowered = lowered
        self.device = device
        self.cores = cores or lowered.profile.cores
        self.steps: list[Step] = schedule(lowered.calls, self.cores)
        calls = lowered.calls
        spans = call_spans(self.steps, len(calls))
        nsteps = len(self.steps)
        bufs = lowered.bufs
        for b in bufs:
            b.first, b.last = 1 << 60, -1
        for ci, pc in enumerate(calls):
            f, l = spans[ci]
            for bid, _ in pc.binding.values():
                b = bufs[bid]
                b.first, b.last = min(b.first, f), max(b.last, l)
        reqs = []
        for b in bufs:
            if b.kind != "arena":
                continue
            if b.last < 0:
                b.first = b.last = 0
            reqs.append(BufReq(b.id, b.size, b.align, b.first, b.last,
                               b.pinned, b.name))
        self.plan: ArenaPlan = plan_arena(reqs)
        check_plan(reqs, self.plan)
        # weights: sequential; regcmd: per call
        woff: dict[int, int] = {}
        pos = 0
        for b in bufs:
            if b.kind == "weights":
                pos = align_up(pos, max(b.align, 64))
                woff[b.id] = pos
                pos += b.size
        self.weights_bytes = pos
        roff: dict[int, int] = {}
        rpos = 0
        for ci, pc in enumerate(calls):
            for spec in pc.call.program.buffers:
                if spec.role == "regcmd":
                    rpos = align_up(rpos, 64)
                    roff[ci] = rpos
                    rpos += spec.nbytes
        self.regcmd_bytes = rpos
        slack = 4096  # emitters may read a padded span past the last tensor
        self.arena_bytes = self.plan.size + slack

        b = ProgramBuilder(device)
        self._builder_stats = {}
        arena = b.add_bo(self.arena_bytes, role="arena")
        weights = b.add_bo(max(self.weights_bytes, 64), role="weights")
        regcmd = b.add_bo(max(self.regcmd_bytes, 64), role="regcmd")
        self._arena = arena

        def where(bid: int) -> tuple[int, int]:
            buf = bufs[bid]
            if buf.kind == "weights":
                return weights, woff[bid]
            return arena, self.plan.offsets[bid]

        self._where = where
        for buf in bufs:
            if buf.kind == "weights" and buf.data is not None and buf.data.size:
                b.upload(weights, buf.data, woff[buf.id])
            if buf.kind == "arena" and buf.zero:
                b.upload(arena, np.zeros(buf.size, np.uint8), self.plan.offsets[buf.id])

        # resolve every call's names
        self._names: list[dict[str, tuple[int, int]]] = []
        for ci, pc in enumerate(calls):
            names = {}
            for name, (bid, off) in pc.binding.items():
                bo, base = where(bid)
                names[name] = (bo, base + off)
            for spec in pc.call.program.buffers:
                if spec.role == "regcmd":
                    names[spec.name] = (regcmd, roff[ci])
            self._names.append(names)

        # regcmd words + relocations, per call, once
        written: set[tuple[int, int]] = set()
        for st in self.steps:
            for jr in st.jobs:
                names = self._names[jr.call]
                for kick in jr.job.kicks:
                    key = (jr.call, kick.base_offset, id(kick))
                    if key in written:
                        continue
                    written.add(key)
                    bo, base = names[kick.regcmd_buffer]
                    start = base + kick.base_offset
                    assert start % 8 == 0
                    b.write_words(bo, np.asarray(kick.words, dtype="<u8"), start // 8)
                    for wi, rel in kick.relocs.items():
                        tbo, toff = names[rel.buffer]
                        b.add_reloc(bo, start // 8 + wi, tbo, toff + rel.offset)

        # steps
        from ..runtime import host_steps as HS
        from ..runtime.program import Task as RtTask
        self.planned_cores: set[int] = set()
        npu_steps = jobs = tasks = kicks = host = 0
        packed = unpacked = dev_read = 0
        for st in self.steps:
            if st.kind == "npu":
                ids = []
                for jr in st.jobs:
                    names = self._names[jr.call]
                    self.planned_cores.add(jr.core)
                    rd = {names[n][0] for n in jr.job.reads if n in names}
                    wr = {names[n][0] for n in jr.job.writes if n in names}
                    for kick in jr.job.kicks:
                        for rel in kick.relocs.values():
                            tbo = names[rel.buffer][0]
                            if tbo not in wr and tbo != regcmd:
                                rd.add(tbo)
                    for name in jr.job.reads:
                        spec = self._spec(jr.call, name)
                        dev_read += spec.nbytes if spec is not None else 0
                    for rks, chained in runtime_jobs(jr.job):
                        tlist = []
                        for kick in rks:
                            bo, base = names[kick.regcmd_buffer]
                            for toff, cnt in zip(kick.task_offsets, kick.task_counts):
                                tlist.append(RtTask(bo, base + kick.base_offset + 8 * toff, cnt))
                        ids.append(b.add_job(tlist, reads=sorted(rd), writes=sorted(wr), core=0,
                                             chained=chained))
                        jobs += 1
                        tasks += len(tlist)
                        kicks += 1 if chained else len(tlist)
                b.add_npu_step(ids)
                npu_steps += 1
            else:
                ci, hs = st.host
                b.add_host_step(self._host_step(ci, hs, HS))
                host += 1
                nb = self._host_bytes(hs)
                if hs.kind.startswith("pack"):
                    packed += nb
                elif hs.kind.startswith("unpack"):
                    unpacked += nb
        dev_written = sum(s.nbytes for pc in calls if pc.call.where == "npu"
                          for s in pc.call.program.buffers if s.role == "output")
        self.program = b.build()
        self._static = {
            "npu_steps": npu_steps, "jobs": jobs, "tasks": tasks, "kicks": kicks,
            "host_steps": host, "host_bytes_packed": packed, "host_bytes_unpacked": unpacked,
            "retiles": lowered.retiles,
            "device_bytes_read": dev_read, "device_bytes_written": dev_written,
            "macs": sum(pc.call.program.macs for pc in calls if pc.call.where == "npu"),
            "arena_bytes": self.plan.size, "arena_bytes_without_reuse": self.plan.naive_size,
            "weights_bytes": self.weights_bytes, "regcmd_bytes": self.regcmd_bytes,
            "npu_ops": sum(1 for d in lowered.decisions if d.where == "npu"),
            "host_ops": sum(1 for d in lowered.decisions if d.where == "host"),
            "view_ops": sum(1 for d in lowered.decisions if d.where == "view"),
            "planned_cores": len(self.planned_cores),
        }

    # ------------------------------------------------------------------ helpers
    def _spec(self, ci: int, name: str):
        for s in self.lowered.calls[ci].call.program.buffers:
            if s.name == name:
                return s
        return None

    def _host_step(self, ci: int, hs: HostStep, HS):
        return runtime_host_step(hs, self._names[ci], lambda n: self._spec(ci, n))

    @staticmethod
    def _host_bytes(hs: HostStep) -> int:
        p = hs.params
        if "height" in p:
            return int(p["height"] * p["width"] * p["channels"] * p["esize"])
        if "kernels" in p:
            return int(p["kernels"] * p["channels"] * p["kh"] * p["kw"] * p["esize"])
        return sum(s.nbytes for s in hs.operands.values())

    # ------------------------------------------------------------------ running
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.lowered.graph
        if len(inputs) != len(g.inputs):
            from ..errors import TraceError
            raise TraceError(f"graph {g.name!r} takes {len(g.inputs)} input(s), got {len(inputs)}")
        for bd in self.lowered.inputs:
            t = bd.tensor
            arr = np.ascontiguousarray(np.asarray(inputs[bd.index]).astype(
                t.form.dtype.to_numpy()))
            bo, base = self._where(t.buf)
            self.program.write(bo, arr, base + t.offset)
        self.program.run()
        outs = []
        for bd in self.lowered.outputs:
            t = bd.tensor
            bo, base = self._where(t.buf)
            a = self.program.read_array(bo, t.form.dtype.to_numpy(), t.form.shape, base + t.offset)
            outs.append(a.astype(bd.value.type.dtype.to_numpy()))
        return outs

    __call__ = run

    def stats(self) -> dict[str, int]:
        """Per-run counts from the plan, plus the runtime's cumulative counters (``rt_*``)."""
        out = dict(self._static)
        for k, v in self.program.stats().items():
            out[f"rt_{k}"] = v
        return out

    def report(self) -> str:
        """Where every op ran and why (one line per IR node)."""
        lines = []
        for d in self.lowered.decisions:
            why = f"  [{d.why}]" if d.why else ""
            lines.append(f"{d.node:<28} {d.where:<5} {d.how:<32} {d.loc}{why}")
        return "\n".join(lines)

    def close(self) -> None:
        self.program.close()
