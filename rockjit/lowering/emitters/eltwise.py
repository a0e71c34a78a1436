"""Element-wise add / sub / mul / max / min of fp16 feature cubes, and the shared DPU task parts.

Element-wise ops preserve the cube (notes: encodings/cross-op-chaining.md, "Element-wise ops
preserve the cube"): lanes never interact, so an emitter may read a dense cube's bytes as any
other cube shape. Every emitter here therefore works on the *flat view* of a dense fp16 cube:
its ``nbytes`` as consecutive 16-byte atoms of 8 fp16 lanes, cut into task-sized chunks.

Datapaths (the forms the notes validate):

* two full cubes -> the DPU-only two-operand EW (flying.emit_flying_ew): MRDMA streams ``a``,
  ERDMA ``b``, the EW stage combines them in fp32 and the output rounds once (notes:
  encodings/sdp-stage-precision.md "A two-buffer EW op needs no conv main feed", the
  hardware-exact program; the older "ERDMA reads 0" finding of dpu-lut-activation.md is
  superseded there). No CNA/CORE runs, so the pass costs no MACs; its tasks cover at most
  FLYING_MAX_POSITIONS atoms of the flat view each. The hardware has no subtract: ``a - b``
  streams ``b`` through the BS stage's MUL by -1 (an exact fp32 sign flip) and the EW stage
  adds ``a`` -- the arithmetic of the identity-conv form this replaces (main feed -b, operand
  a, one fp32 add, one rounding), so every output bit is the same.
* a scalar constant -> a flying DPU pass (no conv): DPU_RDMA streams the cube (conformance 05's
  framing) and the BS stage applies the register operand: BS ALU (sum / max / min, fp32
  operand) or BS MUL (fp16 operand); ``c - x`` uses BN (MUL -1, then ALU + c).
* a per-channel vector (compile-time constant) -> the vector is broadcast over every position
  into a constant cube at compile time and combined as a full cube (the notes' bias cube,
  encodings/cross-op-chaining.md "an on-cube bias epilogue ... builds a bias cube once").
  Costs positions x channels x 2 bytes of resident memory.
* a per-row (per-position) vector known only at run time -> eltwise_row.py: a 1x1 conv
  broadcasts s[p] (feature = the row-vector cube, weights = ones in input channel 0) and its
  EW stage combines x in the same task where one task covers every position; else the
  broadcast is written as a full operand cube and combined in a second kick.

Padding: the flat views cover the cube's own bytes (whole atoms). Lanes never mix, so padding
lanes only ever produce padding output: a zero pad lane stays 0 under add/sub/mul/max/min of
two zero pads; under a scalar op it holds ``op(0, c)``; with a per-channel vector it holds
``op(0, 0)``.

Jobs: with ``parts`` > 1 a flat view is cut at ``part_bounds`` (whole aligned EW rows), every
pass's chunking cuts there too, and each range becomes one job holding all passes over it
(jobs.split_by_range), so placement can run the ranges on the cores that hold their inputs
(attention's heads: where the QK^T job of that head ran). A per-row op's one-pass form
(eltwise_row._one_pass) cuts its kernels at the same planes, so a norm's passes over one cube
keep each range on one core.

Sources: [conf] /work/shared/conformance 05 / 06 programs; [lut] [ew] [k-acc] [mrdma] [chain]
notes encodings/dpu-lut-activation.md, k-accumulation.md, mrdma-trap.md, regcmd-task-model.md;
[mesa] Mesa rkt_regcmd.c (conv framing, via emitters/matmul.py).
"""
from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout
from ..op_lowering import BufferSpec, NpuStep, OpLowering
from ..profile import ChipProfile, get_profile
from ..regcmd import LoweringError, Reloc, EmittedTask
from ..compile_cache import memo, memoized
from ..tiling import CbufSplit, ceil_div, round_up
# the DPU stage records live in dpu_stages.py; LUT builders import them from here too
from .dpu_stages import LutTables, OutCvt, SdpStage, ew_stage  # noqa: F401
from .flying import FLYING_MAX_POSITIONS, emit_flying, emit_flying_ew
from .jobs import JobTasks, assemble_jobs, split_by_range
from .task import ConvTaskGeom, DpuStages, conv_task

# ---------------------------------------------------------------------------------------------
# limits and small helpers
# ---------------------------------------------------------------------------------------------

# The EW operand transport's surface stride has a floor of 12 positions; below it the upper
# surfaces mis-stride (notes: k-accumulation.md "MAX(out_w*out_h, 12)", "test with M>=12").
EW_VIEW_CHANNELS = 32        # the flat-view conv: K = N = one fp16 weight K-group


def fp16_bits(x: float) -> int:
    return int(np.array(x, np.float16).view(np.uint16))


def fp32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(np.float32(x))))[0]


def resolve_profile(profile: ChipProfile | str | None) -> ChipProfile:
    p = get_profile(profile or "rk3588") if not isinstance(profile, ChipProfile) else profile
    if p.encoding != "rk3588":
        raise LoweringError(f"the DPU/PPU emitters write the RK3588 register encoding; chip "
                            f"{p.name!r} uses {p.encoding!r}")
    return p


def check_fp16_cube(layout: CubeLayout, profile: ChipProfile, what: str) -> None:
    """Element-wise emitters take the canonical dense fp16 feature cube (layouts.py)."""
    c2 = profile.input(DType.F16).feature_c2
    if layout.dtype != np.float16 or layout.c2 != c2:
        raise LoweringError(f"{what}: expects an fp16 feature cube (C2={c2}); got {layout.dtype} "
                            f"with C2={layout.c2}. Cast to fp16 before this op")
    dense = CubeLayout(layout.height, layout.width, layout.channels, layout.c2, layout.dtype)
    if (layout.line_stride, layout.surf_stride) != (dense.line_stride, dense.surf_stride):
        raise LoweringError(f"{what}: the cube has line/surface strides {layout.line_stride}/"
                            f"{layout.surf_stride} B but element-wise emitters need the dense "
                            f"layout ({dense.line_stride}/{dense.surf_stride} B): repack it")


def npu_program(buffers: list[BufferSpec], groups: Sequence[Sequence[EmittedTask]],
                profile: ChipProfile, reads: Sequence[str], writes: Sequence[str],
                macs: int = 0, bounds: Sequence[int] = ()) -> OpLowering:
    """One NPU step: the task groups (passes) run in order, each pass its own kick(s) of
    self-chained tasks (fp16 chains, notes: encodings/regcmd-task-model.md). ``bounds``
    (part_bounds) cut a flat run into byte ranges, each range one job holding every pass over
    it (jobs.split_by_range), which placement may spread over the cores; none: one job."""
    tasks = [JobTasks([list(g) for g in groups], tuple(reads), tuple(writes))] if not bounds \
        else split_by_range(groups, bounds, tuple(reads), tuple(writes))
    jobs, end = assemble_jobs(profile, tasks)
    bufs = list(buffers) + [BufferSpec("regcmd", "regcmd", round_up(end, profile.regcmd_align_bytes))]
    return OpLowering(tuple(bufs), (NpuStep(tuple(jobs)),), macs=macs)


def part_bounds(nbytes: int, profile: ChipProfile, parts: int) -> tuple[int, ...]:
    """The interior byte boundaries cutting a flat run of ``nbytes`` into at most ``parts``
    near-equal ranges (attention's heads: one range per head when the heads tile the run).
    A boundary sits on a whole number of aligned 64-byte rows (32 fp16 lanes: the flat view
    of the one-pass per-row forms' kernel groups, eltwise_row._kernel_parts) and every range
    holds at least the EW stride floor's rows; the flying chunks (flying_chunks) cut there."""
    if parts <= 1:
        return ()
    per_row = profile.atom_bytes * EW_VIEW_CHANNELS // profile.input(DType.F16).feature_c2
    grain = per_row * profile.row_align
    least = round_up(max(profile.ew_min_positions, profile.min_feature_rows),
                     profile.row_align) * per_row
    out: list[int] = []
    for j in range(1, parts):
        b = j * nbytes // parts // grain * grain
        if b - (out[-1] if out else 0) >= least and nbytes - b >= least:
            out.append(b)
    return tuple(out)


def _segments(n: int, bounds: Sequence[int], unit: int) -> list[tuple[int, int]]:
    """(start, end) in ``unit``s of the pieces of [0, n) cut at ``bounds`` (bytes)."""
    cuts = [0, *(b // unit for b in bounds if 0 < b // unit < n), n]
    return list(zip(cuts, cuts[1:]))


# ---------------------------------------------------------------------------------------------
# the identity / broadcast conv task
# ---------------------------------------------------------------------------------------------

def emit_conv_dpu(name: str, profile: ChipProfile, *, feature: Reloc, rows: int,
                  feature_surf_pitch: int, weights: Reloc, kernels: int, out: Reloc,
                  out_channels: int, out_surf_stride: int,
                  ew: tuple | None = None, real_channels: int | None = None,
                  width: int = 1) -> EmittedTask:
    """A 1x1 fp16 convolution over ``rows`` positions (W = 1) and 32 input channels, written
    through the DPU; optionally combined with an ERDMA operand cube by the EW unit.

    ``feature_surf_pitch``: bytes between the feature's 8-channel surfaces (>= rows * 16);
    ``kernels``: the weight block's kernel count (a multiple of 16) of which the first
    ``out_channels`` are written, ``out_surf_stride`` bytes between output surfaces.
    ``ew`` = (op, operand[, element bytes]): the operand is a cube of exactly the output
    geometry, dense (surfaces rows*16 apart), fp16 or (4 bytes) fp32 like a K partial
    [k-acc]. ``real_channels`` (default 32) goes to CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL:
    channels past it are not real input (Mesa programs the real channel count there; the
    simulator reads them as 0, an inference).
    ``width`` > 1 reads the ``rows * width`` positions as ``rows`` lines of ``width`` (the
    same bytes: a 1x1 conv does not care how positions fold into lines), so one task covers
    more positions than a conv task reads rows, and an ERDMA operand whose surfaces are that
    many positions apart lines up with it.
    The CNA/CORE framing is the matmul emitter's (conformance 01/06, Mesa), with the feature
    strides generalised by the same formula the simulator decodes (pitch = 16*(SURF+LINE)).
    A pure function of its arguments: emitted once per geometry in a compile (compile_cache.py).
    """
    key = ("emit_conv_dpu", name, profile, feature, rows, feature_surf_pitch, weights, kernels,
           out, out_channels, out_surf_stride, ew, real_channels, width)
    return memo(key, lambda: _emit_conv_dpu(name, profile, feature, rows, feature_surf_pitch,
                                            weights, kernels, out, out_channels,
                                            out_surf_stride, ew, real_channels, width))


def _emit_conv_dpu(name: str, profile: ChipProfile, feature: Reloc, rows: int,
                   feature_surf_pitch: int, weights: Reloc, kernels: int, out: Reloc,
                   out_channels: int, out_surf_stride: int, ew: tuple | None,
                   real_channels: int | None, width: int = 1) -> EmittedTask:
    p = profile.input(DType.F16)
    k = EW_VIEW_CHANNELS
    positions = rows * width
    if rows < max(profile.min_feature_rows, 1) or rows > profile.max_feature_rows or width < 1:
        raise LoweringError(f"{name}: {rows} rows of {width}; a conv task reads "
                            f"{profile.min_feature_rows}..{profile.max_feature_rows} rows")
    if ew is not None and positions < profile.ew_min_positions:
        raise LoweringError(f"{name}: an EW operand cube of {positions} positions is under the "
                            f"{profile.ew_min_positions}-position stride floor (k-accumulation.md)")
    if feature_surf_pitch < positions * 16 or feature_surf_pitch % 16:
        raise LoweringError(f"{name}: feature surface pitch {feature_surf_pitch} B cannot hold "
                            f"{positions} atoms")
    if kernels % p.n_align or out_channels > kernels:
        raise LoweringError(f"{name}: {kernels} kernels (multiple of {p.n_align}) for "
                            f"{out_channels} output channels")
    out_fmt = profile.output(DType.F16, DType.F16)
    w_bytes = kernels * k * p.esize
    data_entries = ceil_div(k * p.esize, profile.cbuf_entry_bytes)
    data_banks = ceil_div(positions * data_entries * profile.cbuf_entry_bytes,
                          profile.cbuf_bank_bytes)
    if data_banks + ceil_div(w_bytes, profile.cbuf_bank_bytes) > profile.cbuf_banks:
        raise LoweringError(f"{name}: {positions} positions x {kernels} kernels do not fit the "
                            f"CBUF")
    # The DPU cube keeps the CORE's kernel count (the simulator refuses a DPU cube narrower
    # than the accumulator); only ``out_channels`` of them must land, so a caller that wants
    # fewer owns the extra lanes/surfaces (see _bcast_tasks). SURF_ADD counts this task's own
    # positions x the fp16 surf_mult (conformance 01/06), whatever the destination stride.
    # Feature pitches: line 16 * width B, surface ``feature_surf_pitch`` (Mesa
    # rkt_task.c; conformance 01/04/06: 4/4, 48/72, 4/12).
    g = ConvTaskGeom(DType.F16, DType.F16, False, rows, width, k, 16 * width, feature_surf_pitch,
                     1, 1, kernels, 1, 1, 1, 1, 0, 0, rows, width, out_surf_stride,
                     real_c=real_channels or k,
                     cbuf=CbufSplit(data_entries, data_banks, profile.cbuf_banks - data_banks),
                     surf_add=positions * out_fmt.surf_mult)
    where = {"feature": feature, "weight": weights, "out": out}
    stages = DpuStages()
    if ew is not None:
        stages = DpuStages(ew=ew_stage(ew[0], ew[2] if len(ew) > 2 else 2))
        where["ew"] = ew[1]
    return conv_task(g, profile, where, stages=stages, name=name)


# ---------------------------------------------------------------------------------------------
# the flat views
# ---------------------------------------------------------------------------------------------

def flying_chunks(nbytes: int, profile: ChipProfile,
                  bounds: Sequence[int] = ()) -> list[tuple[int, int]]:
    """(byte offset, positions) of the flying tasks covering ``nbytes`` (whole atoms), none
    crossing a boundary of ``bounds`` (part_bounds)."""
    atoms = ceil_div(nbytes, profile.atom_bytes)
    out = []
    for lo, hi in _segments(atoms, bounds, profile.atom_bytes):
        pos = lo
        while pos < hi:
            n = min(FLYING_MAX_POSITIONS, hi - pos)
            out.append((pos * profile.atom_bytes, n))
            pos += n
    return out


BINARY_OPS = ("add", "sub", "mul", "max", "min")


def _check_op(op: str) -> None:
    if op not in BINARY_OPS:
        raise LoweringError(f"element-wise op {op!r} is not one of {', '.join(BINARY_OPS)}")


def full_ew_tasks(op: str, a: str, b: str, out: str, nbytes: int, profile: ChipProfile,
                  prefix: str = "ew", bounds: tuple[int, ...] = ()
                  ) -> tuple[list[EmittedTask], int]:
    """Tasks computing out = a OP b over the flat view of ``nbytes`` (none crossing
    ``bounds``); returns (tasks, the span they touch: ``nbytes`` in whole atoms). Each is a
    DPU-only two-operand EW task (flying.emit_flying_ew): no CNA/CORE, no MACs. Emitted once
    per geometry in a compile (compile_cache.py); each caller gets its own list."""
    tasks, span = memo(("full_ew_tasks", op, a, b, out, nbytes, profile, prefix, bounds),
                       lambda: _full_ew_tasks(op, a, b, out, nbytes, profile, prefix, bounds))
    return list(tasks), span


# a - b on the flying EW: the BS stage multiplies the main stream b by -1 (an exact fp32 sign
# flip; the float BS MUL alone, as a scalar mul runs it) and the EW stage adds a -- the
# identity-conv form's arithmetic (main feed -b, operand a, one fp32 add, one rounding)
_NEGATE = SdpStage(mul=fp16_bits(-1.0))


def _full_ew_tasks(op: str, a: str, b: str, out: str, nbytes: int, profile: ChipProfile,
                   prefix: str, bounds: tuple[int, ...]) -> tuple[tuple[EmittedTask, ...], int]:
    _check_op(op)
    main, opnd, ew_op, bs = (b, a, "add", _NEGATE) if op == "sub" else (a, b, op, None)
    tasks = tuple(emit_flying_ew(f"{prefix}{i}", profile, ew_op, Reloc(main, off),
                                 Reloc(opnd, off), Reloc(out, off), n, bs=bs)
                  for i, (off, n) in enumerate(flying_chunks(nbytes, profile, bounds)))
    return tasks, ceil_div(nbytes, profile.atom_bytes) * profile.atom_bytes


# ---------------------------------------------------------------------------------------------
# lower_* entry points
# ---------------------------------------------------------------------------------------------

@memoized
def build_binary(op: str, layout: CubeLayout, profile: ChipProfile | str | None = None,
                 parts: int = 1) -> OpLowering:
    """out = a OP b for two fp16 cubes of the same dense ``layout``; ``parts`` > 1 offers
    that many jobs over byte ranges (part_bounds, npu_program).

    Buffers: ``a`` (input 0), ``b`` (input 1), ``out`` (output 0), ``regcmd``; one
    DPU-only two-operand EW task per <= FLYING_MAX_POSITIONS atoms, no MACs."""
    profile = resolve_profile(profile)
    _check_op(op)
    check_fp16_cube(layout, profile, f"element-wise {op}")
    bounds = part_bounds(layout.nbytes, profile, parts)
    tasks, span = full_ew_tasks(op, "a", "b", "out", layout.nbytes, profile, bounds=bounds)
    bufs = [BufferSpec("a", "input", span, layout=layout, bind=0),
            BufferSpec("b", "input", span, layout=layout, bind=1),
            BufferSpec("out", "output", span, layout=layout, bind=0)]
    return npu_program(bufs, [tasks], profile, ("a", "b"), ("out",), bounds=bounds)


# the largest shift whose 2^-shift is a normal fp16 register operand (fp16's least normal is
# 2^-14; a subnormal MUL operand is nowhere documented)
SQUARE_MAX_SHIFT = 14


@memoized
def build_scaled_square(layout: CubeLayout, shift: int, profile: ChipProfile | str | None = None,
                        parts: int = 1) -> OpLowering:
    """out = (x 2^-shift)^2 in one DPU-only two-operand pass, where ``x * 2^-shift`` and its
    square are otherwise two passes (a LayerNorm's first statistics pass,
    range_rewrites._pass1): MRDMA streams x through the BS and BN MULs by 2^-shift each, ERDMA
    streams x again, the EW stage multiplies. Exact up to the one output rounding: fp32 holds
    x 4^-shift exactly (a power of two, far inside fp32's exponents) and the product of two
    11-bit significands exactly, so the result is fp16((x 2^-shift)^2) -- the two-pass form's
    value wherever x 2^-shift is a normal fp16, and nearer where the two-pass form rounded a
    subnormal x 2^-shift first. The factor is split over BS and BN because 4^-shift is no
    normal fp16 past shift 7. Buffers and jobs as build_binary (``a`` and ``b`` both x)."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, "scaled square")
    if not 1 <= shift <= SQUARE_MAX_SHIFT:
        raise LoweringError(f"scaled square: 2^-{shift} is not a normal fp16 register operand "
                            f"(shift 1..{SQUARE_MAX_SHIFT})")
    half = SdpStage(mul=fp16_bits(2.0 ** -shift))
    bounds = part_bounds(layout.nbytes, profile, parts)
    tasks = [emit_flying_ew(f"sqs{i}", profile, "mul", Reloc("a", off), Reloc("b", off),
                            Reloc("out", off), n, bs=half, bn=half)
             for i, (off, n) in enumerate(flying_chunks(layout.nbytes, profile, bounds))]
    span = ceil_div(layout.nbytes, profile.atom_bytes) * profile.atom_bytes
    bufs = [BufferSpec("a", "input", span, layout=layout, bind=0),
            BufferSpec("b", "input", span, layout=layout, bind=1),
            BufferSpec("out", "output", span, layout=layout, bind=0)]
    return npu_program(bufs, [tasks], profile, ("a", "b"), ("out",), bounds=bounds)


def scalar_stages(op: str, value: float, reverse: bool) -> tuple[SdpStage | None, SdpStage | None]:
    """BS/BN register operands for ``x OP c`` (``c OP x`` when ``reverse``). The constant is
    the fp16 value of ``value`` (the tensor's dtype), held exactly as the fp32 ALU operand."""
    _check_op(op)
    with np.errstate(over="ignore"):
        c = float(np.float16(value))
    if not np.isfinite(c):
        raise LoweringError(f"scalar operand {value!r} is not a finite fp16 value")
    if op == "sub":
        if reverse:
            # c - x = (-1)*x + c: BN multiplies then adds (dpu-lut-activation.md, "MUL then ALU")
            return None, SdpStage(alu=(2, fp32_bits(c)), mul=fp16_bits(-1.0))
        return SdpStage(alu=(2, fp32_bits(-c))), None
    if op == "mul":
        return SdpStage(mul=fp16_bits(c)), None
    algo = {"add": 2, "max": 0, "min": 1}[op]
    return SdpStage(alu=(algo, fp32_bits(c))), None


@memoized
def build_binary_scalar(op: str, layout: CubeLayout, value: float, reverse: bool = False,
                        profile: ChipProfile | str | None = None, parts: int = 1) -> OpLowering:
    """out = x OP c (or c OP x with ``reverse``) for a constant ``c`` (rounded to fp16);
    ``parts`` as in build_binary.

    One flying DPU pass per <= 4096 atoms; the BS (or, for c - x, BN) stage applies the
    register operand. Buffers: ``x`` (input 0), ``out`` (output 0), ``regcmd``; no padding."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a scalar")
    bs, bn = scalar_stages(op, value, reverse)
    bounds = part_bounds(layout.nbytes, profile, parts)
    tasks = [emit_flying(f"{op}_c{i}", profile, Reloc("x", off), Reloc("out", off), n, bs=bs, bn=bn)
             for i, (off, n) in enumerate(flying_chunks(layout.nbytes, profile, bounds))]
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0)]
    return npu_program(bufs, [tasks], profile, ("x",), ("out",), bounds=bounds)


def broadcast_channel_cube(layout: CubeLayout, vector: np.ndarray) -> np.ndarray:
    """The packed cube holding ``vector[c]`` at every position (padding lanes 0)."""
    v = np.asarray(vector)
    if v.shape != (layout.channels,):
        raise LoweringError(f"per-channel operand must have shape ({layout.channels},), got "
                            f"{v.shape}")
    full = np.broadcast_to(v.astype(np.float16), (layout.height, layout.width, layout.channels))
    return layout.pack(np.ascontiguousarray(full))


def build_binary_channel(op: str, layout: CubeLayout, vector: np.ndarray, reverse: bool = False,
                         profile: ChipProfile | str | None = None, parts: int = 1) -> OpLowering:
    """out[h, w, c] = x[h, w, c] OP v[c] (v OP x with ``reverse``) for a compile-time vector;
    ``parts`` as in build_binary.

    The vector is broadcast into a constant cube (``bcast``, resident) and combined as a full
    cube. Buffers: ``x`` (input 0), ``out`` (output 0), ``bcast`` and ``weights`` (const),
    ``regcmd``; x/out are padded as in build_binary."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a per-channel vector")
    a, b = ("bcast", "x") if reverse else ("x", "bcast")
    bounds = part_bounds(layout.nbytes, profile, parts)
    tasks, span = full_ew_tasks(op, a, b, "out", layout.nbytes, profile, bounds=bounds)
    data = np.zeros(span, np.uint8)
    data[:layout.nbytes] = broadcast_channel_cube(layout, vector)
    bufs = [BufferSpec("x", "input", span, layout=layout, bind=0),
            BufferSpec("out", "output", span, layout=layout, bind=0),
            BufferSpec("bcast", "const", span, layout=layout, data=data)]
    return npu_program(bufs, [tasks], profile, ("x", "bcast"), ("out",), bounds=bounds)
