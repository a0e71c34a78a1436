"""Element-wise add / sub / mul / max / min of fp16 feature cubes, and the shared DPU task parts.

Element-wise ops preserve the cube (notes: encodings/cross-op-chaining.md, "Element-wise ops
preserve the cube"): lanes never interact, so an emitter may read a dense cube's bytes as any
other cube shape. Every emitter here therefore works on the *flat view* of a dense fp16 cube:
its ``nbytes`` as consecutive 16-byte atoms of 8 fp16 lanes, cut into task-sized chunks.

Datapaths (the forms the notes validate):

* two full cubes -> an identity 1x1 convolution feeds ``a`` to the DPU as its main input and the
  DPU EW unit combines it with ``b`` read through DPU_RDMA/ERDMA (conformance 06; notes:
  encodings/dpu-lut-activation.md "Two-operand EW", "Max / Min"; encodings/k-accumulation.md
  for the operand transport). A flying DPU cannot take a second operand (the ERDMA reads 0,
  same page), so the conv is load-bearing. Each chunk of P positions is viewed as a
  P x 32-channel cube (4 surfaces of P atoms) so the 32x32 identity weight is the whole weight.
  The hardware has no subtract: ``a - b`` runs the ADD datapath with the conv weights -I, so
  the main feed is ``-b`` (an exact fp16 sign flip, the notes' "a-b == a+(-b)") and the ERDMA
  operand is ``a``.
* a scalar constant -> a flying DPU pass (no conv): DPU_RDMA streams the cube (conformance 05's
  framing) and the BS stage applies the register operand: BS ALU (sum / max / min, fp32
  operand) or BS MUL (fp16 operand); ``c - x`` uses BN (MUL -1, then ALU + c).
* a per-channel vector (compile-time constant) -> the vector is broadcast over every position
  into a constant cube at compile time and combined as a full cube (the notes' bias cube,
  encodings/cross-op-chaining.md "an on-cube bias epilogue ... builds a bias cube once").
  Costs positions x channels x 2 bytes of resident memory.
* a per-row (per-position) vector known only at run time -> a broadcast 1x1 conv writes the
  full operand cube S[p, c] = s[p] (feature = the row-vector cube, weights = ones in input
  channel 0), then the full-cube form combines x with S, in a second kick of the same job.

Padding: the flat views cover whole chunks, so the buffers of the two-operand forms are padded
past ``layout.nbytes`` (``BufferSpec.nbytes`` says by how much; the pipeline allocates that
span). Lanes never mix, so padding lanes and pad bytes only ever produce padding output: a
zero pad lane stays 0 under add/sub/mul/max/min of two zero pads; under a scalar op it holds
``op(0, c)``; with a per-channel vector it holds ``op(0, 0)``.

Sources: [conf] /work/shared/conformance 05 / 06 programs; [lut] [ew] [k-acc] [mrdma] [chain]
notes encodings/dpu-lut-activation.md, k-accumulation.md, mrdma-trap.md, regcmd-task-model.md;
[mesa] Mesa rkt_regcmd.c (conv framing, via emitters/matmul.py).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, feature_layout, weight_layout
from ..opprogram import BufferSpec, NpuJob, NpuStep, OpProgram
from ..profile import ChipProfile, get_profile
from ..regcmd import Kick, LoweringError, Reloc, Task, TaskProgram, link
from ..tiling import ceil_div, round_up

# DMA burst length code 15 on every DPU / DPU_RDMA / CNA read and write: the value of every
# conformance program (01-09) and of Mesa's emitter.
BURST_LEN = 15
# DPU_FEATURE_MODE_CFG.OUTPUT_MODE 2 (write the result to memory): every conformance program
# with a DPU (01-06, 09); no source documents the other codes.
OUTPUT_TO_MEMORY = 2

# ---------------------------------------------------------------------------------------------
# limits and small helpers
# ---------------------------------------------------------------------------------------------

# Flying DPU tasks stay at 4096 columns, well under the 13-bit maximum that corrupts a tail of
# the cube (notes: dpu-lut-activation.md QUIRK 3, "Tiling well under the ceiling at
# DPU_LUT_MAXN = 32768 (cols = 4096) is bit-clean").
FLYING_MAX_POSITIONS = 4096

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


def chain_kicks(groups: Sequence[Sequence[TaskProgram]], profile: ChipProfile,
                regcmd: str = "regcmd") -> tuple[list[Kick], int]:
    """Link each group of tasks into self-chained kicks (as few as PC_TASK_CON.TASK_NUMBER
    allows), all laid out in one regcmd buffer. A group boundary is always a kick boundary, so
    a pass that reads what the previous pass wrote starts after that pass has retired.
    Returns the kicks and the regcmd bytes they span."""
    from .. import registers as R
    cap = (1 << R.register("PC_TASK_CON").field("TASK_NUMBER").width) - 1
    kicks, off = [], 0
    for tasks in groups:
        for i in range(0, len(tasks), cap):
            k = link(tasks[i:i + cap], profile, regcmd, base_offset=off)
            kicks.append(k)
            off += round_up(k.nbytes, profile.regcmd_align_bytes)
    return kicks, off


def npu_program(buffers: list[BufferSpec], groups: Sequence[Sequence[TaskProgram]],
                profile: ChipProfile, reads: Sequence[str], writes: Sequence[str],
                macs: int = 0) -> OpProgram:
    """One NPU step of one job: the task groups (passes) run in order, each pass its own
    kick(s) of self-chained tasks (fp16 chains, notes: encodings/regcmd-task-model.md)."""
    kicks, nbytes = chain_kicks(groups, profile)
    bufs = list(buffers) + [BufferSpec("regcmd", "regcmd", nbytes)]
    job = NpuJob(tuple(kicks), tuple(reads), tuple(writes))
    return OpProgram(tuple(bufs), (NpuStep((job,)),), macs=macs)


# ---------------------------------------------------------------------------------------------
# the DPU block
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SdpStage:
    """Register operands of the BS or BN stage (float path). ``alu`` = (algo, fp32 operand
    bits), algo 0 max / 1 min / 2 sum [ew "Max / Min"]; ``mul`` = fp16 operand bits."""

    alu: tuple[int, int] | None = None
    mul: int | None = None


@dataclass(frozen=True)
class OutCvt:
    """DPU OUT_CVT. Identity for plain results; the affine float form
    out = (v + offset) * 2^-minus_exp * scale (CVT_TYPE 1) after a LUT [lut "Signed / wide
    output -- the affine OUT_CVT"]."""

    offset: int = 0
    scale: int = 1
    minus_exp: int = 0
    affine: bool = False


@dataclass(frozen=True)
class LutProgram:
    """LUT tables and geometry (built by lut_tables.py)."""

    le: tuple[int, ...]
    lo: tuple[int, ...]
    le_start: int
    le_end: int
    lo_start: int
    lo_end: int
    le_select: int
    lo_select: int
    cfg: Mapping[str, int] = field(default_factory=lambda: {
        # the LE/LO hybrid: HYBRID_PRIORITY | OFLOW_PRIORITY | LO_LE_MUX=2 = 0x68 [lut][conf 05]
        "LUT_HYBRID_PRIORITY": 1, "LUT_OFLOW_PRIORITY": 1, "LUT_LO_LE_MUX": 2})
    # out-of-table slopes: 0 = the end entry is held (documented clamp)
    le_slope: tuple[int, int, int, int] = (0, 0, 0, 0)   # uflow scale, oflow scale, shifts
    lo_slope: tuple[int, int, int, int] = (0, 0, 0, 0)


def _write_stage(t: Task, name: str, st: SdpStage | None) -> None:
    if st is None:
        t.write(f"DPU_{name}_CFG", **{f"{name}_BYPASS": 1, f"{name}_ALU_BYPASS": 1,
                                      f"{name}_MUL_BYPASS": 1, f"{name}_RELU_BYPASS": 1})
        t.write(f"DPU_{name}_ALU_CFG")
        t.write(f"DPU_{name}_MUL_CFG")
        return
    cfg = {f"{name}_RELU_BYPASS": 1}
    if st.alu is None:
        cfg[f"{name}_ALU_BYPASS"] = 1
    else:
        cfg[f"{name}_ALU_ALGO"] = st.alu[0]
    if st.mul is None:
        cfg[f"{name}_MUL_BYPASS"] = 1
    t.write(f"DPU_{name}_CFG", **cfg)
    t.write_raw(f"DPU_{name}_ALU_CFG", st.alu[1] if st.alu else 0)
    t.write(f"DPU_{name}_MUL_CFG", **({f"{name}_MUL_OPERAND": st.mul} if st.mul is not None else {}))


def write_dpu(t: Task, profile: ChipProfile, *, flying: bool, width: int, height: int,
              channels: int, dst: Reloc, dst_surf_stride: int, bs: SdpStage | None = None,
              bn: SdpStage | None = None, ew_cfg: Mapping[str, int] | None = None,
              out_cvt: OutCvt = OutCvt(), lut: LutProgram | None = None) -> None:
    """The DPU register block of an fp16-in / fp16-out task.

    ``flying``: the source is DPU_RDMA's MRDMA stream (no CNA/CORE), else the CORE accumulator.
    ``ew_cfg``: DPU_EW_CFG fields; None = the EW stage bypassed (with its LUT).
    """
    p = profile.input(DType.F16)
    out = profile.output(DType.F16, DType.F16)
    t.write("DPU_FEATURE_MODE_CFG", FLYING_MODE=int(flying), OUTPUT_MODE=OUTPUT_TO_MEMORY,
            BURST_LEN=BURST_LEN)
    t.write("DPU_DATA_FORMAT", PROC_PRECISION=p.precision, IN_PRECISION=p.precision,
            OUT_PRECISION=out.precision)
    t.write("DPU_OFFSET_PEND")
    t.write_addr("DPU_DST_BASE_ADDR", dst.buffer, dst.offset)
    t.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=dst_surf_stride // 16)
    t.write("DPU_DATA_CUBE_WIDTH", WIDTH=width - 1)
    t.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.write("DPU_DATA_CUBE_NOTCH_ADDR")
    t.write("DPU_DATA_CUBE_CHANNEL", CHANNEL=channels - 1, ORIG_CHANNEL=channels - 1)
    _write_stage(t, "BS", bs)
    t.write("DPU_BS_RELUX_CMP_VALUE")
    # The flying source is written with SIZE_E 0 and SURF_ADD = positions (conformance 05, the
    # hardware-validated flying program); the conv path with the fp16 output format's size_e
    # and surf_mult (profile, [size-e]; conformance 01/06).
    size_e = 0 if flying else out.size_e
    surf_mult = 1 if flying else out.surf_mult
    t.write("DPU_BS_OW_CFG", OD_BYPASS=1, SIZE_E_0=size_e, SIZE_E_1=size_e, SIZE_E_2=size_e)
    t.write("DPU_BS_OW_OP")
    t.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=channels - 1)
    t.write("DPU_WDMA_SIZE_1", WIDTH_WDMA=width - 1, HEIGHT_WDMA=height - 1)
    _write_stage(t, "BN", bn)
    t.write("DPU_BN_RELUX_CMP_VALUE")
    if ew_cfg is None:
        t.write("DPU_EW_CFG", EW_BYPASS=1, EW_OP_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_CVT_BYPASS=1,
                EW_RELU_BYPASS=1)
    else:
        t.write("DPU_EW_CFG", **ew_cfg)
    t.write("DPU_EW_CVT_OFFSET_VALUE")
    t.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
    t.write("DPU_EW_RELUX_CMP_VALUE")
    t.write_raw("DPU_OUT_CVT_OFFSET", out_cvt.offset & 0xFFFFFFFF)
    t.write("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=out_cvt.scale, FP32TOFP16_EN=int(out.fp32_to_fp16))
    t.write("DPU_OUT_CVT_SHIFT", MINUS_EXP=out_cvt.minus_exp, CVT_TYPE=int(out_cvt.affine))
    for i in range(8):
        t.write(f"DPU_EW_OP_VALUE_{i}")
    t.write("DPU_SURFACE_ADD", SURF_ADD=width * height * surf_mult)
    t.write("DPU_UNDOC_40C4")
    if lut is None:
        # LUT unused: clear its registers so no earlier task's setup carries over [chain]
        for reg in ("ACCESS_CFG", "ACCESS_DATA", "CFG", "INFO", "LE_START", "LE_END", "LO_START",
                    "LO_END", "LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
            t.write(f"DPU_LUT_{reg}")
    else:
        t.write("DPU_LUT_CFG", **lut.cfg)
        t.write("DPU_LUT_INFO", LUT_LE_INDEX_SELECT=lut.le_select, LUT_LO_INDEX_SELECT=lut.lo_select)
        t.write_raw("DPU_LUT_LE_START", lut.le_start & 0xFFFFFFFF)
        t.write_raw("DPU_LUT_LE_END", lut.le_end & 0xFFFFFFFF)
        t.write_raw("DPU_LUT_LO_START", lut.lo_start & 0xFFFFFFFF)
        t.write_raw("DPU_LUT_LO_END", lut.lo_end & 0xFFFFFFFF)
        for tab, sl in (("LE", lut.le_slope), ("LO", lut.lo_slope)):
            t.write(f"DPU_LUT_{tab}_SLOPE_SCALE", **{f"LUT_{tab}_SLOPE_UFLOW_SCALE": sl[0],
                                                     f"LUT_{tab}_SLOPE_OFLOW_SCALE": sl[1]})
            t.write(f"DPU_LUT_{tab}_SLOPE_SHIFT", **{f"LUT_{tab}_SLOPE_UFLOW_SHIFT": sl[2],
                                                     f"LUT_{tab}_SLOPE_OFLOW_SHIFT": sl[3]})


def upload_lut(t: Task, lut: LutProgram) -> None:
    """Both tables through the access port: ACCESS_CFG (write, table id, address 0) then one
    ACCESS_DATA word per entry, the address auto-incrementing [lut][conf 05 words 2/516]."""
    for table_id, entries in ((0, lut.le), (1, lut.lo)):
        t.write("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table_id, LUT_ADDR=0)
        t.write_each("DPU_LUT_ACCESS_DATA", "LUT_ACCESS_DATA", entries)


# ---------------------------------------------------------------------------------------------
# task builders
# ---------------------------------------------------------------------------------------------

def emit_flying(name: str, profile: ChipProfile, src: Reloc, dst: Reloc, positions: int, *,
                bs: SdpStage | None = None, bn: SdpStage | None = None,
                lut: LutProgram | None = None, out_cvt: OutCvt = OutCvt()) -> TaskProgram:
    """A DPU-only task over ``positions`` consecutive 16-byte atoms (8 fp16 lanes each) at
    ``src``, written to ``dst``: cube width = positions, height 1, 8 channels, one surface --
    the flat-vector framing of conformance 05 [lut "Pipeline", "Framing"]."""
    if not 1 <= positions <= FLYING_MAX_POSITIONS:
        raise LoweringError(f"{name}: a flying DPU task covers 1..{FLYING_MAX_POSITIONS} positions "
                            f"(QUIRK 3 keeps it well under the 13-bit width), got {positions}")
    c2 = profile.input(DType.F16).feature_c2
    t = Task(name, profile)
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    if lut is not None:
        upload_lut(t, lut)
        # the LUT runs in the EW stage with the operand op unused: conformance 05's word
        # (EW_RELU_BYPASS | EW_OP_CVT_BYPASS; the register operands, all 0, are inert)
        ew_cfg = {"EW_OP_CVT_BYPASS": 1, "EW_RELU_BYPASS": 1}
    else:
        ew_cfg = None
    write_dpu(t, profile, flying=True, width=positions, height=1, channels=c2, dst=dst,
              dst_surf_stride=positions * profile.atom_bytes, bs=bs, bn=bn, ew_cfg=ew_cfg,
              out_cvt=out_cvt, lut=lut)
    p = profile.input(DType.F16)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=positions - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=0)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=c2 - 1)
    t.write_addr("DPU_RDMA_RDMA_SRC_BASE_ADDR", src.buffer, src.offset)
    t.write("DPU_RDMA_RDMA_BRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_NRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
    t.write("DPU_RDMA_RDMA_EW_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE")
    # flying MRDMA: fp16 read and widened to fp32 [lut "Pipeline"]; value of conformance 05
    t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", FLYING_MODE=1, MRDMA_FP16TOFP32_EN=1,
            PROC_PRECISION=p.precision, BURST_LEN=BURST_LEN, IN_PRECISION=p.precision)
    t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
    t.write("DPU_RDMA_RDMA_SURF_NOTCH")
    t.write("DPU_RDMA_RDMA_PAD_CFG")
    t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)
    t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH")
    # DMA: the source atoms in, the result atoms out
    t.reads(src, positions * profile.atom_bytes)
    t.writes(dst, positions * profile.atom_bytes)
    return t.finish()


# DPU_EW_CFG for each binary op on the conv-main EW datapath: per-pixel operand
# (EW_DATA_MODE 1), 16-bit (EDATA_SIZE 2), operand from memory (EW_OP_SRC 1), ReLU and LUT
# bypassed. mul = EW_OP_TYPE 1 with the operand converter bypassed (0x108003C4); the ALU ops
# differ only in EW_ALU_ALGO, 0 max / 1 min / 2 sum (0x108002C0 / 0x108102C0 / 0x108202C0)
# [ew "Two-operand EW", "Max / Min"; k-acc].
_EW_COMMON = {"EW_DATA_MODE": 1, "EDATA_SIZE": 2, "EW_OP_SRC": 1, "EW_LUT_BYPASS": 1,
              "EW_RELU_BYPASS": 1}
EW_CFG = {
    "add": {**_EW_COMMON, "EW_ALU_ALGO": 2},
    "max": {**_EW_COMMON, "EW_ALU_ALGO": 0},
    "min": {**_EW_COMMON, "EW_ALU_ALGO": 1},
    "mul": {**_EW_COMMON, "EW_OP_TYPE": 1, "EW_OP_CVT_BYPASS": 1},
}


def emit_conv_dpu(name: str, profile: ChipProfile, *, feature: Reloc, rows: int,
                  feature_surf_pitch: int, weights: Reloc, kernels: int, out: Reloc,
                  out_channels: int, out_surf_stride: int,
                  ew: tuple[str, Reloc] | None = None, real_channels: int | None = None) -> TaskProgram:
    """A 1x1 fp16 convolution over ``rows`` positions (W = 1) and 32 input channels, written
    through the DPU; optionally combined with an ERDMA operand cube by the EW unit.

    ``feature_surf_pitch``: bytes between the feature's 8-channel surfaces (>= rows * 16);
    ``kernels``: the weight block's kernel count (a multiple of 16) of which the first
    ``out_channels`` are written, ``out_surf_stride`` bytes between output surfaces.
    ``ew`` = (op, operand): the operand is a cube of exactly the output geometry, dense
    (surfaces rows*16 apart) [k-acc]. ``real_channels`` (default 32) goes to
    CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL: channels past it are not real input (Mesa programs the
    real channel count there; the simulator reads them as 0, an inference).
    The CNA/CORE framing is the matmul emitter's (conformance 01/06, Mesa), with the feature
    strides generalised by the same formula the simulator decodes (pitch = 16*(SURF+LINE)).
    """
    p = profile.input(DType.F16)
    k = EW_VIEW_CHANNELS
    if rows < max(profile.min_feature_rows, 1) or rows > profile.max_feature_rows:
        raise LoweringError(f"{name}: {rows} rows; a conv task reads {profile.min_feature_rows}.."
                            f"{profile.max_feature_rows}")
    if ew is not None and rows < profile.ew_min_positions:
        raise LoweringError(f"{name}: an EW operand cube of {rows} positions is under the "
                            f"{profile.ew_min_positions}-position stride floor (k-accumulation.md)")
    if feature_surf_pitch < rows * 16 or feature_surf_pitch % 16:
        raise LoweringError(f"{name}: feature surface pitch {feature_surf_pitch} B cannot hold "
                            f"{rows} atoms")
    if kernels % p.n_align or out_channels > kernels:
        raise LoweringError(f"{name}: {kernels} kernels (multiple of {p.n_align}) for "
                            f"{out_channels} output channels")
    out_fmt = profile.output(DType.F16, DType.F16)
    w_bytes = kernels * k * p.esize
    data_entries = ceil_div(k * p.esize, profile.cbuf_entry_bytes)
    data_banks = ceil_div(rows * data_entries * profile.cbuf_entry_bytes, profile.cbuf_bank_bytes)
    if data_banks + ceil_div(w_bytes, profile.cbuf_bank_bytes) > profile.cbuf_banks:
        raise LoweringError(f"{name}: {rows} rows x {kernels} kernels do not fit the CBUF")
    t = Task(name, profile)
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    # ---- CNA ----
    t.write("CNA_CONV_CON1", CONV_MODE=0, IN_PRECISION=p.precision, PROC_PRECISION=p.precision)
    t.write("CNA_CONV_CON2", FEATURE_GRAINS=rows + 1)
    t.write("CNA_CONV_CON3", CONV_X_STRIDE=1, CONV_Y_STRIDE=1)
    t.write("CNA_DATA_SIZE0", DATAIN_WIDTH=1, DATAIN_HEIGHT=rows)
    t.write("CNA_DATA_SIZE1", DATAIN_CHANNEL=k, DATAIN_CHANNEL_REAL=(real_channels or k) - 1)
    t.write("CNA_DATA_SIZE2", DATAOUT_WIDTH=1)
    t.write("CNA_DATA_SIZE3", DATAOUT_ATOMICS=rows)
    t.write("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=w_bytes)
    t.write("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=k * p.esize)
    t.write("CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=kernels, WEIGHT_HEIGHT=1, WEIGHT_WIDTH=1)
    t.write("CNA_CBUF_CON0", DATA_BANK=data_banks, WEIGHT_BANK=profile.cbuf_banks - data_banks)
    t.write("CNA_CBUF_CON1", DATA_ENTRIES=data_entries)
    t.write("CNA_CVT_CON0", CVT_BYPASS=1, CVT_TYPE=1, DATA_SIGN=1)
    for i in range(1, 5):
        t.write(f"CNA_CVT_CON{i}", **{f"CVT_SCALE{i - 1}": 1})
    t.write("CNA_FC_CON0")
    t.write("CNA_FC_CON1")
    t.write("CNA_PAD_CON0")
    t.write_addr("CNA_FEATURE_DATA_ADDR", feature.buffer, feature.offset)
    t.write("CNA_FC_CON2")
    t.write("CNA_DMA_CON0", DATA_BURST_LEN=BURST_LEN, WEIGHT_BURST_LEN=BURST_LEN)
    # line pitch = 4 * LINE_STRIDE bytes, surface pitch = 16 * (SURF_STRIDE + LINE_STRIDE) bytes
    # (Mesa rkt_task.c; conformance 01/04/06: 4/4, 48/72, 4/12); a dense W=1 cube gives
    # LINE 4, SURF rows-4 -- the value emitters/matmul.py writes.
    line = 4
    t.write("CNA_DMA_CON1", LINE_STRIDE=line)
    t.write("CNA_DMA_CON2", SURF_STRIDE=feature_surf_pitch // 16 - line)
    t.write("CNA_FC_DATA_SIZE0", DMA_WIDTH=1, DMA_HEIGHT=rows)
    t.write("CNA_FC_DATA_SIZE1", DMA_CHANNEL=k)
    t.write("CNA_DCOMP_CTRL")
    t.write("CNA_DCOMP_REGNUM")
    t.write_addr("CNA_DCOMP_ADDR0", weights.buffer, weights.offset)
    for i in range(16):
        t.write(f"CNA_DCOMP_AMOUNT{i}")
    t.write("CNA_CVT_CON5")
    t.write("CNA_PAD_CON1")
    # ---- CORE ----
    t.write("CORE_MISC_CFG", QD_EN=p.core_qd_en, PROC_PRECISION=p.precision)
    t.write("CORE_DATAOUT_SIZE_0", DATAOUT_WIDTH=0, DATAOUT_HEIGHT=rows - 1)
    t.write("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=kernels - 1)
    t.write("CORE_CLIP_TRUNCATE")
    t.write("CORE_UNDOC_3030")
    # ---- DPU ----
    # The DPU cube keeps the CORE's kernel count (the simulator refuses a DPU cube narrower
    # than the accumulator); only ``out_channels`` of them must land, so a caller that wants
    # fewer owns the extra lanes/surfaces (see _bcast_tasks).
    write_dpu(t, profile, flying=False, width=1, height=rows, channels=kernels, dst=out,
              dst_surf_stride=out_surf_stride, ew_cfg=EW_CFG[ew[0]] if ew else None)
    # ---- DPU_RDMA ----
    t.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=0)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=rows - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=kernels - 1)
    surf = rows * profile.atom_bytes
    if ew is None:
        # plain conv: MRDMA disabled or the job hangs [mrdma]
        t.write("DPU_RDMA_RDMA_SRC_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_BRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_NRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
        t.write("DPU_RDMA_RDMA_EW_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE")
        t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", MRDMA_DISABLE=1, BURST_LEN=BURST_LEN,
                MRDMA_FP16TOFP32_EN=1)
        t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
        t.write("DPU_RDMA_RDMA_SURF_NOTCH")
        t.write("DPU_RDMA_RDMA_PAD_CFG")
        t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)
        t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH")
    else:
        # EW operand transport: MRDMA SRC_BASE = operand, ERDMA EW_BASE = operand + one
        # surface, SURF_NOTCH = EW_SURF_STRIDE = EW_SURF_NOTCH = one surface, COMB_USE 5,
        # ERDMA per-pixel 16-bit [k-acc][conf 06]
        opnd = ew[1]
        t.write_addr("DPU_RDMA_RDMA_SRC_BASE_ADDR", opnd.buffer, opnd.offset)
        t.write("DPU_RDMA_RDMA_BRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_NRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=2)
        t.write_addr("DPU_RDMA_RDMA_EW_BASE_ADDR", opnd.buffer, opnd.offset + surf)
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=surf // 16)
        t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", COMB_USE=5, BURST_LEN=BURST_LEN,
                PROC_PRECISION=p.precision, IN_PRECISION=p.precision)
        t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
        t.write("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=surf // 16)
        t.write("DPU_RDMA_RDMA_PAD_CFG")
        t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)
        t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=surf // 16)
    # DMA: the 4 feature surfaces (32 channels), the weight block, the EW operand (dense, the
    # output's geometry) and the output's kernel surfaces
    atom = profile.atom_bytes
    t.reads(feature, rows * atom, k // p.feature_c2, feature_surf_pitch)
    t.reads(weights, w_bytes)
    if ew is not None:
        t.reads(ew[1], (kernels // p.feature_c2) * rows * atom)
    t.writes(out, rows * atom, kernels // p.feature_c2, out_surf_stride)
    return t.finish()


# ---------------------------------------------------------------------------------------------
# the flat views
# ---------------------------------------------------------------------------------------------

def flying_chunks(nbytes: int, profile: ChipProfile) -> list[tuple[int, int]]:
    """(byte offset, positions) of the flying tasks covering ``nbytes`` (whole atoms)."""
    atoms = ceil_div(nbytes, profile.atom_bytes)
    out, pos = [], 0
    while pos < atoms:
        n = min(FLYING_MAX_POSITIONS, atoms - pos)
        out.append((pos * profile.atom_bytes, n))
        pos += n
    return out


def ew_chunks(nbytes: int, profile: ChipProfile) -> tuple[list[tuple[int, int]], int]:
    """(byte offset, rows) of the identity-conv EW tasks covering ``nbytes``, and the padded
    span they touch. A chunk of R rows is R x 32 channels = 4 surfaces of R atoms = 64R bytes.
    R is a multiple of the row alignment, at least the EW stride floor, and at most the
    feature rows one conv task reads."""
    atom = profile.atom_bytes
    per_row = atom * EW_VIEW_CHANNELS // profile.input(DType.F16).feature_c2   # 64 bytes
    align = profile.row_align
    r_max = profile.max_feature_rows // align * align
    r_min = round_up(max(profile.ew_min_positions, profile.min_feature_rows), align)
    rows_total = round_up(max(ceil_div(nbytes, per_row), r_min), align)
    out, done = [], 0
    n_tasks = ceil_div(rows_total, r_max)
    # spread rows evenly so no task falls under the floor
    base = round_up(ceil_div(rows_total, n_tasks), align)
    while done < rows_total:
        r = min(base, rows_total - done)
        if r < r_min:          # cannot happen with even spreading; kept as a guard
            raise LoweringError(f"internal: EW chunk of {r} rows under the floor {r_min}")
        out.append((done * per_row, r))
        done += r
    return out, done * per_row


def _identity_weights(profile: ChipProfile, sign: float) -> np.ndarray:
    k = EW_VIEW_CHANNELS
    wl = weight_layout(profile, DType.F16, k, k)
    return wl.pack((sign * np.eye(k)).astype(np.float16))


BINARY_OPS = ("add", "sub", "mul", "max", "min")


def _check_op(op: str) -> None:
    if op not in BINARY_OPS:
        raise LoweringError(f"element-wise op {op!r} is not one of {', '.join(BINARY_OPS)}")


def full_ew_tasks(op: str, a: str, b: str, out: str, weights: str, nbytes: int,
                  profile: ChipProfile, prefix: str = "ew") -> tuple[list[TaskProgram], int]:
    """Tasks computing out = a OP b over the flat view of ``nbytes``; returns (tasks, padded
    span). ``weights`` names a const buffer holding the 32x32 identity (-identity for sub)."""
    _check_op(op)
    chunks, span = ew_chunks(nbytes, profile)
    # sub: the conv main feed is -b, the ERDMA operand a, the EW unit adds them
    main, opnd, ew_op = (b, a, "add") if op == "sub" else (a, b, op)
    tasks = []
    for i, (off, rows) in enumerate(chunks):
        tasks.append(emit_conv_dpu(
            f"{prefix}{i}", profile, feature=Reloc(main, off), rows=rows,
            feature_surf_pitch=rows * profile.atom_bytes, weights=Reloc(weights),
            kernels=EW_VIEW_CHANNELS, out=Reloc(out, off), out_channels=EW_VIEW_CHANNELS,
            out_surf_stride=rows * profile.atom_bytes, ew=(ew_op, Reloc(opnd, off))))
    return tasks, span


def weights_buffer(op: str, profile: ChipProfile, name: str = "weights") -> BufferSpec:
    data = _identity_weights(profile, -1.0 if op == "sub" else 1.0)
    return BufferSpec(name, "const", data.size, data=data)


# ---------------------------------------------------------------------------------------------
# lower_* entry points
# ---------------------------------------------------------------------------------------------

def lower_binary(op: str, layout: CubeLayout, profile: ChipProfile | str | None = None) -> OpProgram:
    """out = a OP b for two fp16 cubes of the same dense ``layout``.

    Buffers: ``a`` (input 0), ``b`` (input 1), ``out`` (output 0), ``weights`` (const, the
    32x32 +-identity), ``regcmd``. The input/output ``nbytes`` is the padded span the tasks
    touch (>= layout.nbytes; bytes past the cube are read as anything and written with
    padding results)."""
    profile = resolve_profile(profile)
    _check_op(op)
    check_fp16_cube(layout, profile, f"element-wise {op}")
    tasks, span = full_ew_tasks(op, "a", "b", "out", "weights", layout.nbytes, profile)
    bufs = [BufferSpec("a", "input", span, layout=layout, bind=0),
            BufferSpec("b", "input", span, layout=layout, bind=1),
            BufferSpec("out", "output", span, layout=layout, bind=0),
            weights_buffer(op, profile)]
    macs = span // 2 * EW_VIEW_CHANNELS
    return npu_program(bufs, [tasks], profile, ("a", "b", "weights"), ("out",), macs)


def scalar_stages(op: str, value: float, reverse: bool) -> tuple[SdpStage | None, SdpStage | None]:
    """BS/BN register operands for ``x OP c`` (``c OP x`` when ``reverse``). The constant is
    the fp16 value of ``value`` (the tensor's dtype), held exactly as the fp32 ALU operand."""
    _check_op(op)
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


def lower_binary_scalar(op: str, layout: CubeLayout, value: float, reverse: bool = False,
                        profile: ChipProfile | str | None = None) -> OpProgram:
    """out = x OP c (or c OP x with ``reverse``) for a constant ``c`` (rounded to fp16).

    One flying DPU pass per <= 4096 atoms; the BS (or, for c - x, BN) stage applies the
    register operand. Buffers: ``x`` (input 0), ``out`` (output 0), ``regcmd``; no padding."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a scalar")
    bs, bn = scalar_stages(op, value, reverse)
    tasks = [emit_flying(f"{op}_c{i}", profile, Reloc("x", off), Reloc("out", off), n, bs=bs, bn=bn)
             for i, (off, n) in enumerate(flying_chunks(layout.nbytes, profile))]
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0)]
    return npu_program(bufs, [tasks], profile, ("x",), ("out",))


def broadcast_channel_cube(layout: CubeLayout, vector: np.ndarray) -> np.ndarray:
    """The packed cube holding ``vector[c]`` at every position (padding lanes 0)."""
    v = np.asarray(vector)
    if v.shape != (layout.channels,):
        raise LoweringError(f"per-channel operand must have shape ({layout.channels},), got "
                            f"{v.shape}")
    full = np.broadcast_to(v.astype(np.float16), (layout.height, layout.width, layout.channels))
    return layout.pack(np.ascontiguousarray(full))


def lower_binary_channel(op: str, layout: CubeLayout, vector: np.ndarray, reverse: bool = False,
                         profile: ChipProfile | str | None = None) -> OpProgram:
    """out[h, w, c] = x[h, w, c] OP v[c] (v OP x with ``reverse``) for a compile-time vector.

    The vector is broadcast into a constant cube (``bcast``, resident) and combined as a full
    cube. Buffers: ``x`` (input 0), ``out`` (output 0), ``bcast`` and ``weights`` (const),
    ``regcmd``; x/out are padded as in lower_binary."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a per-channel vector")
    _, span = ew_chunks(layout.nbytes, profile)
    data = np.zeros(span, np.uint8)
    data[:layout.nbytes] = broadcast_channel_cube(layout, vector)
    a, b = ("bcast", "x") if reverse else ("x", "bcast")
    tasks, span = full_ew_tasks(op, a, b, "out", "weights", layout.nbytes, profile)
    bufs = [BufferSpec("x", "input", span, layout=layout, bind=0),
            BufferSpec("out", "output", span, layout=layout, bind=0),
            BufferSpec("bcast", "const", span, layout=layout, data=data),
            weights_buffer(op, profile)]
    return npu_program(bufs, [tasks], profile, ("x", "bcast", "weights"), ("out",),
                       span // 2 * EW_VIEW_CHANNELS)


def row_vector_layout(positions: int, profile: ChipProfile | str | None = None) -> CubeLayout:
    """The runtime per-row operand of lower_binary_row: an fp16 cube of ``positions`` rows x
    32 channels whose channel 0 holds s[row], i.e. s[row] at byte 16*row. Only channel 0 is
    real input (DATAIN_CHANNEL_REAL = 0): the other bytes of the span may hold anything
    (reduce.lower_row_max writes this form directly)."""
    profile = resolve_profile(profile)
    return feature_layout(profile, DType.F16, positions, 1, EW_VIEW_CHANNELS)


def pack_row_vector(s: np.ndarray, profile: ChipProfile | str | None = None) -> np.ndarray:
    s = np.asarray(s, np.float16).reshape(-1)
    lay = row_vector_layout(s.size, profile)
    full = np.zeros((s.size, 1, EW_VIEW_CHANNELS), np.float16)
    full[:, 0, 0] = s
    return lay.pack(full)


def _bcast_tasks(profile: ChipProfile, src: str, positions: int, weights: str, out: str,
                 channels: int, name: str) -> list[TaskProgram]:
    """Tasks writing out[p, c] = src[p, channel 0] for c < channels (rounded up to the weight
    kernel group; ``out`` must hold those surfaces) over all ``positions``.

    Row tiles of at most the conv's feature rows; a ragged tail tile is moved back so that it
    overlaps its predecessor instead of dropping under the 4-row floor (re-writing the same
    broadcast values is harmless: ``out`` is op-private scratch)."""
    p = profile.input(DType.F16)
    atom = profile.atom_bytes
    align = profile.row_align
    if positions < profile.min_feature_rows:
        raise LoweringError(
            f"a per-row operand over {positions} rows: the broadcast conv needs at least "
            f"{profile.min_feature_rows} feature rows (matmul-as-conv.md, 'Feature height < 4 is "
            f"broken'); use the scalar form (lower_binary_scalar) for a single row")
    kernels = round_up(channels, p.n_align)
    r_max = profile.max_feature_rows // align * align
    # weights: ones in input channel 0 of each kernel, so out = s exactly (fp32 product by 1).
    # Kernel tiles keep the CBUF split legal.
    bank = profile.cbuf_bank_bytes
    n_tile = kernels
    while True:
        data_banks = ceil_div(r_max * profile.cbuf_entry_bytes, bank)
        if data_banks + ceil_div(n_tile * EW_VIEW_CHANNELS * p.esize, bank) <= profile.cbuf_banks \
                and n_tile <= profile.cube_dim_limit:
            break
        n_tile = round_up(n_tile // 2, p.n_align)
    # row tiles: whole aligned tiles, then the aligned part of the rest, then one aligned tile
    # ending at the last row (overlapping; positions >= 4 was checked above)
    spans: list[tuple[int, int]] = []
    m0 = 0
    while positions - m0 >= align:
        rows = min(r_max, (positions - m0) // align * align)
        spans.append((m0, rows))
        m0 += rows
    if m0 < positions:
        spans.append((positions - align, align))
    tasks = []
    for n0 in range(0, kernels, n_tile):
        nk = min(n_tile, kernels - n0)
        for m0, rows in spans:
            tasks.append(emit_conv_dpu(
                f"{name}{len(tasks)}", profile, feature=Reloc(src, m0 * atom), rows=rows,
                feature_surf_pitch=positions * atom,
                weights=Reloc(weights, n0 * EW_VIEW_CHANNELS * p.esize), kernels=nk,
                out=Reloc(out, (n0 // p.feature_c2) * positions * atom + m0 * atom),
                out_channels=nk, out_surf_stride=positions * atom, real_channels=1))
    return tasks


def lower_binary_row(op: str, layout: CubeLayout, reverse: bool = False,
                     profile: ChipProfile | str | None = None) -> OpProgram:
    """out[p, c] = x[p, c] OP s[p] (s OP x with ``reverse``) with s a run-time vector, one
    value per position p = h * W + w (a matrix cube's rows).

    Buffers: ``x`` (input 0), ``s`` (input 1, ``row_vector_layout(H*W)``: s in channel 0),
    ``out`` (output 0), ``bcast`` (scratch: the broadcast cube), ``ones`` and ``weights``
    (const), ``regcmd``. Two passes: the broadcast conv tasks, then the EW tasks."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a per-row vector")
    p = profile.input(DType.F16)
    positions = layout.height * layout.width
    kernels = round_up(layout.channels, p.n_align)
    # the broadcast cube holds whole kernel groups of surfaces: same strides as x, maybe one
    # more surface than x at the end
    bcast_bytes = (kernels // p.feature_c2) * positions * profile.atom_bytes
    _, span = ew_chunks(layout.nbytes, profile)
    ones = np.zeros((kernels, EW_VIEW_CHANNELS), np.float16)
    ones[:, 0] = 1.0
    wl = weight_layout(profile, DType.F16, kernels, EW_VIEW_CHANNELS)
    ones_packed = wl.pack(ones)
    tasks = _bcast_tasks(profile, "s", positions, "ones", "bcast", layout.channels, "bcast")
    a, b = ("bcast", "x") if reverse else ("x", "bcast")
    ew, span = full_ew_tasks(op, a, b, "out", "weights", layout.nbytes, profile)
    s_lay = row_vector_layout(positions, profile)
    bufs = [BufferSpec("x", "input", span, layout=layout, bind=0),
            BufferSpec("s", "input", s_lay.nbytes, layout=s_lay, bind=1),
            BufferSpec("out", "output", span, layout=layout, bind=0),
            # the EW pass reads bcast over x's padded span; past bcast_bytes no task writes
            # it, and the flat view's identity conv would mix stale non-finite bytes there
            # into real outputs (0 * NaN): zero-filled once
            BufferSpec("bcast", "scratch", max(bcast_bytes, span), zero=span > bcast_bytes),
            BufferSpec("ones", "const", ones_packed.size, data=ones_packed),
            weights_buffer(op, profile)]
    return npu_program(bufs, [tasks, ew], profile, ("x", "s", "ones", "weights"), ("out",),
                       span // 2 * EW_VIEW_CHANNELS + positions * kernels * EW_VIEW_CHANNELS)
