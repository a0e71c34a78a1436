"""A conv tile plan (tiling.py) -> jobs of self-chained kicks of conv tasks (task.py); shared
by the conv and matmul emitters.

Sources: [kacc] encodings/k-accumulation.md; [task] encodings/regcmd-task-model.md;
[reuse] encodings/cbuf-reuse.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...ir.types import DType
from ..bounds import check_tasks
from ..op_lowering import BufferSpec, HostStep, NpuStep, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, EmittedTask
from ..tiling import (KACC_DPU, KACC_HOST, ConvPlan, cbuf_split, ceil_div, round_up,
                      weight_bytes_of)
from .dpu_stages import ew_stage
from .jobs import JobTasks, assemble_jobs
from .reuse import reuse_groups
from .task import ConvRequant, ConvTaskGeom, DpuStages, conv_task, emit_conv_task


@dataclass(frozen=True)
class CubeRef:
    """Where one image's cube lives: buffer + offset, and the pitches of the whole cube."""

    buffer: str
    offset: int
    line_pitch: int
    surf_pitch: int


@dataclass
class Scratch:
    """Op-private scratch, bump-allocated (K-accumulation partials)."""

    name: str
    nbytes: int = 0

    def take(self, nbytes: int, align: int = 64) -> int:
        off = round_up(self.nbytes, align)
        self.nbytes = off + nbytes
        return off


@dataclass
class TiledTasks:
    """The jobs of one plan: per job, its kicks (each a list of tasks) and the buffers it uses."""

    jobs: list[JobTasks] = field(default_factory=list)
    planned: int = 0   # tasks of the plans appended so far (checked against the compile bound)
    choices: list = field(default_factory=list)   # each plan's tile_choice.TileChoice, once


@dataclass(frozen=True)
class Epilogue:
    """What the conv's own DPU applies on the way out (issue 9): ``ew`` = (op, buffer,
    offset(rows, first channel)) combines the result with an operand cube of each task's output
    geometry (dense, e.g. a bias broadcast over the tile's rows) in the EW stage; ``act`` runs
    BN / LUT / OUT_CVT stages (a LUT activation, no EW operand). The simulator refuses an EW
    operand op and the LUT in one pass (csrc/sim/dpu.c: their order is undocumented), so an
    epilogue is one of the two. The EW stage of every later K step adds the partial, so the EW
    operand rides the *first* K step (whose output is then an fp32 partial: ``ew_esize`` 4, the
    operand in the partials' own format [kacc]) and an activation needs one K step."""

    ew: tuple[str, str, Callable[[int, int], int]] | None = None
    act: DpuStages | None = None
    ew_esize: int = 2

    def stages(self) -> DpuStages:
        if self.ew is not None and self.act is not None:
            raise LoweringError("an epilogue runs either an EW operand op or a LUT activation in "
                                "one task (the order of both in the EW stage is undocumented; "
                                "csrc/sim/dpu.c refuses it); apply the other as its own pass")
        if self.ew is None and self.act is None:
            raise LoweringError("an empty epilogue: give an EW operand op or an activation")
        return self.act if self.act is not None else DpuStages(ew=ew_stage(self.ew[0], self.ew_esize))


def build_tiled(plan: ConvPlan, profile: ChipProfile, *, feature: CubeRef, weight_buffer: str,
                weight_offset: Callable[[int, int], int], out: CubeRef, scratch: Scratch,
                host_partials: tuple[str, int] | None, name: str, into: TiledTasks,
                requant: ConvRequant | None = None, bias_buffer: str | None = None,
                epilogue: Epilogue | None = None, reuse: bool = False, images: int = 1) -> None:
    """Append one image's jobs for ``plan`` to ``into``: one job per (row tile, output-channel
    tile), its K steps in order; with ``reuse``, one job per group of tiles that keep a shared
    operand in the CBUF (reuse.py; ``images`` such images share the step's cores). fp16 K steps are self-chained into one kick (the PC honours the
    in-kick read-after-write of a partial, regcmd-task-model.md "in-kick data dependency");
    integer K steps are separate kicks (the CACC clears per kick) and their partials go to
    ``host_partials`` = (buffer, stride between K steps) for a host add.

    ``weight_offset(j, ki)``: byte offset of the weight tile for kernel tile j, K step ki.
    ``epilogue``: the DPU stages the first K step of every (fp16) job applies (Epilogue).
    """
    s = plan.shape
    if epilogue is not None:
        ep_stages = epilogue.stages()
        if s.in_dtype != DType.F16 or requant is not None or s.depthwise:
            raise LoweringError(f"{name}: a DPU epilogue runs on the fp16 direct path")
        if plan.k_steps > 1 and (epilogue.act is not None or plan.kacc != KACC_DPU):
            raise LoweringError(
                f"{name}: an activation epilogue needs K in one pass, and this plan has "
                f"{plan.k_steps} K steps (the EW stage of the last one adds the partial, and the "
                f"simulator refuses an EW operand op with the LUT); run it as its own pass")
        want = profile.output(s.in_dtype, DType.F32 if plan.k_steps > 1 else s.out_dtype).esize
        if epilogue.ew is not None and epilogue.ew_esize != want:
            raise LoweringError(f"{name}: the EW epilogue operand must have {want}-byte elements "
                                f"(the first K step's output format), got {epilogue.ew_esize}")
    p = profile.input(s.in_dtype)
    outf = profile.output(s.in_dtype, s.out_dtype)
    c2_in = p.feature_c2
    nk = plan.k_steps
    if plan.choice is not None and plan.choice not in into.choices:
        into.choices.append(plan.choice)
    into.planned += len(plan.rows) * len(plan.kernels) * (1 if s.depthwise else len(plan.channels))
    check_tasks(into.planned, f"{name} ({s.in_dtype.value}, {s.height}x{s.width}x{s.channels} "
                              f"-> {s.kernels} channels)")
    # K partials in fp32 even for an fp16 result: each fp16 partial would round the running sum
    # to 11 bits once per K step (11 steps for whisper-base's fc2, K = 2048), the dominant
    # matmul error on real weights. The intermediate steps write fp32 cubes; every step after
    # the first reads the previous one as a 32-bit EW operand (EDATA_SIZE 3, [kacc]); only the
    # last narrows to the output dtype.
    part_dtype = DType.F32 if plan.kacc == KACC_DPU and s.in_dtype == DType.F16 else s.out_dtype
    partf = profile.output(s.in_dtype, part_dtype)
    groups = reuse_groups(plan, profile, images) if reuse else \
        [("none", ((ri, j),)) for ri in range(len(plan.rows)) for j in range(len(plan.kernels))]
    for mode, members in groups:
        # one CBUF split per K step of the group: a reuse bit keeps an operand only across
        # tasks with the same bank partition [reuse]; the plan checked that its largest row
        # tile, K step and kernel tile fit together (tiling.plan_conv). DATA_ENTRIES stays the
        # step's own row width.
        rows_max = max(plan.rows[ri].in_rows for ri, _ in members)
        kern_max = max(plan.kernels[j].size for _, j in members)
        chains = []
        for ri, j in members:
            r, ks = plan.rows[ri], plan.kernels[j]
            part_surf = r.out_rows * s.out_w * 16
            tile_out_bytes = part_surf * ceil_div(ks.size, partf.c2)
            final_off = out.offset + (ks.start // outf.c2) * out.surf_pitch + r.out_row * s.out_w * 16
            dense = out.surf_pitch == part_surf and partf.c2 == outf.c2
            slots: list[Reloc] = []
            if plan.kacc == KACC_DPU:
                # ping-pong partials, never in place [kacc]. When this tile's part of the output
                # cube is itself a dense tile cube of the partials' dtype it serves as one side
                # (conformance 02 does the same), else two scratch slots.
                # slots[0] holds the steps of the final step's parity, slots[1] the others
                odd = Reloc(scratch.name, scratch.take(tile_out_bytes))
                if dense:
                    even = Reloc(out.buffer, final_off)
                elif nk >= 3:
                    even = Reloc(scratch.name, scratch.take(tile_out_bytes))
                else:
                    even = odd          # never used with two steps
                slots = [even, odd]
            chains.append([r, j, ks, final_off, slots, None])
        tasks: list[EmittedTask] = []
        reads, writes = {feature.buffer, weight_buffer}, set()
        # K step by K step, every tile of the group per step: the shared operand of a step is
        # fetched by its first task and kept by the others (reuse.py)
        for ki in range(1 if s.depthwise else nk):
            split = None if mode == "none" else cbuf_split(
                profile, s.in_dtype, rows_max, s.width, plan.channels[ki].size,
                weight_bytes_of(s, profile, kern_max, plan.channels[ki].size))
            for ti, chain in enumerate(chains):
                r, j, ks, final_off, slots, prev = chain
                cs = ks if s.depthwise else plan.channels[ki]
                last = ki == nk - 1
                out_dtype = s.out_dtype
                if plan.kacc == KACC_DPU:
                    # the final step lands in the output; earlier ones alternate backwards from it
                    dst = Reloc(out.buffer, final_off) if last else slots[(nk - 1 - ki) % 2]
                    dsurf = out.surf_pitch if last else r.out_rows * s.out_w * 16
                    out_dtype = s.out_dtype if last else part_dtype
                elif plan.kacc == KACC_HOST and ki > 0:
                    assert host_partials is not None
                    dst = Reloc(host_partials[0], final_off + (ki - 1) * host_partials[1])
                    dsurf = out.surf_pitch
                else:
                    dst, dsurf = Reloc(out.buffer, final_off), out.surf_pitch
                g = ConvTaskGeom(
                    s.in_dtype, out_dtype, s.depthwise, r.in_rows, s.width, cs.size,
                    feature.line_pitch, feature.surf_pitch, s.kh, s.kw, ks.size, s.sy, s.sx,
                    s.dy, s.dx, r.pad_top, s.pad_left, r.out_rows, s.out_w, dsurf,
                    ew_esize=partf.esize if (plan.kacc == KACC_DPU and ki > 0) else 0,
                    requant=requant, cbuf=split)
                feat = Reloc(feature.buffer, feature.offset + (cs.start // c2_in) * feature.surf_pitch
                             + r.in_row * feature.line_pitch)
                wt = Reloc(weight_buffer, weight_offset(j, ki))
                tname = f"{name}.r{r.out_row}.n{ks.start}.k{cs.start}"
                task_reuse = mode if ti > 0 else "none"
                # the requant vector of this kernel tile: int32 per output channel
                bias = None if bias_buffer is None else Reloc(bias_buffer, 4 * ks.start)
                if epilogue is None or ki > 0:
                    tasks.append(emit_conv_task(g, profile, feat, wt, dst,
                                                ew_operand=prev if g.ew_esize else None,
                                                name=tname, bias=bias, reuse=task_reuse))
                else:
                    where = {"feature": feat, "weight": wt, "out": dst}
                    if epilogue.ew is not None:
                        _, ebuf, eoff = epilogue.ew
                        where["ew"] = Reloc(ebuf, eoff(r.out_rows, ks.start))
                        reads.add(ebuf)
                    tasks.append(conv_task(g, profile, where, stages=ep_stages, name=tname,
                                           reuse=task_reuse))
                if bias is not None:
                    reads.add(bias.buffer)
                writes.add(dst.buffer)
                chain[5] = dst
        # a buffer written inside the job is listed as written only (jobs.assemble_jobs)
        kicks = [tasks] if p.chainable else [[t] for t in tasks]
        into.jobs.append(JobTasks(kicks, sorted(reads - writes), sorted(writes),
                                  integer=s.in_dtype.is_int))


def assemble(profile: ChipProfile, tiled: TiledTasks, buffers: list[BufferSpec],
             host_steps: Sequence[HostStep], macs: int, regcmd: str = "regcmd") -> OpLowering:
    """Lay every kick out in the op's regcmd buffer and wrap everything in an OpLowering."""
    jobs, end = assemble_jobs(profile, tiled.jobs, regcmd)
    bufs = list(buffers) + [BufferSpec(regcmd, "regcmd", round_up(max(end, 8), 64))]
    steps: list = [NpuStep(tuple(jobs))]
    steps.extend(host_steps)
    return OpLowering(tuple(bufs), tuple(steps), macs=macs, tile_choices=tuple(tiled.choices))


KPART = "kpart"  # the scratch buffer of the int32 K partials (KACC_HOST)


def host_partials(plan: ConvPlan, out_total: int) -> tuple[str, int] | None:
    """build_tiled's ``host_partials`` for a plan: where the int32 K partials go, if any."""
    return (KPART, out_total) if plan.kacc == KACC_HOST else None


def k_accumulation(plan: ConvPlan, scratch: Scratch, out_buffer: str,
                   out_total: int) -> tuple[list[BufferSpec], list[HostStep]]:
    """The buffers and host steps a plan's K accumulation needs around its tiled tasks: the DPU
    path's ``kacc`` scratch, or the host path's partials buffer and the steps summing it into
    ``out_buffer`` (``out_total`` bytes). Nothing when K fits one pass. Shared by every
    emitter that calls build_tiled, so the two paths are set up in one place."""
    if plan.kacc == KACC_DPU:
        return [BufferSpec(scratch.name, "scratch", max(scratch.nbytes, 64))], []
    if plan.kacc == KACC_HOST:
        steps, descs = host_partial_sum(out_buffer, KPART, out_total, plan.k_steps)
        return [BufferSpec(KPART, "scratch", out_total * (plan.k_steps - 1)), *descs], steps
    return [], []


def host_partial_sum(out_buffer: str, partials: str, nbytes: int,
                     steps: int) -> tuple[list[HostStep], list[BufferSpec]]:
    """int32 K partials: ``out += partial_1 + ... + partial_{steps-1}`` over ``nbytes``.

    Expressed with the generic host-op library (host_rules.host_op_step): one in-place
    ``binary add`` per partial on int32 views (the library computes integer math in 64 bits
    and wraps to int32, exact whenever the true sum fits int32, which the int32 result
    requires). Returns the host steps and their descriptor consts ("ksum_desc{i}")."""
    from ...ir.ops import Op
    from ..host_rules import BINARY_CODES, HostView, host_op_step

    n = nbytes // 4
    sizes = {out_buffer: nbytes, partials: nbytes * (steps - 1)}
    out_steps, bufs = [], []
    for i in range(1, steps):
        sizes[f"ksum_desc{i}"] = 0
        st, desc = host_op_step(
            "binary", (n,), HostView(out_buffer, DType.I32, 0, (1,)),
            [HostView(out_buffer, DType.I32, 0, (1,)),
             HostView(partials, DType.I32, (i - 1) * n, (1,))],
            sizes, f"ksum_desc{i}", code=BINARY_CODES[Op.ADD], what="int32 K-partial sum")
        out_steps.append(st)
        bufs.append(desc)
    return out_steps, bufs
