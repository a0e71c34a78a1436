"""The lowering's last stage: a lowered graph -> a ProgramImage (plain data, runtime/image.py),
which the runtime loads (runtime/program.py: ImageProgram) and a bundle stores.

``build_image`` (once):
  * schedule the calls (schedule.py), compute each arena buffer's live interval in steps, plan
    the arena (memory.py);
  * BOs: one ``arena`` (activations, scratch, graph inputs/outputs), one ``weights`` (every
    const BufferSpec and compile-time tensor, uploaded once), one ``regcmd`` (every kick's
    words); address words become relocations (patched by the runtime at load);
  * jobs and host steps in schedule order, each step with its op's source location.
The image holds no compiler object. ``NpuProgram`` = build_image + load it on a device.
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

from .memory import ArenaPlan, BufReq, align_up, check_plan, plan_arena
from .opprogram import HostStep
from .lowered import LoweredGraph
from .schedule import Step, call_spans, runtime_jobs, schedule
from ..runtime.image import (BoSpec, HostStepSpec, JobSpec, Placement, ProgramImage, Source,
                             StepSpec, TensorSig, Upload, Words, ZeroFill)

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


def host_step_spec(hs: HostStep, names: Mapping[str, tuple[int, int]],
                   spec_of: Callable[[str], Any]) -> HostStepSpec:
    """A lowering HostStep -> the image's plain ``HostStepSpec``.

    ``names``: buffer name -> (program BO, byte offset of the buffer); ``spec_of(name)``: the
    op's BufferSpec (for an operand's default dtype). Runtime kinds (host_steps.HOST_STEPS)
    take per-operand dtypes and row strides from ``params["dtypes"][operand]`` /
    ``params["row_strides"][operand]`` (the emitters' convention, emitters/reduce.py), else
    from ``params["<operand>_dtype"]`` / ``"<operand>_row_stride"``, else the BufferSpec;
    the host-op kinds (host_rules.HOST_KINDS) carry everything in their descriptor."""
    from ..runtime import host_steps as HS
    from .host_rules import HOST_KINDS

    if hs.kind in HOST_KINDS or hs.kind not in HS.HOST_STEPS:
        return _host_op_spec(names, hs, HS)
    dtypes = hs.params.get("dtypes", {}) or {}
    strides = hs.params.get("row_strides", {}) or {}
    ops = {}
    for opname, sl in hs.operands.items():
        bo, base = names[sl.buffer]
        dt = dtypes.get(opname) or hs.params.get(f"{opname}_dtype") or _spec_dtype(spec_of(sl.buffer))
        rs = strides.get(opname, hs.params.get(f"{opname}_row_stride", 0))
        ops[opname] = (int(bo), int(base + sl.offset), str(dt), int(rs))
    params = {k: (float(v) if isinstance(v, (float, np.floating)) else int(v))
              for k, v in hs.params.items() if k in _LAYOUT_PARAMS}
    return HostStepSpec(hs.kind, ops, params)


def runtime_host_step(hs: HostStep, names: Mapping[str, tuple[int, int]],
                      spec_of: Callable[[str], Any]):
    """A lowering HostStep -> the runtime's filled ``rj_host_step`` (through its spec)."""
    from ..runtime.program import _host_step_from_spec

    return _host_step_from_spec(host_step_spec(hs, names, spec_of))


def _host_op_spec(names, hs: HostStep, HS) -> HostStepSpec:
    """A host-op library step (host_rules.HOST_KINDS; csrc/runtime/rj_host_ops.h): dst =
    output, src = input 1, desc = the descriptor, src1/src2 = inputs 2..3."""
    from .host_rules import HOST_KINDS

    if hs.kind not in HOST_KINDS:
        raise ValueError(f"host step kind {hs.kind!r} is neither a runtime host step "
                         f"({sorted(HS.HOST_STEPS)}) nor a host-op kind ({sorted(HOST_KINDS)})")
    ops = {}
    for name in ("dst", "desc", "src", "src1", "src2"):
        if name in hs.operands:
            sl = hs.operands[name]
            bo, base = names[sl.buffer]
            ops[name] = (int(bo), int(base + sl.offset), "u8", 0)
    return HostStepSpec(hs.kind, ops, {})


class ImageBuilder:
    """Schedules, plans memory and lays out a LoweredGraph as a ProgramImage for ``contexts``
    device contexts. Keeps the plan (``plan``, ``steps``, ``context_bos``) for inspection."""

    def __init__(self, lowered: LoweredGraph, contexts: int | None = None,
                 cores: int | None = None) -> None:
        self.lowered = lowered
        self.cores = cores or lowered.profile.cores
        self.steps: list[Step] = schedule(lowered.calls, self.cores)
        calls = lowered.calls
        spans = call_spans(self.steps, len(calls))
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
        ncores = max(1, min(self.cores, contexts if contexts is not None else self.cores))
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
        from .bounds import check_bo
        g = lowered.graph
        check_bo("activation arena", self.arena_bytes,
                 [(b.name, b.size) for b in bufs if b.kind == "arena"], g)
        check_bo("weights", max(wsize.values()), [(b.name, b.size) for b in wbufs], g)
        check_bo("regcmd", max(rsize.values()), [(f"call {ci}", rspec[ci].nbytes)
                                                 for ci in rspec if rspec[ci] is not None], g)

        bos: list[BoSpec] = []

        def add_bo(size: int, role: str, core: int) -> int:
            bos.append(BoSpec(role, core, int(size)))
            return len(bos) - 1

        # every used context gets its own arena (a mirror at the same offsets, so a job's
        # relocations differ only in the BO), weights and regcmd BOs
        arena_c = {c: add_bo(self.arena_bytes, "arena", c) for c in used}
        weights_c = {c: add_bo(max(wsize[c], 64), "weights", c) for c in used}
        regcmd_c = {c: add_bo(max(rsize[c], 64), "regcmd", c) for c in used}
        self.context_bos = {c: (arena_c[c], weights_c[c], regcmd_c[c]) for c in used}

        def where(bid: int, core: int = 0) -> tuple[int, int]:
            buf = bufs[bid]
            if buf.kind == "weights":
                return weights_c[core], woff[(core, bid)]
            return arena_c[core], self.plan.offsets[bid]

        self._where = where
        arrays: dict[str, np.ndarray] = {}
        uploads: list[Upload] = []
        zero_fills: list[ZeroFill] = []
        for c in used:
            for bf in wbufs:
                if bf.id in need_w[c] and bf.data is not None and bf.data.size:
                    key = f"w{bf.id}:{bf.name}"
                    arrays[key] = np.ascontiguousarray(bf.data).reshape(-1).view(np.uint8)
                    uploads.append(Upload(weights_c[c], woff[(c, bf.id)], key))
            for bf in bufs:
                if bf.kind == "arena" and bf.zero:
                    zero_fills.append(ZeroFill(arena_c[c], self.plan.offsets[bf.id], bf.size))

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

        # regcmd words (one array per regcmd BO; unwritten gaps are zero) + relocations
        words_of = {c: np.zeros(bos[regcmd_c[c]].size // 8, dtype="<u8") for c in used}
        relocs: list[tuple[int, int, int, int, int]] = []
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
                    assert start % 8 == 0 and bo == regcmd_c[jr.core]
                    w = np.asarray(kick.words, dtype="<u8")
                    words_of[jr.core][start // 8:start // 8 + w.size] = w
                    for wi, rel in kick.relocs.items():
                        tbo, toff = names[rel.buffer]
                        relocs.append((bo, start // 8 + wi, tbo, toff + rel.offset, 0))
        words: list[Words] = []
        for c in used:
            arrays[f"regcmd{c}"] = words_of[c]
            words.append(Words(regcmd_c[c], 0, f"regcmd{c}"))
        arrays["relocs"] = np.asarray(relocs, dtype=np.uint64).reshape(-1, 5)

        # sources: the user's file:line of each call's op (from the placement decisions)
        # keyed on the value ("%7"): a fused activation's decision is labelled by its kind
        loc_of = {d.node.split(" = ")[0]: d.loc for d in lowered.decisions}
        sources: list[Source] = []
        src_index: dict[int, int] = {}

        def source(ci: int) -> int:
            if ci not in src_index:
                pc = calls[ci]
                src_index[ci] = len(sources)
                sources.append(Source(pc.node, loc_of.get(pc.node.split(" = ")[0], ""),
                                      pc.call.emitter))
            return src_index[ci]

        # steps
        from .host_rules import HostView, host_op_step
        from ..ir.types import DType as _DT
        self.job_cores: list[int] = []
        npu_steps = jobs = tasks = kicks = host = 0
        packed = unpacked = dev_read = dev_written = copied = copy_steps = 0
        desc_bufs: list[np.ndarray] = []

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
            """Only the job itself touches it, so it never moves between contexts."""
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

        pending: list[tuple] = []

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
            desc_bufs.append(desc.data)
            pending.append(("copy", src_core, dst_core, len(desc_bufs) - 1))
            copied += pieces * chunk
            copy_steps += 1
            host += 1

        from ..progress import progress
        for st in progress(self.steps, "laying out the program image"):
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
                                tlist.append((bo, base + kick.base_offset + 8 * toff, cnt))
                        ids_step.append((tlist, sorted(rd), sorted(wr), jr.core, chained,
                                         jr.call))
                        self.job_cores.append(jr.core)
                        jobs += 1
                        tasks += len(tlist)
                        kicks += 1 if chained else len(tlist)
                pending.append(("npu", ids_step))
                npu_steps += 1
                for c, rs in sorted(outs.items()):
                    for run in dict.fromkeys(rs):
                        copy(c, 0, run)
            else:
                ci, hs = st.host
                pending.append(("host", ci, hs))
                host += 1
                nb = self._host_bytes(hs)
                if hs.kind.startswith("pack"):
                    packed += nb
                elif hs.kind.startswith("unpack"):
                    unpacked += nb
        # the copy descriptors: a small BO of context 0 (written once, address-free)
        cdesc_bo = add_bo(max(448 * len(desc_bufs), 64), "weights", 0) if desc_bufs else None
        for k, data in enumerate(desc_bufs):
            key = f"copydesc{k}"
            arrays[key] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            uploads.append(Upload(cdesc_bo, 448 * k, key))
        job_specs: list[JobSpec] = []
        step_specs: list[StepSpec] = []
        for item in pending:
            if item[0] == "npu":
                ids = []
                calls_here = []
                for tl, rd, wr, core, ch, ci in item[1]:
                    # a BO the job both reads and writes is listed as written only: the kernel
                    # signals such a job done without running it (ProgramBuilder.add_job)
                    wr = list(dict.fromkeys(wr))
                    rd = [x for x in dict.fromkeys(rd) if x not in wr]
                    job_specs.append(JobSpec(core, bool(ch), tuple(tuple(t) for t in tl),
                                             tuple(rd), tuple(wr), source(ci)))
                    ids.append(len(job_specs) - 1)
                    calls_here.append(ci)
                step_specs.append(StepSpec("npu", tuple(ids), None, source(calls_here[0])))
            elif item[0] == "host":
                _, ci, hs = item
                step_specs.append(StepSpec("host", (), self._host_step(ci, hs), source(ci)))
            else:
                _, sc, dc, k = item
                step_specs.append(StepSpec("host", (), HostStepSpec(
                    "copy", {"dst": (arena_c[dc], 0, "u8", 0),
                             "desc": (cdesc_bo, 448 * k, "u8", 0),
                             "src": (arena_c[sc], 0, "u8", 0)}, {}), -1))
        useful = sum(pc.call.program.macs for pc in calls if pc.call.where == "npu"
                     and pc.call.emitter.startswith(("matmul", "conv")))
        stats = {
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
            stats[f"jobs_core{c}"] = sum(1 for x in self.job_cores if x == c)
        # numerics: how many values the range plan prescaled / keeps in fp32 / on the host
        if lowered.range_plan is not None:
            stats.update(lowered.range_plan.counts())
        stats = {k: int(v) for k, v in stats.items()}

        def sig(bd, prefix: str) -> TensorSig:
            t = bd.tensor
            bo, base = where(t.buf)
            shape = tuple(int(d) for d in bd.value.type.shape)
            # a 0-d value is held as one element: the same bytes, row-major
            assert int(np.prod(shape)) == int(np.prod(t.form.shape)), (shape, t.form.shape)
            return TensorSig(f"{prefix}{bd.index}", int(bd.index), shape,
                             bd.value.type.dtype.to_numpy().name, t.form.dtype.to_numpy().name,
                             bo, int(base + t.offset))

        self.image = ProgramImage(
            profile=lowered.profile.name, contexts=ncores, bos=bos, uploads=uploads,
            zero_fills=zero_fills, words=words, relocs="relocs", jobs=job_specs,
            steps=step_specs, inputs=[sig(bd, "in") for bd in lowered.inputs],
            outputs=[sig(bd, "out") for bd in lowered.outputs], sources=sources,
            placement=[Placement(d.node, d.loc, d.where, d.how, d.why or "")
                       for d in lowered.decisions],
            stats=stats, arrays=arrays)
        self.image.check()

    # ------------------------------------------------------------------ helpers
    def _spec(self, ci: int, name: str):
        for s in self.lowered.calls[ci].call.program.buffers:
            if s.name == name:
                return s
        return None

    def _host_step(self, ci: int, hs: HostStep) -> HostStepSpec:
        return host_step_spec(hs, self._names[ci], lambda n: self._spec(ci, n))

    @staticmethod
    def _host_bytes(hs: HostStep) -> int:
        p = hs.params
        if "height" in p:
            return int(p["height"] * p["width"] * p["channels"] * p["esize"])
        if "kernels" in p:
            return int(p["kernels"] * p["channels"] * p["kh"] * p["kw"] * p["esize"])
        return sum(s.nbytes for s in hs.operands.values())


def build_image(lowered: LoweredGraph, contexts: int | None = None) -> ProgramImage:
    """The program image of a lowered graph for ``contexts`` device contexts (default: the
    chip profile's core count)."""
    return ImageBuilder(lowered, contexts).image


class NpuProgram:
    """A compiled graph on a device: the image (``image``) loaded there (``loaded``);
    ``run(inputs) -> outputs``, ``stats()``, ``report()``."""

    def __init__(self, lowered: LoweredGraph, device: Any, cores: int | None = None,
                 builder: ImageBuilder | None = None) -> None:
        """``builder``: the image already laid out for ``lowered`` (reused when it has the
        device's context count, so compile-then-load does not lay it out twice)."""
        from ..runtime.program import load_image

        self.lowered = lowered
        self.device = device
        self.cores = cores or lowered.profile.cores
        contexts = min(self.cores, getattr(device, "cores", 1))
        if builder is None or builder.lowered is not lowered or builder.ncores != contexts:
            builder = ImageBuilder(lowered, contexts, self.cores)
        self.builder = builder
        self.image = self.builder.image
        self.plan = self.builder.plan
        self.steps = self.builder.steps
        self.context_bos = self.builder.context_bos
        self.job_cores = self.builder.job_cores
        self.ncores = self.builder.ncores
        self.weights_bytes = self.builder.weights_bytes
        self.regcmd_bytes = self.builder.regcmd_bytes
        self.arena_bytes = self.builder.arena_bytes
        self.loaded = load_image(self.image, device)
        self.program = self.loaded.program

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.lowered.graph
        if len(inputs) != len(g.inputs):
            from ..errors import TraceError
            raise TraceError(f"graph {g.name!r} takes {len(g.inputs)} input(s), got {len(inputs)}")
        outs = self.loaded.run(inputs)
        self._check_finite(inputs, outs)
        return outs

    def _check_finite(self, inputs: Sequence[np.ndarray], outs: list[np.ndarray]) -> None:
        """Finite inputs must give finite outputs: an inf/NaN then means an fp16 value
        overflowed where the range plan had only the input assumption to go on (the norm
        rewrite turns an overflowed deviation into NaN rather than the LayerNorm bias), so it is
        reported, never returned as a result."""
        def finite(a) -> bool:
            a = np.asarray(a)
            return a.dtype.kind != "f" or bool(np.isfinite(a).all())

        if getattr(self.device, "kind", "") == "null":
            return              # the null device computes nothing: its outputs mean nothing
        if all(finite(o) for o in outs) or not all(finite(x) for x in inputs):
            return
        from ..errors import NumericsError
        bad = [i for i, o in enumerate(outs) if not finite(o)]
        rp = self.lowered.range_plan
        suspects = [r for r in (rp.records if rp is not None else []) if r.action == "assumed"]
        lines = "\n".join(f"  {r}" for r in suspects[:12])
        more = f"\n  ... and {len(suspects) - 12} more" if len(suspects) > 12 else ""
        raise NumericsError(
            f"output(s) {bad} of {self.lowered.graph.name!r} hold inf/NaN although every input "
            f"is finite: a value computed in fp16 on the NPU left fp16's range (65504). The "
            f"range plan could not bound these values and assumed they stay in range:\n{lines}"
            f"{more}\nScale the inputs (or the weights feeding them) down, or keep the "
            f"computation in float32 outside the compiled function.")

    __call__ = run

    @property
    def range_plan(self) -> list:
        """The range plan's records (value, op, source line, bound, action), one per float
        value the program computes (range_plan.RangeRecord)."""
        rp = self.lowered.range_plan
        return list(rp.records) if rp is not None else []

    def stats(self) -> dict[str, int]:
        """Per-run counts from the plan, plus the runtime's cumulative counters (``rt_*``),
        plus ``modelled_*``: the cost model's estimate at 600 MHz (rockjit.cost; a model, not
        a measurement)."""
        out = self.loaded.stats()
        if getattr(self, "_modelled", None) is None:
            from ..cost import describe, estimate
            self._modelled = estimate(describe(self)).summary()
        out.update(self._modelled)
        return out

    def report(self) -> str:
        """Where every op ran and why (one line per IR node)."""
        return self.image.report()

    def close(self) -> None:
        self.loaded.close()
