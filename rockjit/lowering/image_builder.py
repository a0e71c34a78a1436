"""The lowering's last stage: a lowered graph -> a ProgramImage (plain data, runtime/image.py),
which the runtime loads (runtime/program.py: LoadedImage) and a bundle stores.

``ImageBuilder`` runs named steps, each filling the attributes the next ones read:
  * ``_schedule``: the calls in step order (schedule.py);
  * ``_assign_contexts``: each NPU job's context (core), by modelled cost with the copies
    residency tracking will make (resident_placement.py);
  * ``_coalesce``: independent host steps hoisted and adjacent context-0 NPU steps merged
    (coalesce.py);
  * ``_liveness`` + ``_plan_arena``: each arena buffer's live interval in steps, the arena
    (memory.py);
  * ``_lay_out_weights`` / ``_lay_out_regcmd``: per context, the const buffers its jobs read
    and the regcmd spans of the jobs that run there (regcmd_image.py);
  * ``_make_bos``, ``_uploads``: BOs (one arena, weights and regcmd per used context) and what
    is written into them once at load;
  * ``_words_and_relocations``: every kick's words; address words become relocations
    (patched by the runtime at load);
  * ``_walk_steps`` (with context_copies.cross_context_copy): jobs and host steps
    in schedule order, and the host copies between contexts; ``_step_specs``: the same as image records;
  * ``_stats``, then the image.
The image holds no compiler object.

Multicore: the jobs of one NPU step are independent and are dealt over as many of the
device's contexts as the cost model finds cheapest, copies included (placement.py). The rocket driver gives each fd its own IOVA space and a job may only touch BOs
of its own context (notes: perf/iova-and-multicore.md), so every used context gets its own
arena (a mirror at the same offsets: a job's relocations differ only in the BO), weights (the
const buffers its jobs read, uploaded once) and regcmd (its jobs' kicks). The host copies
between contexts follow residency (context_copies.py): a job's context gets only the bytes its
DMA reads (regcmd.Access, declared by the emitters) that it does not hold; host steps read
where a value is current; outputs end in context 0. Op scratch that only one context touches
(K partials, broadcast cubes) never moves. Every copy is a counted host step
(``host_copy_steps``, ``host_bytes_copied``).

Stats: ``device_bytes_read/written`` sum every task's declared DMA streams (what the task's
registers make the hardware move, not whole buffers per job); ``macs`` counts the model's
contractions (matmul/conv), ``device_macs`` everything the MAC array runs (the broadcast
convolutions of per-row and run-time per-channel element-wise ops, the ones-vector sums; the
two-cube element-wise passes run on the DPU alone and count none).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import debugflags
from ..progress import progress
from ..runtime.image import (BoSpec, CorePlacement, HostStepSpec, JobSpec, Placement, ProgramImage, Source,
                             StepSpec, TensorSig, TilingChoice, Upload, Words, ZeroFill)
from .bounds import check_bo
from .coalesce import coalesce
from .context_copies import ResidencyWalk, cross_context_copy, eager_copies
from .image_stats import program_stats
from .job_merge import StepMerger
from .job_shapes import job_shape, job_span
from .host_rules import DESC_BYTES
from .host_fuse import fuse_host_steps
from .host_step_spec import host_step_spec
from .lowered import Boundary, LoweredGraph
from .memory import ArenaPlan, check_plan, naive_size, plan_arena
from .op_lowering import HostStep
from .placement import CoreChoice
from .regcmd_image import lay_out_regcmd, words_and_relocations
from .weight_spans import buffer_pieces, lay_out_weights
from .resident_placement import place
from .zero_pools import pool_zero_buffers
from .schedule import JobRef, ScheduledStep, call_spans, schedule

_ARENA_SLACK = 4096  # emitters may read a padded span past the last tensor


class ImageBuilder:
    """Schedules, plans memory and lays out a LoweredGraph as a ProgramImage for ``contexts``
    device contexts. Keeps the plan (``plan``, ``steps``, ``context_bos``) for inspection."""

    def __init__(self, lowered: LoweredGraph, contexts: int | None = None,
                 cores: int | None = None) -> None:
        self.lowered = lowered
        self.calls = lowered.calls
        self.bufs = lowered.bufs
        self.cores = cores or lowered.profile.cores
        self._schedule()
        self._assign_contexts(contexts)
        self._coalesce()
        self._liveness()
        self._plan_arena()
        self._lay_out_weights()
        self._lay_out_regcmd()
        self._check_sizes()
        self._make_bos()
        self._uploads()
        self._names_of: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
        self._jnames: dict[tuple[int, int, int], dict[str, tuple[int, int]]] = {}
        self._words_and_relocations()
        self._sources()
        self._walk_steps()
        self._copy_descriptors()
        step_specs = self._step_specs()
        self.image = ProgramImage(
            profile=lowered.profile.name, contexts=self.ncores, bos=self.bos,
            uploads=self.uploads, zero_fills=self.zero_fills, words=self.words, relocs="relocs",
            jobs=self.job_specs, steps=step_specs,
            inputs=[self._sig(bd, "in") for bd in lowered.inputs],
            outputs=[self._sig(bd, "out") for bd in lowered.outputs], sources=self.sources,
            placement=[Placement(d.node, d.loc, d.where, d.how, d.why or "")
                       for d in lowered.decisions],
            stats=program_stats(self), arrays=self.arrays,
            core_placement=[CorePlacement(c.label, c.jobs, c.cores, c.rule_cores, c.describe())
                            for c in self.core_choices],
            tilings=[TilingChoice(pc.node, int(t.agrees), t.describe())
                     for pc in self.calls if pc.call.where == "npu"
                     for t in pc.call.lowering.tile_choices])
        # not checked here: every consumer checks the image before using it (load_image,
        # write_bundle, ProgramImage.from_json), and a check costs ~18 ms on ModernBERT x22

    # ------------------------------------------------------------------ memory plan
    def _schedule(self) -> None:
        self.steps: list[ScheduledStep] = schedule(self.calls, self.cores)

    def _coalesce(self) -> None:
        # after the contexts are final (only context-0 steps merge), before liveness (the
        # memory plan follows the new order)
        self._live_steps, self._multi_spans = self.steps, []
        if not debugflags.enabled(debugflags.NO_COALESCE.name):
            self.steps, self._live_steps, self._multi_spans = coalesce(self.steps, self.calls)

    def _liveness(self) -> None:
        # in the unmerged order: a merged step's parts run one after the other (coalesce.py)
        spans = call_spans(self._live_steps, len(self.calls))
        for r in self._multi_spans:     # a step over several contexts: copies around all of it
            for ci in {c for si in r for c in self._live_steps[si].calls}:
                spans[ci] = (min(spans[ci][0], r.start), max(spans[ci][1], r.stop - 1))
        for b in self.bufs:
            b.first, b.last = 1 << 60, -1
        for ci, pc in enumerate(self.calls):
            f, l = spans[ci]
            for bid, _ in pc.binding.values():
                b = self.bufs[bid]
                b.first, b.last = min(b.first, f), max(b.last, l)

    def _plan_arena(self) -> None:
        for b in self.bufs:
            if b.kind == "arena" and b.last < 0:    # never touched: it still gets its bytes
                b.first = b.last = 0
        # the layers' must-stay-zero buffers share slots where they are alike (zero_pools.py)
        boundary = {bd.tensor.buf for bd in (*self.lowered.inputs, *self.lowered.outputs)}
        reqs, slot_of = pool_zero_buffers(self.bufs, self.calls, boundary,
                                          not debugflags.enabled(debugflags.NO_ZERO_POOLS.name))
        self.plan: ArenaPlan = plan_arena(reqs)
        check_plan(reqs, self.plan)
        for bid, slot in slot_of.items():
            self.plan.offsets[bid] = self.plan.offsets[slot]
        if slot_of:     # "without reuse" stays every buffer in a range of its own
            self.plan.naive_size = naive_size(b for b in self.bufs if b.kind == "arena")

    def _assign_contexts(self, contexts: int | None) -> None:
        """How many cores each NPU step uses, by modelled cost (placement.py), its jobs dealt
        round-robin over them. A core is one device context (rocket: one fd) with its own IOVA
        space, so every BO a job touches must live in the job's context."""
        self.ncores = max(1, min(self.cores, contexts if contexts is not None else self.cores))
        self._host_scratch: set[tuple[int, str]] = set()
        self._private_of: dict[tuple[int, str], bool] = {}
        self._slot_of: dict[tuple[int, str], tuple[int, int] | None] = {}
        self._shapes: dict = {}     # job_shapes.py
        self._spans: dict = {}
        for st in self.steps:
            if st.kind == "host":
                ci, hs = st.host
                self._host_scratch.update((ci, sl.buffer) for sl in hs.operands.values())
        self.core_choices: list[CoreChoice] = []
        if self.ncores > 1:
            # by the copies residency tracking makes (resident_placement.py), or placement.py's
            # eager model with ROCKJIT_EAGER_COPIES
            self.core_choices, self._job_runs = place(
                self, debugflags.enabled(debugflags.EAGER_COPIES.name))
        else:
            self._job_runs = None
            for st in self.steps:
                for jr in st.jobs:
                    jr.core = 0
        self.used = sorted({jr.core for st in self.steps for jr in st.jobs} | {0})

    def _lay_out_weights(self) -> None:
        """Per context, the span of each weights buffer it reads, one after another
        (weight_spans.lay_out_weights)."""
        self.wbufs = [bf for bf in self.bufs if bf.kind == "weights"]
        self.wspan, self.woff, self.wsize, self.weights_bytes = lay_out_weights(self)

    def _lay_out_regcmd(self) -> None:
        """Per context, its jobs' kicks, job after job (regcmd_image.py): ``jbase``, ``rsize``."""
        self.rspec = {ci: next((sp for sp in pc.call.lowering.buffers if sp.role == "regcmd"), None)
                      for ci, pc in enumerate(self.calls)}
        self.jbase, self.rsize, self.reused_spans = lay_out_regcmd(self)
        self.regcmd_bytes = sum(self.rsize.values())

    def _check_sizes(self) -> None:
        self.arena_bytes = self.plan.size + _ARENA_SLACK
        g = self.lowered.graph
        check_bo("activation arena", self.arena_bytes,
                 [(b.name, b.size) for b in self.bufs if b.kind == "arena"], g)
        check_bo("weights", max(self.wsize.values()), [(b.name, b.size) for b in self.wbufs], g)
        check_bo("regcmd", max(self.rsize.values()),
                 [(f"call {ci}", sp.nbytes) for ci, sp in self.rspec.items() if sp is not None], g)

    # ------------------------------------------------------------------ BOs and their contents
    def _add_bo(self, size: int, role: str, core: int) -> int:
        self.bos.append(BoSpec(role, core, int(size)))
        return len(self.bos) - 1

    def _make_bos(self) -> None:
        """Every used context gets its own arena (a mirror at the same offsets, so a job's
        relocations differ only in the BO), weights and regcmd BOs."""
        self.bos: list[BoSpec] = []
        self.arena_c = {c: self._add_bo(self.arena_bytes, "arena", c) for c in self.used}
        self.weights_c = {c: self._add_bo(max(self.wsize[c], 64), "weights", c) for c in self.used}
        self.regcmd_c = {c: self._add_bo(max(self.rsize[c], 64), "regcmd", c) for c in self.used}
        self.context_bos = {c: (self.arena_c[c], self.weights_c[c], self.regcmd_c[c])
                            for c in self.used}

    def _where(self, bid: int, core: int = 0) -> tuple[int, int]:
        """(BO, byte offset) of a lowered buffer in a context."""
        if self.bufs[bid].kind == "weights":
            return self.weights_c[core], self.woff[(core, bid)]
        return self.arena_c[core], self.plan.offsets[bid]

    def _uploads(self) -> None:
        """Each context gets the span of each weights buffer it holds (``_lay_out_weights``),
        as pieces shared between the contexts."""
        self.arrays: dict[str, np.ndarray] = {}
        self.uploads: list[Upload] = []
        self.zero_fills: list[ZeroFill] = []
        for bf in self.wbufs:
            if bf.data is None or not bf.data.size:
                continue
            data = np.ascontiguousarray(bf.data).reshape(-1).view(np.uint8)
            span = {c: self.wspan[(c, bf.id)] for c in self.used if (c, bf.id) in self.wspan}
            for lo, hi in buffer_pieces(data.size, list(span.values())):
                key = f"w{bf.id}:{bf.name}" if (lo, hi) == (0, data.size) else \
                    f"w{bf.id}:{bf.name}@{lo}"
                for c, (slo, shi) in span.items():
                    if slo <= lo and hi <= shi:
                        self.arrays[key] = data[lo:hi]
                        self.uploads.append(Upload(self.weights_c[c], self.woff[(c, bf.id)] + lo,
                                                   key))
        # once per range: the pooled zero buffers of a slot share theirs (zero_pools.py)
        zeroed = dict.fromkeys((self.plan.offsets[bf.id], bf.size) for bf in self.bufs
                               if bf.kind == "arena" and bf.zero)
        for c in self.used:
            self.zero_fills += [ZeroFill(self.arena_c[c], off, size) for off, size in zeroed]

    def _names_for(self, ci: int, core: int) -> dict[str, tuple[int, int]]:
        """A call's buffer names -> (BO, byte offset) in a context (once per call and
        context: the BOs and offsets are final when it is first asked; not to be changed)."""
        names = self._names_of.get((ci, core))
        if names is not None:
            return names
        names = self._names_of[(ci, core)] = {}
        for name, (bid, off) in self.calls[ci].binding.items():
            if self.bufs[bid].kind == "weights" and (core, bid) not in self.woff:
                continue        # a buffer this context holds no span of (_lay_out_weights)
            bo, base = self._where(bid, core)
            names[name] = (bo, base + off)
        return names

    def _job_names(self, jr: JobRef) -> dict[str, tuple[int, int]]:
        """``_names_for`` of the job's call and context plus its regcmd name, which resolves
        per job (``_lay_out_regcmd``)."""
        sp = self.rspec[jr.call]
        names = self._names_for(jr.call, jr.core)
        if sp is None:
            return names
        lo = job_span(self._spans, jr.job, sp.name)[0]
        key = (jr.core, jr.call, lo)
        hit = self._jnames.get(key)
        if hit is None:
            hit = self._jnames[key] = {**names,
                                       sp.name: (self.regcmd_c[jr.core], self.jbase[key])}
        return hit

    def _words_and_relocations(self) -> None:
        """One word array per regcmd BO (unwritten gaps are zero) + the relocations
        (regcmd_image.py)."""
        words_of, relocs = words_and_relocations(self)
        self.words: list[Words] = []
        for c in self.used:
            self.arrays[f"regcmd{c}"] = words_of[c]
            self.words.append(Words(self.regcmd_c[c], 0, f"regcmd{c}"))
        self.arrays["relocs"] = relocs

    def _sources(self) -> None:
        """The user's file:line of each call's op (from the placement decisions), keyed on the
        value ("%7"): a fused activation's decision is labelled by its kind."""
        self._loc_of = {d.node.split(" = ")[0]: d.loc for d in self.lowered.decisions}
        self.sources: list[Source] = []
        self._src_index: dict[int, int] = {}

    def _source(self, ci: int) -> int:
        if ci not in self._src_index:
            pc = self.calls[ci]
            self._src_index[ci] = len(self.sources)
            self.sources.append(Source(pc.node, self._loc_of.get(pc.node.split(" = ")[0], ""),
                                       pc.call.emitter))
        return self._src_index[ci]

    # ------------------------------------------------------------------ steps
    def _private(self, ci: int, name: str) -> bool:
        """Only the job itself touches it, so it never moves between contexts. A job's own
        scratch (DPU K accumulators, broadcast cubes: written and read inside the job) stays
        in its context. Scratch a host step of the call touches is shared with context 0,
        where host steps run: the im2col cube of a patchify, the packed B of a run-time
        matmul, K partials the host sums. It moves like any other tensor."""
        hit = self._private_of.get((ci, name))
        if hit is None:
            sp = self._spec(ci, name)
            hit = self._private_of[(ci, name)] = sp is not None and (
                (ci, name) not in self._host_scratch if sp.role == "scratch"
                else sp.role in ("regcmd", "const"))
        return hit

    def _ranges(self, jr: JobRef, which: str, placed: bool = True) -> list[tuple[int, int, int, int]]:
        """The arena bytes a job's DMA reads or writes, as (start, pieces, pitch, chunk)
        strided runs (its op-private scratch excluded: only the job touches it). The arenas
        of all contexts mirror each other, so the runs do not depend on the job's core.
        ``placed=False`` (before the arena plan): ``start`` only identifies the run (buffer
        and offset), for counting bytes."""
        shape = job_shape(self._shapes, jr.job)
        out = []
        for name, off, pieces, pitch, chunk in shape.reads if which == "r" else shape.writes:
            key = (jr.call, name)
            slot = self._slot_of.get(key, 0)
            if slot == 0:
                slot = self._slot_of[key] = self._arena_slot(jr.call, name)
            if slot is None:
                continue
            base = self.plan.offsets[slot[0]] if placed else (slot[0] + 1) << 40
            out.append((base + slot[1] + off, pieces, pitch, chunk))
        return out

    def _arena_slot(self, ci: int, name: str) -> tuple[int, int] | None:
        """(buffer id, offset) of a call's name when it is arena bytes that move between
        contexts (not private to the job, ``_private``), else None."""
        if self._private(ci, name):
            return None
        bid = self.calls[ci].binding.get(name)
        return None if bid is None or self.bufs[bid[0]].kind != "arena" else bid

    def _walk_steps(self) -> None:
        """Jobs, host steps and cross-context copies in schedule order, as pending records."""
        self.job_cores: list[int] = []
        self._count = dict.fromkeys(("npu_steps", "jobs", "tasks", "kicks", "host", "packed",
                                     "unpacked", "dev_read", "dev_written", "copied",
                                     "copy_steps"), 0)
        self._desc_bufs: list[np.ndarray] = []
        self._copy_at_zero: dict[tuple[int, int, int], np.ndarray] = {}
        self._pending: list[tuple] = []
        n = self._count
        eager = debugflags.enabled(debugflags.EAGER_COPIES.name)
        # one context: nothing to copy
        walk = None if eager or self.used == [0] else ResidencyWalk(self, self._job_runs)
        merger = StepMerger(self)
        for si, st in enumerate(progress(self.steps, "laying out the program image")):
            if st.kind != "npu":
                ci, hs = st.host
                where = {} if walk is None else walk.host_contexts(st)
                self._pending.append(("host", ci, hs, where))
                n["host"] += 1
                nb = hs.moved_bytes
                if hs.kind.startswith("pack"):
                    n["packed"] += nb
                elif hs.kind.startswith("unpack"):
                    n["unpacked"] += nb
                # a one-pass strided re-layout (layout_conversion.py) says what it moves
                n["packed"] += int(hs.params.get("packed_bytes", 0))
                n["unpacked"] += int(hs.params.get("unpacked_bytes", 0))
                continue
            ins, outs = eager_copies(self, st) if walk is None else ([], [])
            if walk is not None:
                walk.npu_step(st)
            for src, dst, run in ins:
                cross_context_copy(self, src, dst, run)
            self._pending.append(("npu", merger.step(si, st.jobs, [
                j for jr in st.jobs for j in self._runtime_jobs(jr)])))
            n["npu_steps"] += 1
            for src, dst, run in outs:
                cross_context_copy(self, src, dst, run)
        if walk is not None:
            walk.finish()
        merger.finish()

    def _runtime_jobs(self, jr: JobRef) -> list[tuple]:
        """One scheduled job's runtime jobs: (tasks, read BOs, written BOs, core, chained,
        call); counts its declared DMA bytes."""
        n = self._count
        names = self._job_names(jr)
        shape = job_shape(self._shapes, jr.job)
        rd = {names[nm][0] for nm in shape.named_reads if nm in names}
        wr = {names[nm][0] for nm in shape.named_writes if nm in names}
        for nm in shape.reloc_names:
            tbo = names[nm][0]
            if tbo not in wr and tbo != self.regcmd_c[jr.core]:
                rd.add(tbo)
        n["dev_read"] += shape.dev_read
        n["dev_written"] += shape.dev_written
        out = []
        # a BO the job both reads and writes is listed as written only: the kernel signals
        # such a job done without running it (ProgramBuilder.add_job)
        swr = tuple(sorted(wr))
        srd = tuple(sorted(rd - wr))
        for chained, tasks in shape.runtime:
            tlist = tuple([(names[rb][0], names[rb][1] + off, cnt) for rb, off, cnt in tasks])
            out.append((tlist, srd, swr, jr.core, chained, jr.call))
        return out

    def _copy_descriptors(self) -> None:
        """The copy descriptors: a small BO of context 0 (written once, address-free)."""
        self._cdesc_bo = (self._add_bo(max(DESC_BYTES * len(self._desc_bufs), 64), "weights", 0)
                          if self._desc_bufs else None)
        for k, data in enumerate(self._desc_bufs):
            key = f"copydesc{k}"
            self.arrays[key] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            self.uploads.append(Upload(self._cdesc_bo, DESC_BYTES * k, key))

    def _step_specs(self) -> list[StepSpec]:
        self.job_specs: list[JobSpec] = []
        step_specs: list[StepSpec] = []
        members: list = []     # per image step: (call, HostStep) of a lowering's host step
        for item in self._pending:
            if item[0] == "npu":
                ids = []
                calls_here = []
                for tl, rd, wr, core, ch, ci, *merged in item[1]:
                    # a merged job (job_merge.py) carries the source naming all its ops
                    src = merged[0] if merged else self._source(ci)
                    self.job_specs.append(JobSpec(core, bool(ch), tl, rd, wr, src))
                    ids.append(len(self.job_specs) - 1)
                    calls_here.append(ci)
                step_specs.append(StepSpec("npu", tuple(ids), None, self._source(calls_here[0])))
                members.append(None)
            elif item[0] == "host":
                _, ci, hs, where = item
                step_specs.append(StepSpec("host", (), self._host_step(ci, hs, where),
                                           self._source(ci)))
                members.append((ci, hs))
            else:
                _, sc, dc, k = item
                step_specs.append(StepSpec("host", (), HostStepSpec(
                    "copy", {"dst": (self.arena_c[dc], 0, "u8", 0),
                             "desc": (self._cdesc_bo, DESC_BYTES * k, "u8", 0),
                             "src": (self.arena_c[sc], 0, "u8", 0)}, {}), -1))
                members.append(None)
        return fuse_host_steps(self, step_specs, members)

    # ------------------------------------------------------------------ stats and signatures
    def _sig(self, bd: Boundary, prefix: str) -> TensorSig:
        t = bd.tensor
        bo, base = self._where(t.buf)
        shape = tuple(int(d) for d in bd.value.type.shape)
        # a 0-d value is held as one element: the same bytes, row-major
        assert int(np.prod(shape)) == int(np.prod(t.form.shape)), (shape, t.form.shape)
        return TensorSig(f"{prefix}{bd.index}", int(bd.index), shape,
                         bd.value.type.dtype.to_numpy().name, t.form.dtype.to_numpy().name,
                         bo, int(base + t.offset))

    # ------------------------------------------------------------------ helpers
    def _spec(self, ci: int, name: str) -> Any:
        for s in self.calls[ci].call.lowering.buffers:
            if s.name == name:
                return s
        return None

    def _host_step(self, ci: int, hs: HostStep, where: dict[str, int]) -> HostStepSpec:
        """``where``: operand -> the context whose arena it uses (context 0 when absent)."""
        # host steps resolve names in context 0
        spec = host_step_spec(hs, self._names_for(ci, 0), lambda n: self._spec(ci, n))
        if not any(where.values()):
            return spec
        ops = dict(spec.operands)
        for opname, ctx in where.items():
            bo, off, dt, rs = ops[opname]
            assert bo == self.arena_c[0], (opname, bo)
            ops[opname] = (self.arena_c[ctx], off, dt, rs)
        return HostStepSpec(spec.kind, ops, spec.params)
