"""Pooling on the PPU: max / average (and min) pools of an fp16 feature cube, and global pools.

A pool is a self-contained PPU + PPU_RDMA task (enable 0x60, no CNA/CORE/DPU): PPU_RDMA reads
the input cube, the PPU reduces each kernel window per channel and writes the output cube in
the same 8-channel layout (notes: encodings/ppu-pooling.md; conformance 07 and 08, whose
programs this emitter reproduces register for register).

Semantics (what the simulator models, after ppu-pooling.md):
  * kernel and stride 1..16 per axis (4-bit fields holding value - 1); padding 0..7 per side
    (3-bit fields, counts as is); every window lies inside the padded input.
  * max: padded positions read -inf (PADDING_VALUE 0xFC00), so they never win.
  * average: the window sum times two per-axis fp16 reciprocals fp16(65536/k) and 2^-32 -- the
    PPU has no divider. The divisor is kh*kw **including padded positions** (count-include-pad);
    a kernel axis of 1 cannot hold 65536 in fp16, so then the divisor is split geometrically
    over both axes (fp16(65536/sqrt(kh*kw)) each), the notes' asymmetric-final-pass rule.
  * fp16 only: the PPU has no int8 mode.

Global pools over [H, W] telescope into non-overlapping pools (notes:
encodings/ppu-reduce-mean.md): each axis is factored into kernels in [2, 16], smallest first,
aligned so both axes finish in the last pass; every intermediate the PPU writes and the next
pass reads keeps both sides >= 4 (a PPU-written sub-4 cube is mis-read by the next pass, same
page). Each pass is its own kick, intermediates ping-pong between two scratch cubes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations_with_replacement

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, feature_layout
from ..op_lowering import BufferSpec, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, TaskBuilder, EmittedTask
from ..arith import round_up
from ..op_lowering import NpuStep
from .eltwise import check_fp16_cube, fp16_bits, npu_program, resolve_profile
from .jobs import JobTasks, assemble_jobs

METHODS = {"avg": 0, "max": 1, "min": 2}   # POOLING_METHOD (ppu-pooling.md, ppu-reduce-mean.md)
KERNEL_MAX = 16                             # 4-bit value-1 fields
PAD_MAX = 7                                 # 3-bit pad counts
NEG_INF_F16 = 0xFC00                        # max-pool pad fill (ppu-pooling.md)
PPU_BURST_LEN = 3                           # PPU_MISC_CTRL.BURST_LEN of conformance 07/08
# PC enable bits the task needs: PPU (bit 5) and PPU_RDMA (bit 6) -> 0x60 via regcmd.enable_mask


@dataclass(frozen=True)
class PoolGeom:
    height: int
    width: int
    channels: int
    kh: int
    kw: int
    sh: int
    sw: int
    pad_t: int = 0
    pad_l: int = 0
    pad_b: int = 0
    pad_r: int = 0

    @property
    def out_h(self) -> int:
        return (self.height + self.pad_t + self.pad_b - self.kh) // self.sh + 1

    @property
    def out_w(self) -> int:
        return (self.width + self.pad_l + self.pad_r - self.kw) // self.sw + 1


def recip_words(kh: int, kw: int) -> tuple[int, int]:
    """PPU_RECIP_KERNEL_WIDTH / HEIGHT for an average over kh x kw (bit patterns)."""
    if kh >= 2 and kw >= 2:
        # per axis fp16(65536/k): conformance 08 (k=3 -> 0x7555), ppu-pooling.md
        return fp16_bits(65536.0 / kw), fp16_bits(65536.0 / kh)
    r = fp16_bits(65536.0 / math.sqrt(kh * kw))
    return r, r


def _check(g: PoolGeom, method: str, profile: ChipProfile) -> None:
    if method not in METHODS:
        raise LoweringError(f"pool method {method!r} is not one of {', '.join(METHODS)}")
    for name, v, lo, hi in (("kernel height", g.kh, 1, KERNEL_MAX), ("kernel width", g.kw, 1, KERNEL_MAX),
                            ("stride height", g.sh, 1, KERNEL_MAX), ("stride width", g.sw, 1, KERNEL_MAX),
                            ("pad top", g.pad_t, 0, PAD_MAX), ("pad left", g.pad_l, 0, PAD_MAX),
                            ("pad bottom", g.pad_b, 0, PAD_MAX), ("pad right", g.pad_r, 0, PAD_MAX)):
        if not lo <= v <= hi:
            raise LoweringError(f"pool {name} {v} is outside {lo}..{hi}, what the PPU's fields hold "
                                f"(ppu-pooling.md); a larger window is a global/telescoped pool")
    if method == "avg" and g.kh * g.kw < 2:
        raise LoweringError("an average pool over a 1x1 window is the identity; the PPU cannot "
                            "express its reciprocal (65536 overflows fp16)")
    if g.out_h < 1 or g.out_w < 1:
        raise LoweringError(f"pool {g.kh}x{g.kw} does not fit the padded {g.height}x{g.width} input")
    for name, v in (("height", g.height), ("width", g.width), ("out height", g.out_h),
                    ("out width", g.out_w)):
        if v > profile.cube_dim_limit:
            raise LoweringError(f"pool {name} {v} exceeds the cube limit {profile.cube_dim_limit}; "
                                f"split the map")


def emit_pool(g: PoolGeom, method: str, profile: ChipProfile, src: Reloc, dst: Reloc,
              channels: int | None = None, src_surf_stride: int | None = None,
              dst_surf_stride: int | None = None, name: str = "pool",
              src_line_stride: int | None = None) -> EmittedTask:
    """One PPU task; ``channels`` (default g.channels) of the cube starting at src/dst.
    ``src_line_stride`` (default dense, width * 16 B): bytes between input lines."""
    _check(g, method, profile)
    c = channels or g.channels
    atom = profile.atom_bytes
    line = src_line_stride or g.width * atom
    if line < g.width * atom or line % atom:
        raise LoweringError(f"pool input line stride {line} B must be a multiple of {atom} B "
                            f"and hold {g.width} positions")
    s_surf = src_surf_stride or g.height * line
    d_surf = dst_surf_stride or g.out_h * g.out_w * atom
    prec = profile.input(DType.F16).precision
    t = TaskBuilder(name, profile)
    t.write("PPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("PPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("PPU_DATA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=g.width - 1)
    t.write("PPU_DATA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=g.height - 1)
    t.write("PPU_DATA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=c - 1)
    t.write("PPU_DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=g.out_w - 1)
    t.write("PPU_DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=g.out_h - 1)
    t.write("PPU_DATA_CUBE_OUT_CHANNEL", CUBE_OUT_CHANNEL=c - 1)
    # standalone pool fed by PPU_RDMA: FLYING_MODE 1 with DPU_FLYIN 0 (ppu-pooling.md)
    t.write("PPU_OPERATION_MODE_CFG", FLYING_MODE=1, POOLING_METHOD=METHODS[method])
    t.write("PPU_POOLING_KERNEL_CFG", KERNEL_WIDTH=g.kw - 1, KERNEL_HEIGHT=g.kh - 1,
            KERNEL_STRIDE_WIDTH=g.sw - 1, KERNEL_STRIDE_HEIGHT=g.sh - 1)
    rw, rh = recip_words(g.kh, g.kw) if method == "avg" else (0, 0)
    t.write("PPU_RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=rw)
    t.write("PPU_RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=rh)
    t.write("PPU_POOLING_PADDING_CFG", PAD_LEFT=g.pad_l, PAD_TOP=g.pad_t, PAD_RIGHT=g.pad_r,
            PAD_BOTTOM=g.pad_b)
    padded = (g.pad_t | g.pad_l | g.pad_b | g.pad_r) != 0
    t.write("PPU_PADDING_VALUE_1_CFG", PAD_VALUE_0=NEG_INF_F16 if (padded and method == "max") else 0)
    t.write("PPU_PADDING_VALUE_2_CFG")
    t.write_addr("PPU_DST_BASE_ADDR", dst.buffer, dst.offset)
    t.write("PPU_DST_SURF_STRIDE", DST_SURF_STRIDE=d_surf // 16)
    # INDEX_ADD mirrors the output surface stride (ppu-pooling.md; conformance 07: 0x142)
    t.write("PPU_DATA_FORMAT", INDEX_ADD=d_surf // 16, PROC_PRECISION=prec)
    t.write("PPU_MISC_CTRL", BURST_LEN=PPU_BURST_LEN)
    t.write("PPU_RDMA_RDMA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=g.width - 1)
    t.write("PPU_RDMA_RDMA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=g.height - 1)
    t.write("PPU_RDMA_RDMA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=c - 1)
    t.write_addr("PPU_RDMA_RDMA_SRC_BASE_ADDR", src.buffer, src.offset)
    t.write("PPU_RDMA_RDMA_SRC_LINE_STRIDE", SRC_LINE_STRIDE=line // 16)
    t.write("PPU_RDMA_RDMA_SRC_SURF_STRIDE", SRC_SURF_STRIDE=s_surf // 16)
    t.write("PPU_RDMA_RDMA_DATA_FORMAT", IN_PRECISION=prec)
    # DMA: every channel group of the input map in, of the output map out
    groups = -(-c // profile.input(DType.F16).feature_c2)
    # each surface's lines; (h - 1) * line + width * atom = h * line for a dense input
    t.reads(src, (g.height - 1) * line + g.width * atom, groups, s_surf)
    t.writes(dst, g.out_h * g.out_w * atom, groups, d_surf)
    return t.finish()


def _pool_tasks(g: PoolGeom, method: str, profile: ChipProfile, src: str, dst: str,
                name: str) -> list[EmittedTask]:
    """Channel-tiled tasks (each tile whole 8-channel surfaces within the cube-dim limit)."""
    c2 = profile.input(DType.F16).feature_c2
    atom = profile.atom_bytes
    s_surf = g.height * g.width * atom
    d_surf = g.out_h * g.out_w * atom
    step = profile.cube_dim_limit // c2 * c2
    out = []
    for c0 in range(0, g.channels, step):
        c = min(step, g.channels - c0)
        s = c0 // c2
        out.append(emit_pool(g, method, profile, Reloc(src, s * s_surf), Reloc(dst, s * d_surf),
                             channels=c, name=f"{name}{len(out)}"))
    return out


def build_pool(method: str, layout: CubeLayout, kernel: tuple[int, int],
               stride: tuple[int, int] | None = None, padding: tuple[int, int, int, int] = (0, 0, 0, 0),
               profile: ChipProfile | str | None = None) -> OpLowering:
    """A max / avg / min pool of an fp16 cube [H, W, C] (``layout``, dense).

    ``kernel`` = (kh, kw), ``stride`` = (sh, sw) (default = kernel), ``padding`` = (top, left,
    bottom, right). Buffers: ``x`` (input 0), ``out`` (output 0, the dense [OH, OW, C] cube),
    ``regcmd``."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"{method} pool")
    sh, sw = stride or kernel
    g = PoolGeom(layout.height, layout.width, layout.channels, kernel[0], kernel[1], sh, sw,
                 *padding)
    _check(g, method, profile)
    out = feature_layout(profile, DType.F16, g.out_h, g.out_w, g.channels)
    tasks = _pool_tasks(g, method, profile, "x", "out", f"{method}pool")
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", out.nbytes, layout=out, bind=0)]
    return npu_program(bufs, [tasks], profile, ("x",), ("out",))


def pool_output_layout(layout: CubeLayout, kernel: tuple[int, int],
                       stride: tuple[int, int] | None = None,
                       padding: tuple[int, int, int, int] = (0, 0, 0, 0),
                       profile: ChipProfile | str | None = None) -> CubeLayout:
    profile = resolve_profile(profile)
    sh, sw = stride or kernel
    g = PoolGeom(layout.height, layout.width, layout.channels, kernel[0], kernel[1], sh, sw, *padding)
    return feature_layout(profile, DType.F16, g.out_h, g.out_w, g.channels)


# ---------------------------------------------------------------------------------------------
# global pools
# ---------------------------------------------------------------------------------------------

def axis_factors(n: int) -> list[int] | None:
    """The fewest kernels in [2, 16] whose product is n, smallest first (most balanced among
    the fewest); [] for n = 1; None when n has a prime factor above 16."""
    if n == 1:
        return []
    for count in range(1, 64):
        best = None
        for combo in combinations_with_replacement(range(2, KERNEL_MAX + 1), count):
            if math.prod(combo) == n and (best is None or max(combo) < max(best)):
                best = combo
        if best is not None:
            return sorted(best)
        if 2 ** count > n:
            return None
    return None


def global_pool_plan(height: int, width: int) -> list[tuple[int, int]]:
    """Per-pass kernels (kh, kw) of a telescoped global pool; raises when no plan keeps every
    PPU-written intermediate at least 4 x 4 (ppu-reduce-mean.md)."""
    fh, fw = axis_factors(height), axis_factors(width)
    if fh is None or fw is None:
        bad = height if fh is None else width
        raise LoweringError(f"global pool over {height}x{width}: {bad} has a prime factor above 16, "
                            f"so no chain of PPU pools (kernels <= 16) covers it exactly; reduce "
                            f"on the host or with a ones-vector matmul (feature-reduce.md)")
    n = max(len(fh), len(fw), 1)
    fh = [1] * (n - len(fh)) + fh      # both axes finish in the last pass
    fw = [1] * (n - len(fw)) + fw
    plan = list(zip(fh, fw))
    h, w = height, width
    for kh, kw in plan[:-1]:
        h, w = h // kh, w // kw
        if h < 4 or w < 4:
            raise LoweringError(
                f"global pool over {height}x{width}: pass plan {plan} leaves a {h}x{w} intermediate; "
                f"a PPU-written cube under 4 on a side is mis-read by the next pass "
                f"(ppu-reduce-mean.md). Reduce on the host instead")
    return plan


def build_global_pool(method: str, layout: CubeLayout,
                      profile: ChipProfile | str | None = None) -> OpLowering:
    """Mean / max / min over [H, W] per channel -> a [1, 1, C] cube (``out``).

    Buffers: ``x`` (input 0), ``out`` (output 0), ``t0``/``t1`` (scratch intermediates when
    more than one pass), ``regcmd``. The mean's per-pass error is the fp16 rounding plus the
    reciprocal's quantisation (about 2^-11 relative per axis)."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"global {method} pool")
    plan = global_pool_plan(layout.height, layout.width)
    h, w, c = layout.height, layout.width, layout.channels
    groups, bufs = [], []
    src = "x"
    scratch_sizes = {}
    for i, (kh, kw) in enumerate(plan):
        g = PoolGeom(h, w, c, kh, kw, kh, kw)
        last = i == len(plan) - 1
        dst = "out" if last else f"t{i % 2}"
        if not last:
            lay = feature_layout(profile, DType.F16, g.out_h, g.out_w, c)
            scratch_sizes[dst] = max(scratch_sizes.get(dst, 0), lay.nbytes)
        groups.append(_pool_tasks(g, method, profile, src, dst, f"g{method}{i}_"))
        src, h, w = dst, g.out_h, g.out_w
    out = feature_layout(profile, DType.F16, 1, 1, c)
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", out.nbytes, layout=out, bind=0)]
    bufs += [BufferSpec(n, "scratch", s) for n, s in sorted(scratch_sizes.items())]
    return npu_program(bufs, groups, profile, ("x",), ("out",))


# ---------------------------------------------------------------------------------------------
# the row max of a matrix cube: a one-axis max pool over a view of its surfaces
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def max_axis_plan(n: int) -> tuple[tuple[int, int], ...]:
    """(kernel, bottom pad) per pass of a max over ``n`` lines down to one, stride = kernel.

    Max is exact under any grouping and the -inf pad never wins (ppu-pooling.md), so a pass
    need not divide its extent: it pads the bottom by up to PAD_MAX. Every intermediate keeps
    >= 4 lines (ppu-reduce-mean.md, sub-4 rule). Fewest passes first, then fewest padded
    passes, then the largest first kernel (the first pass's write is the biggest)."""
    if n < 1:
        raise LoweringError(f"a max over {n} lines")
    if n <= KERNEL_MAX:
        return ((n, 0),)
    best, best_key = None, None
    for k in range(KERNEL_MAX, 1, -1):
        out = -(-n // k)
        pad = out * k - n
        if pad > PAD_MAX or out < 4:
            continue
        plan = ((k, pad),) + max_axis_plan(out)
        key = (len(plan), sum(1 for _, p in plan if p))
        if best_key is None or key < best_key:
            best, best_key = plan, key
    assert best is not None    # k = 4 always fits (pad <= 3, out >= 5 for n > 16)
    return best


def build_row_max(layout: CubeLayout, rows: int, channels: int, batch: int = 1,
                  item_stride: int = 0, profile: ChipProfile | str | None = None,
                  name: str = "rowmax") -> OpLowering:
    """Per row, the max over each lane of the whole 8-channel groups of a matrix cube.

    ``layout``: an fp16 cube with the matrix rows as its positions (W = 1, lines 16 B apart);
    ``batch`` such cubes ``item_stride`` bytes apart (attention's heads). Element (row p,
    channel c) sits at byte (c // 8) * surf_stride + 16 p + 2 (c % 8), so the surfaces are
    also a cube of H' = channels // 8 lines (``surf_stride`` apart), W' = rows positions and
    8 channels; the heads are its 8-channel surfaces (``item_stride`` apart). A max pool with
    kernel (k, 1), telescoped over H' (max_axis_plan), leaves out[b, p, l] =
    max_g x[b, p, 8 g + l] over the whole groups g: a row-major fp16 [batch, rows, 8]
    (``out``). A last partial group (channels % 8) is not read: its padding lanes hold
    whatever the producer left there; the caller reduces its real lanes and the 8 lanes on
    the host. Bit-exact: a max selects one input value.

    NaN: the PPU's max compares, and the simulator's (ppu.c) never selects a NaN; the notes
    do not measure NaN on silicon. The heads (or one cube's rows) are split into one
    independent job per core. Buffers: ``x`` (input 0), ``out`` (output 0), ``t{job}_0`` /
    ``t{job}_1`` (a job's intermediates when more than one pass), ``regcmd``."""
    profile = resolve_profile(profile)
    c2 = profile.input(DType.F16).feature_c2
    atom = profile.atom_bytes
    if layout.dtype != np.float16 or layout.c2 != c2:
        raise LoweringError(f"row max on the PPU: expects an fp16 cube (C2={c2}), got "
                            f"{layout.dtype} with C2={layout.c2}")
    if layout.width != 1 or layout.line_stride != atom or rows > layout.height:
        raise LoweringError(f"row max on the PPU: the rows must be the cube's positions (W = 1, "
                            f"lines {atom} B apart); got W={layout.width}, line stride "
                            f"{layout.line_stride} B, {rows} rows of {layout.height}")
    n = min(channels, layout.channels) // c2
    if n < 2:
        raise LoweringError(f"row max on the PPU: {channels} channels hold {n} whole "
                            f"{c2}-channel group(s); nothing to pool across")
    plan = max_axis_plan(n)
    if len(plan) > 1 and rows < 4:
        raise LoweringError(f"row max on the PPU: {rows} rows; an intermediate {rows} wide is "
                            f"mis-read by the next pass (ppu-reduce-mean.md, sub-4 rule)")
    span = (n - 1) * layout.surf_stride + rows * atom
    if batch > 1 and item_stride < span:
        raise LoweringError(f"row max on the PPU: cubes {item_stride} B apart overlap the "
                            f"{span}-byte view of one; the heads cannot be its surfaces")
    per_task = profile.cube_dim_limit // c2        # heads per task (CUBE_IN_CHANNEL)
    jobs: list[JobTasks] = []
    scratch: dict[str, int] = {}
    for j, (b0, nb, p0, np_) in enumerate(_row_max_pieces(batch, rows, profile.cores)):
        passes: list[list[EmittedTask]] = []
        src, off, line, surf, h = "x", b0 * item_stride + p0 * atom, layout.surf_stride, \
            item_stride, n
        for i, (k, pad) in enumerate(plan):
            g = PoolGeom(h, np_, c2 * nb, k, 1, k, 1, pad_b=pad)
            last = i == len(plan) - 1
            if last:   # straight into out[b, p, :]: heads rows * 16 B apart
                dst, doff, d_surf = "out", (b0 * rows + p0) * atom, rows * atom
            else:      # this job's own dense intermediate
                dst, doff, d_surf = f"t{j}_{i % 2}", 0, g.out_h * np_ * atom
                scratch[dst] = max(scratch.get(dst, 0), d_surf * nb)
            tasks = []
            for t0 in range(0, nb, per_task):
                nt = min(per_task, nb - t0)
                tasks.append(emit_pool(g, "max", profile, Reloc(src, off + t0 * surf),
                                       Reloc(dst, doff + t0 * d_surf), channels=nt * c2,
                                       src_surf_stride=surf if nt > 1 else None,
                                       dst_surf_stride=d_surf, src_line_stride=line,
                                       name=f"{name}{j}_{i}_{len(tasks)}"))
            passes.append(tasks)
            src, off, line, surf, h = dst, 0, np_ * atom, d_surf, g.out_h
        mids = sorted({f"t{j}_{i % 2}" for i in range(len(plan) - 1)})
        jobs.append(JobTasks(passes, ("x", *mids), (*mids, "out")))
    bufs = [BufferSpec("x", "input", (batch - 1) * item_stride + layout.nbytes, layout=layout,
                       bind=0),
            BufferSpec("out", "output", batch * rows * atom, dtype="f16",
                       shape=(batch, rows, c2), bind=0)]
    bufs += [BufferSpec(nm, "scratch", sz) for nm, sz in sorted(scratch.items())]
    layout_jobs, end = assemble_jobs(profile, jobs)
    bufs.append(BufferSpec("regcmd", "regcmd", round_up(end, profile.regcmd_align_bytes)))
    return OpLowering(tuple(bufs), (NpuStep(tuple(layout_jobs)),))


def _row_max_pieces(batch: int, rows: int, cores: int) -> list[tuple[int, int, int, int]]:
    """(first head, heads, first row, rows) of each independent job: the heads split over the
    cores, or one cube's rows (each piece >= 4 rows: the sub-4 rule), so every core's DMA
    streams a share of the operand."""
    def split(n: int, parts: int) -> list[tuple[int, int]]:      # balanced (start, count)
        q, r = divmod(n, parts)
        starts = [i * q + min(i, r) for i in range(parts + 1)]
        return [(a, b - a) for a, b in zip(starts, starts[1:])]

    if batch > 1:
        return [(b, nb, 0, rows) for b, nb in split(batch, min(cores, batch))]
    return [(0, 1, p, n) for p, n in split(rows, max(1, min(cores, rows // 4)))]
