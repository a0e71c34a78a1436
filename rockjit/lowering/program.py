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

Multicore: the jobs of one NPU step are independent and are dealt over the device's contexts
(schedule.py). The rocket driver gives each fd its own IOVA space and a job may only touch BOs
of its own context (notes: perf/iova-and-multicore.md), so every used context gets its own
arena (a mirror at the same offsets: a job's relocations differ only in the BO), weights (the
const buffers its jobs read, uploaded once) and regcmd (its jobs' kicks). Context 0 holds the
canonical arena: before a step, a host copy brings into each other context exactly the strided
runs its jobs' DMA reads (regcmd.Access, declared by the emitters); after it, the runs they
write come back. Op scratch that only one context touches (K partials, broadcast cubes)
never moves; scratch a host step of the op fills or reads (the patchify's im2col cube) moves
like any tensor when a job on another core uses it. Every copy is a counted host step
(``host_copy_steps``, ``host_bytes_copied``).

Stats: ``device_bytes_read/written`` sum every task's declared DMA streams (what the task's
registers make the hardware move, not whole buffers per job); ``macs`` counts the model's
contractions (matmul/conv), ``device_macs`` everything the MAC array runs (the identity and
broadcast convolutions of element-wise ops, the ones-vector sums).
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
        # contexts: a core is one device context (rocket: one fd) with its own IOVA space,
        # so every BO a job touches must live in the job's context
        ncores = max(1, min(self.cores, getattr(device, "cores", 1)))
        self.ncores = ncores
        for st in self.steps:
            if st.kind == "npu":
                for jr in st.jobs:
                    jr.core = jr.core % ncores
        # weights: sequential per context, each context holding what its jobs read;
        # context 0 holds all of them (host steps and core-0 jobs)
        wbufs = [bf for bf in bufs if bf.kind == "weights"]
        need_w: dict[int, set[int]] = {c: set() for c in range(ncores)}
        need_w[0] = {bf.id for bf in wbufs}
        for st in self.steps:
            for jr in st.jobs:
                if jr.core:
                    pc = calls[jr.call]
                    for name, (bid, _) in pc.binding.items():
                        if bufs[bid].kind == "weights":
                            need_w[jr.core].add(bid)
        woff: dict[tuple[int, int], int] = {}
        wsize: dict[int, int] = {}
        for c in range(ncores):
            pos = 0
            for bf in wbufs:
                if bf.id in need_w[c]:
                    pos = align_up(pos, max(bf.align, 64))
                    woff[(c, bf.id)] = pos
                    pos += bf.size
            wsize[c] = pos
        self.weights_bytes = wsize[0]
        # regcmd: per context, the regions of the calls whose jobs run there
        roff: dict[tuple[int, int], int] = {}
        rsize: dict[int, int] = {c: 0 for c in range(ncores)}
        rspec = {ci: next((sp for sp in pc.call.program.buffers if sp.role == "regcmd"), None)
                 for ci, pc in enumerate(calls)}
        for st in self.steps:
            for jr in st.jobs:
                key = (jr.core, jr.call)
                if key not in roff and rspec[jr.call] is not None:
                    rsize[jr.core] = align_up(rsize[jr.core], 64)
                    roff[key] = rsize[jr.core]
                    rsize[jr.core] += rspec[jr.call].nbytes
        self.regcmd_bytes = sum(rsize.values())
        slack = 4096  # emitters may read a padded span past the last tensor
        self.arena_bytes = self.plan.size + slack
        used = sorted({jr.core for st in self.steps for jr in st.jobs} | {0})

        b = ProgramBuilder(device)
        self._builder_stats = {}
        # every used context gets its own arena (a mirror at the same offsets, so a job's
        # relocations differ only in the BO), weights and regcmd BOs
        arena_c = {c: b.add_bo(self.arena_bytes, role="arena", core=c) for c in used}
        weights_c = {c: b.add_bo(max(wsize[c], 64), role="weights", core=c) for c in used}
        regcmd_c = {c: b.add_bo(max(rsize[c], 64), role="regcmd", core=c) for c in used}
        self.context_bos = {c: (arena_c[c], weights_c[c], regcmd_c[c]) for c in used}
        arena, weights = arena_c[0], weights_c[0]
        self._arena = arena
        # host copy descriptors (cross-context moves) live after the weights of context 0
        self._copy_descs: list[np.ndarray] = []

        def where(bid: int, core: int = 0) -> tuple[int, int]:
            buf = bufs[bid]
            if buf.kind == "weights":
                return weights_c[core], woff[(core, bid)]
            return arena_c[core], self.plan.offsets[bid]

        self._where = where
        for c in used:
            for bf in wbufs:
                if bf.id in need_w[c] and bf.data is not None and bf.data.size:
                    b.upload(weights_c[c], bf.data, woff[(c, bf.id)])
            for bf in bufs:
                if bf.kind == "arena" and bf.zero:
                    b.upload(arena_c[c], np.zeros(bf.size, np.uint8), self.plan.offsets[bf.id])

        def names_for(ci: int, core: int) -> dict[str, tuple[int, int]]:
            pc = calls[ci]
            names = {}
            for name, (bid, off) in pc.binding.items():
                bo, base = where(bid, core)
                names[name] = (bo, base + off)
            if rspec[ci] is not None and (core, ci) in roff:
                names[rspec[ci].name] = (regcmd_c[core], roff[(core, ci)])
            return names

        # host steps resolve names in context 0
        self._names = [names_for(ci, 0) for ci in range(len(calls))]

        # regcmd words + relocations, per (core, call), once
        written: set[tuple[int, int, int]] = set()
        for st in self.steps:
            for jr in st.jobs:
                names = names_for(jr.call, jr.core)
                for kick in jr.job.kicks:
                    key = (jr.core, jr.call, kick.base_offset)
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
        from ..runtime.program import Task as RtTask
        from .host_rules import HostView, host_op_step
        from ..ir.types import DType as _DT
        self.job_cores: list[int] = []
        npu_steps = jobs = tasks = kicks = host = 0
        packed = unpacked = dev_read = dev_written = copied = copy_steps = 0
        desc_bufs: list[tuple[int, np.ndarray]] = []

        # A job's own scratch (DPU K accumulators, broadcast cubes: written and read inside
        # the job) stays in its context. Scratch a host step of the call touches is shared
        # with context 0, where host steps run: the im2col cube of a patchify, the packed B of
        # a run-time matmul, K partials the host sums. It moves like any other tensor.
        host_scratch: set[tuple[int, str]] = set()
        for st in self.steps:
            if st.kind == "host":
                ci, hs = st.host
                host_scratch.update((ci, sl.buffer) for sl in hs.operands.values())

        def private(ci: int, name: str) -> bool:
            sp = self._spec(ci, name)
            if sp is None:
                return False
            if sp.role == "scratch":
                return (ci, name) not in host_scratch
            return sp.role in ("regcmd", "const")

        def ranges(jr, which: str) -> list[tuple[int, int, int, int]]:
            """The arena bytes a job's DMA reads or writes, as (start, pieces, pitch, chunk)
            strided runs (its op-private scratch excluded: only the job touches it)."""
            names = names_for(jr.call, jr.core)
            out = []
            for kick in jr.job.kicks:
                for a in (kick.reads if which == "r" else kick.writes):
                    if private(jr.call, a.buffer):
                        continue
                    bid = calls[jr.call].binding.get(a.buffer)
                    if bid is None or bufs[bid[0]].kind != "arena":
                        continue
                    out.append((names[a.buffer][1] + a.offset, a.pieces, a.pitch, a.chunk))
            return out

        def copy(src_core: int, dst_core: int, run: tuple[int, int, int, int]) -> None:
            """One strided host copy of a run between the two contexts' arenas (same offsets:
            the arenas mirror each other)."""
            nonlocal copied, copy_steps, host
            lo, pieces, pitch, chunk = run
            hi = lo + (pieces - 1) * pitch + chunk
            sizes = {"dst": hi, "src": hi, "cdesc": 0}
            _, desc = host_op_step("copy", (pieces, chunk),
                                   HostView("dst", _DT.U8, lo, (pitch, 1)),
                                   [HostView("src", _DT.U8, lo, (pitch, 1))], sizes, "cdesc",
                                   what="cross-context copy")
            desc_bufs.append((len(desc_bufs), desc.data))
            self._pending.append(("copy", src_core, dst_core, len(desc_bufs) - 1))
            copied += pieces * chunk
            copy_steps += 1
            host += 1

        self._pending: list[tuple] = []
        for st in self.steps:
            if st.kind == "npu":
                ins: dict[int, list] = {}
                outs: dict[int, list] = {}
                for jr in st.jobs:
                    if jr.core:
                        ins.setdefault(jr.core, []).extend(ranges(jr, "r"))
                        outs.setdefault(jr.core, []).extend(ranges(jr, "w"))
                for c, rs in sorted(ins.items()):
                    for run in dict.fromkeys(rs):
                        copy(0, c, run)
                ids_step = []
                for jr in st.jobs:
                    names = names_for(jr.call, jr.core)
                    rd = {names[n][0] for n in jr.job.reads if n in names}
                    wr = {names[n][0] for n in jr.job.writes if n in names}
                    for kick in jr.job.kicks:
                        for rel in kick.relocs.values():
                            tbo = names[rel.buffer][0]
                            if tbo not in wr and tbo != regcmd_c[jr.core]:
                                rd.add(tbo)
                        dev_read += sum(a.nbytes for a in kick.reads)
                        dev_written += sum(a.nbytes for a in kick.writes)
                    for rks, chained in runtime_jobs(jr.job):
                        tlist = []
                        for kick in rks:
                            bo, base = names[kick.regcmd_buffer]
                            for toff, cnt in zip(kick.task_offsets, kick.task_counts):
                                tlist.append(RtTask(bo, base + kick.base_offset + 8 * toff, cnt))
                        ids_step.append((tlist, sorted(rd), sorted(wr), jr.core, chained))
                        self.job_cores.append(jr.core)
                        jobs += 1
                        tasks += len(tlist)
                        kicks += 1 if chained else len(tlist)
                self._pending.append(("npu", ids_step))
                npu_steps += 1
                for c, rs in sorted(outs.items()):
                    for run in dict.fromkeys(rs):
                        copy(c, 0, run)
            else:
                ci, hs = st.host
                self._pending.append(("host", ci, hs))
                host += 1
                nb = self._host_bytes(hs)
                if hs.kind.startswith("pack"):
                    packed += nb
                elif hs.kind.startswith("unpack"):
                    unpacked += nb
        # the copy descriptors: a small BO of context 0 (written once, address-free)
        cdesc_bo = b.add_bo(max(448 * len(desc_bufs), 64), role="weights", core=0) \
            if desc_bufs else None
        for k, data in desc_bufs:
            b.upload(cdesc_bo, data, 448 * k)
        from ..runtime import host_steps as HS
        for item in self._pending:
            if item[0] == "npu":
                ids = [b.add_job(tl, reads=rd, writes=wr, core=core, chained=ch)
                       for tl, rd, wr, core, ch in item[1]]
                b.add_npu_step(ids)
            elif item[0] == "host":
                b.add_host_step(self._host_step(item[1], item[2], None))
            else:
                _, sc, dc, k = item
                b.add_host_step(HS.host_op("copy", HS.Operand(arena_c[dc], 0, "u8"),
                                           HS.Operand(cdesc_bo, 448 * k, "u8"),
                                           HS.Operand(arena_c[sc], 0, "u8")))
        del self._pending
        useful = sum(pc.call.program.macs for pc in calls if pc.call.where == "npu"
                     and pc.call.emitter.startswith(("matmul", "conv")))
        self.program = b.build()
        self._static = {
            "npu_steps": npu_steps, "jobs": jobs, "tasks": tasks, "kicks": kicks,
            "host_steps": host, "host_bytes_packed": packed, "host_bytes_unpacked": unpacked,
            "host_copy_steps": copy_steps, "host_bytes_copied": copied,
            "retiles": lowered.retiles,
            "device_bytes_read": dev_read, "device_bytes_written": dev_written,
            "macs": useful,
            "device_macs": sum(pc.call.program.macs for pc in calls if pc.call.where == "npu"),
            "arena_bytes": self.plan.size, "arena_bytes_without_reuse": self.plan.naive_size,
            "weights_bytes": self.weights_bytes, "regcmd_bytes": self.regcmd_bytes,
            "npu_ops": sum(1 for d in lowered.decisions if d.where == "npu"),
            "host_ops": sum(1 for d in lowered.decisions if d.where == "host"),
            "view_ops": sum(1 for d in lowered.decisions if d.where == "view"),
            "cores_used": len({c for c in self.job_cores}),
        }
        for c in range(ncores):
            self._static[f"jobs_core{c}"] = sum(1 for x in self.job_cores if x == c)

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
