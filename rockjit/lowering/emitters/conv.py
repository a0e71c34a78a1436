"""Convolutions on the CNA->CORE->DPU path, and the one task emitter every conv and matmul uses.

A matmul is a 1x1 convolution (notes: matmul-as-conv.md), so this module holds the complete
task program for one conv tile (``emit_conv_task``) and the code that turns a tile plan
(tiling.py) into jobs of self-chained kicks (``build_tiled``); emitters/matmul.py reuses both.

Lowerings here:
* ``lower_conv2d``: direct conv (kernel, stride, padding incl. asymmetric, dilation), fp16 ->
  fp16/fp32 and int8 -> int32; output rows, output channels and input channels tiled as the
  planner says; each output tile lands at its place in the one whole output cube.
* depthwise (``groups == channels``): CONV_MODE 3 + DW_EN with the depthwise write-out fields
  (notes: depthwise-conv.md, conformance 09), tiled over channels and rows. fp16 only on the
  raw path: the int8 depthwise writer is the requantising mode (depthwise-conv.md "int8
  depthwise"), which ``lower_qconv2d`` emits.
* ``lower_qconv2d``: int8 -> int8 direct or depthwise with on-chip requantization
  (``ConvRequant``: input zero point as the CNA pad, CPEND for the weight zero point, a BS-ALU
  int32 vector from BRDMA, OUT_CVT scale/shift/offset); rockjit.quant derives the numbers.
* ``lower_conv1d``: time on the height axis, width 1 (notes: encodings/whisper-encoder.md
  "Lower with time on the HEIGHT axis").
* non-overlapping patchify (stride == kernel, no padding/dilation) as a host im2col step + a
  matmul, when the cost rule in ``choose_patchify`` says so (notes: encodings/siglip-encoder.md).

Register sources (facts; the formulas are ours): [conf] conformance 01-04, 09 programs;
[mesa] Mesa rocket rkt_regcmd.c / rkt_task.c; [mm] matmul-as-conv.md; [dw] depthwise-conv.md;
[kacc] encodings/k-accumulation.md; [tile] encodings/tile-layouts.md; [size-e]
encodings/size-e-quirk.md; [mrdma] encodings/mrdma-trap.md; [task]
encodings/regcmd-task-model.md; [reuse] encodings/cbuf-reuse.md; [prec] precision-field.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, depthwise_weight_layout, weight_layout
from ..opprogram import BufferSpec, HostStep, NpuJob, NpuStep, OpProgram, Slice
from ..bounds import check_tasks
from ..profile import ChipProfile
from ..regcmd import Access, Kick, LoweringError, Reloc, Task, TaskProgram, link
from ..tiling import (KACC_DPU, KACC_HOST, ConvPlan, ConvShape, cbuf_split, ceil_div, field_limit,
                      plan_conv, round_up)

# DMA burst length code 15 (the longest burst): every conformance program and Mesa's conv [conf]
BURST_LEN = 15
# DPU_FEATURE_MODE_CFG.OUTPUT_MODE 2 = write to memory: every CNA->DPU program in [conf], [mesa]
OUTPUT_TO_MEMORY = 2
# CNA/DPU conv mode codes [dw]
CONV_MODE_DIRECT, CONV_MODE_DEPTHWISE = 0, 3
# Depthwise CNA_CONV_CON2.FEATURE_GRAINS = 50 + stride_y + 1, Mesa's empirical constant [dw]
DW_FEATURE_GRAINS_BASE = 50
# Depthwise DPU_BS_OW_OP = 0x80 - weight zero point; our fp16 weights have zero point 0 [dw]
DW_OW_OP_BASE = 0x80
# Depthwise writes with size_e = 3 whatever the output width [dw]
DW_SIZE_E = 3
# EW add on the DPU: EW_ALU_ALGO 2 = sum, per-pixel operand mode 1 [kacc]; operand data size
# code 2 = 16-bit (fp16 partials, [kacc] / conformance 02), 3 = 32-bit (fp32 partials: "a 32-bit
# fp32 EW operand read works (EDATA_SIZE(3))", k-accumulation.md); RDMA COMB_USE 5 combines the
# conv result with the ERDMA stream [kacc][mrdma]
EW_ALU_SUM, EW_PER_PIXEL, COMB_CONV_PLUS_ERDMA = 2, 1, 5
EW_DATA_SIZE = {2: 2, 4: 3}   # operand element bytes -> EDATA_SIZE / ERDMA_DATA_SIZE code


# ---------------------------------------------------------------------------------------------
# one task
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvRequant:
    """The int8-output requantizing write-out (Mesa/Teflon's int8 program; facts: [dw] "int8
    depthwise", encodings/out-cvt-converter.md). The integer accumulator gets CPEND's
    ``ow_op`` x the window sum of the input (the weight zero point), the per-channel int32
    vector read by BRDMA added in the BS ALU, then OUT_CVT: round((x * scale) >> shift) (ties
    away from zero when ``round_away``) + ``offset``, saturated to int8. The CNA pads with
    ``pad_value`` (the input zero point). rockjit.quant derives the numbers."""

    pad_value: int            # int8 input zero point, the CNA's pad byte
    ow_op: int                # signed 16: -weight zero point
    scale: int                # OUT_CVT_SCALE, signed 16
    shift: int                # OUT_CVT_SHIFT
    offset: int               # OUT_CVT_OFFSET, signed 32
    round_away: bool = True   # OUT_CVT_SHIFT.CVT_ROUND


@dataclass(frozen=True)
class ConvTaskGeom:
    """Everything one CNA->CORE->DPU task needs besides its addresses."""

    in_dtype: DType
    out_dtype: DType
    depthwise: bool
    in_h: int                 # input rows this task reads
    in_w: int
    in_c: int                 # input channels this task reads (padded to k_align)
    line_pitch: int           # bytes between input rows of the cube it reads
    surf_pitch: int           # bytes between input channel groups
    kh: int
    kw: int
    kernels: int              # kernels (direct) -- depthwise: its channel count
    sy: int
    sx: int
    dy: int
    dx: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    dst_surf_stride: int      # bytes between output channel groups where it writes
    ew_esize: int = 0         # K accumulation: bytes per element of the partial it adds (0: none)
    requant: ConvRequant | None = None   # int8 -> int8 with on-chip requantization

    @property
    def out_c(self) -> int:
        return self.in_c if self.depthwise else self.kernels

    @property
    def positions(self) -> int:
        return self.out_w * self.out_h


def emit_conv_task(g: ConvTaskGeom, profile: ChipProfile, feature: Reloc, weight: Reloc,
                   out: Reloc, ew_operand: Reloc | None = None, name: str = "conv",
                   reuse: str = "none", bias: Reloc | None = None) -> TaskProgram:
    """The complete, self-contained task for ``g`` ([task]: every task rewrites its whole
    configuration). ``ew_operand``: the previous K partial (a dense cube of this task's output
    geometry) the DPU adds to the conv result [kacc]. ``reuse``: "data"/"weight" keeps that CBUF
    operand from the previous task of the job [reuse]."""
    if profile.encoding != "rk3588":
        raise LoweringError(f"the conv emitter writes the RK3588 register encoding; chip "
                            f"{profile.name!r} uses {profile.encoding!r}")
    if reuse not in ("none", "data", "weight"):
        raise LoweringError(f"reuse must be 'none', 'data' or 'weight' (one operand at a time "
                            f"[reuse]), got {reuse!r}")
    if (ew_operand is None) != (g.ew_esize == 0):
        raise LoweringError("a K-accumulating task needs both ew_esize and an ew_operand address")
    p = profile.input(g.in_dtype)
    outf = profile.output(g.in_dtype, g.out_dtype)
    dw = g.depthwise
    rq = g.requant
    if (rq is None) != (bias is None):
        raise LoweringError("a requantizing task needs both ConvTaskGeom.requant and the bias "
                            "vector address (and a plain task neither)")
    if rq is not None and (g.in_dtype, g.out_dtype) != (DType.I8, DType.I8):
        raise LoweringError(f"on-chip requantization is the int8 -> int8 writer; got "
                            f"{g.in_dtype.value} -> {g.out_dtype.value}")
    if dw and g.in_dtype != DType.F16 and rq is None:
        raise LoweringError(
            f"{g.in_dtype.value} depthwise is not supported: the int32-raw depthwise writer "
            f"lands outputs at twice the stride on hardware and the working int8 depthwise is a "
            f"requantising int8-output mode (notes: depthwise-conv.md); run it in fp16")
    if ew_operand is not None and (dw or g.in_dtype.is_int):
        raise LoweringError("DPU K-accumulation exists for the fp16 direct path only ([kacc]: the "
                            "EW ALU is float-only); sum integer partials on the host")
    mode = CONV_MODE_DEPTHWISE if dw else CONV_MODE_DIRECT
    esize = p.esize
    per_kernel = g.kh * g.kw * g.in_c * esize
    wbytes = per_kernel * (1 if dw else g.kernels)
    split = cbuf_split(profile, g.in_dtype, g.in_h, g.in_w, g.in_c, wbytes)
    size_e = DW_SIZE_E if dw else outf.size_e
    surf_mult = size_e + 1          # [size-e][dw]: fp16 2, fp32 4, integer 8, depthwise 4
    line_field = g.line_pitch // 4  # CNA_DMA_CON1 counts 4-byte units ([mesa] W*16/4) [conf 04]
    # CNA_DMA_CON2 holds the surface pitch in atoms minus the line field: Mesa's
    # line*(H/4 - 1) = W*H - 4W for a dense cube [mesa][conf 01/02/04]; the pitch of the whole
    # cube a tile is cut from keeps tiles reading their rows in place
    surf_field = g.surf_pitch // 16 - line_field
    if g.line_pitch % 16 or g.surf_pitch % 16 or surf_field < 0:
        raise LoweringError(f"input cube pitches line {g.line_pitch} / surface {g.surf_pitch} B are "
                            f"not whole atoms or the surface is shorter than 4 lines")
    t = Task(name, profile)

    # Arm the DPU / DPU_RDMA ping-pong register groups every task [task]; the kernel arms CNA and
    # CORE with its per-core bit, so we must not (seeds 003 s4).
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)

    # ---- CNA: feature + weight fetch ------------------------------------------------------
    t.write("CNA_CONV_CON1", CONV_MODE=mode, IN_PRECISION=p.precision, PROC_PRECISION=p.precision)
    # direct: input rows + 1, the derived value that works [dw][conf 01/02/04: 9, 17, 11];
    # depthwise: Mesa's constant 50 + stride_y + 1 [dw][conf 09: 53]
    grains = DW_FEATURE_GRAINS_BASE + g.sy + 1 if dw else g.in_h + 1
    t.write("CNA_CONV_CON2", FEATURE_GRAINS=grains)
    # dilation is stored minus one (NVDLA's convention; no conformance program dilates --
    # modelled by inference in the simulator too, csrc/sim/cna.c)
    t.write("CNA_CONV_CON3", CONV_X_STRIDE=g.sx, CONV_Y_STRIDE=g.sy,
            ATROUS_X_DILATION=g.dx - 1, ATROUS_Y_DILATION=g.dy - 1)
    t.write("CNA_DATA_SIZE0", DATAIN_WIDTH=g.in_w, DATAIN_HEIGHT=g.in_h)
    # channels as stored (padding zeros included) and the last channel index [mesa][conf]
    t.write("CNA_DATA_SIZE1", DATAIN_CHANNEL=g.in_c, DATAIN_CHANNEL_REAL=g.in_c - 1)
    t.write("CNA_DATA_SIZE2", DATAOUT_WIDTH=g.out_w)
    t.write("CNA_DATA_SIZE3", DATAOUT_ATOMICS=g.positions)          # output positions [mesa]
    t.write("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=wbytes)
    t.write("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    # depthwise: one kernel, the channels ride in the weight atom [dw][conf 09]
    t.write("CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=1 if dw else g.kernels, WEIGHT_HEIGHT=g.kh,
            WEIGHT_WIDTH=g.kw)
    # the CBUF partition of tiling.cbuf_split; FC_DATA_BANK must stay 0 on the conv path [reuse]
    t.write("CNA_CBUF_CON0", DATA_BANK=split.data_banks, WEIGHT_BANK=split.weight_banks,
            DATA_REUSE=int(reuse == "data"), WEIGHT_REUSE=int(reuse == "weight"))
    t.write("CNA_CBUF_CON1", DATA_ENTRIES=split.data_entries)
    # input converter bypassed: signed data passes unscaled [mesa][conf]
    t.write("CNA_CVT_CON0", CVT_BYPASS=1, CVT_TYPE=1, DATA_SIGN=1)
    for i in range(1, 5):
        t.write(f"CNA_CVT_CON{i}", **{f"CVT_SCALE{i - 1}": 1})
    t.write("CNA_FC_CON0")
    t.write("CNA_FC_CON1")
    # top/left padding; the bottom/right extent follows from the output size [conf 04][mesa]
    t.write("CNA_PAD_CON0", PAD_TOP=g.pad_top, PAD_LEFT=g.pad_left)
    t.write_addr("CNA_FEATURE_DATA_ADDR", feature.buffer, feature.offset)
    t.write("CNA_FC_CON2")
    t.write("CNA_DMA_CON0", DATA_BURST_LEN=BURST_LEN, WEIGHT_BURST_LEN=BURST_LEN)
    t.write("CNA_DMA_CON1", LINE_STRIDE=line_field)
    t.write("CNA_DMA_CON2", SURF_STRIDE=surf_field)
    t.write("CNA_FC_DATA_SIZE0", DMA_WIDTH=g.in_w, DMA_HEIGHT=g.in_h)
    t.write("CNA_FC_DATA_SIZE1", DMA_CHANNEL=g.in_c)
    # weights are not compressed: decompression off, the stream read plainly from ADDR0 [mm]
    t.write("CNA_DCOMP_CTRL")
    t.write("CNA_DCOMP_REGNUM")
    t.write_addr("CNA_DCOMP_ADDR0", weight.buffer, weight.offset)
    for i in range(16):
        t.write(f"CNA_DCOMP_AMOUNT{i}")
    t.write("CNA_CVT_CON5")
    if rq is None:
        t.write("CNA_PAD_CON1")                                     # pad value 0
    else:
        # the input zero point in every byte lane ([dw] "CNA_PAD_CON1 is read per byte lane")
        t.write("CNA_PAD_CON1", PAD_VALUE=(rq.pad_value & 0xFF) * 0x01010101)

    # ---- CORE: the MAC array --------------------------------------------------------------
    # the int8-output requant writer needs QD_EN = 1 ([dw] "CORE_MISC_CFG QD_EN = 1")
    t.write("CORE_MISC_CFG", QD_EN=1 if rq is not None else p.core_qd_en, DW_EN=int(dw),
            PROC_PRECISION=p.precision)
    t.write("CORE_DATAOUT_SIZE_0", DATAOUT_WIDTH=g.out_w - 1, DATAOUT_HEIGHT=g.out_h - 1)
    t.write("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=g.out_c - 1)
    t.write("CORE_CLIP_TRUNCATE")
    t.write("CORE_UNDOC_3030")                                      # written 0 by [mesa], [conf]

    # ---- DPU: write-out ---------------------------------------------------------------------
    t.write("DPU_FEATURE_MODE_CFG", OUTPUT_MODE=OUTPUT_TO_MEMORY, CONV_MODE=mode, BURST_LEN=BURST_LEN)
    t.write("DPU_DATA_FORMAT", PROC_PRECISION=p.precision, IN_PRECISION=p.precision,
            OUT_PRECISION=outf.precision)
    t.write("DPU_OFFSET_PEND")
    t.write_addr("DPU_DST_BASE_ADDR", out.buffer, out.offset)
    # bytes between output channel groups (16-byte field unit): the whole output cube's, so a
    # tile writes its surfaces in place [conf 02: tiles at their offsets]
    t.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=g.dst_surf_stride // 16)
    t.write("DPU_DATA_CUBE_WIDTH", WIDTH=g.out_w - 1)
    t.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=g.out_h - 1)
    t.write("DPU_DATA_CUBE_NOTCH_ADDR")
    t.write("DPU_DATA_CUBE_CHANNEL", CHANNEL=g.out_c - 1, ORIG_CHANNEL=g.out_c - 1)
    if rq is None:
        t.write("DPU_BS_CFG", BS_BYPASS=1, BS_ALU_BYPASS=1, BS_MUL_BYPASS=1, BS_RELU_BYPASS=1)
    else:
        # per-channel int32 vector (bias and zero-point fold) added by the BS ALU from BRDMA
        # ([dw] "DPU_BS_CFG = BS_ALU_ALGO(2)|BS_ALU_SRC(1)|RELU/MUL bypass")
        t.write("DPU_BS_CFG", BS_ALU_ALGO=2, BS_ALU_SRC=1, BS_RELU_BYPASS=1, BS_MUL_BYPASS=1)
    t.write("DPU_BS_ALU_CFG")
    t.write("DPU_BS_MUL_CFG")
    t.write("DPU_BS_RELUX_CMP_VALUE")
    # write-out element geometry [size-e]; depthwise: size_e 3 with OD_BYPASS clear [dw]
    # requant: CPEND on (OD_BYPASS = 0), OW_OP = -weight zero point (tests/sim/test_int8_requant)
    t.write("DPU_BS_OW_CFG", OD_BYPASS=int(not dw and rq is None), SIZE_E_0=size_e,
            SIZE_E_1=size_e, SIZE_E_2=size_e)
    if rq is not None:
        t.write("DPU_BS_OW_OP", OW_OP=rq.ow_op & 0xFFFF)
    else:
        t.write("DPU_BS_OW_OP", OW_OP=DW_OW_OP_BASE if dw else 0)
    t.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=g.out_c - 1)
    t.write("DPU_WDMA_SIZE_1", WIDTH_WDMA=g.out_w - 1, HEIGHT_WDMA=g.out_h - 1)
    t.write("DPU_BN_CFG", BN_BYPASS=1, BN_ALU_BYPASS=1, BN_MUL_BYPASS=1, BN_RELU_BYPASS=1)
    t.write("DPU_BN_ALU_CFG")
    t.write("DPU_BN_MUL_CFG")
    t.write("DPU_BN_RELUX_CMP_VALUE")
    if ew_operand is None:
        t.write("DPU_EW_CFG", EW_BYPASS=1, EW_OP_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_CVT_BYPASS=1,
                EW_RELU_BYPASS=1)
    else:
        # per-pixel add of the previous partial read by ERDMA; the operand converter runs at
        # identity (scale 1 below) [kacc][conf 02: 0x108202c0 for 16-bit]
        t.write("DPU_EW_CFG", EW_OP_SRC=1, EW_LUT_BYPASS=1, EW_RELU_BYPASS=1,
                EW_ALU_ALGO=EW_ALU_SUM, EDATA_SIZE=EW_DATA_SIZE[g.ew_esize],
                EW_DATA_MODE=EW_PER_PIXEL)
    t.write("DPU_EW_CVT_OFFSET_VALUE")
    t.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)             # identity
    t.write("DPU_EW_RELUX_CMP_VALUE")
    # output converter: identity, narrowing fp32 -> fp16 for an fp16 result [tile]
    if rq is None:
        t.write("DPU_OUT_CVT_OFFSET")
        t.write("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1, FP32TOFP16_EN=int(outf.fp32_to_fp16))
        t.write("DPU_OUT_CVT_SHIFT")
    else:
        # out = sat8(round((x * SCALE) >> SHIFT) + OFFSET) (out-cvt-converter.md)
        t.write("DPU_OUT_CVT_OFFSET", OUT_CVT_OFFSET=rq.offset & 0xFFFFFFFF)
        t.write("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=rq.scale & 0xFFFF)
        t.write("DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=rq.shift, CVT_ROUND=int(rq.round_away))
    for i in range(8):
        t.write(f"DPU_EW_OP_VALUE_{i}")
    # SURF_ADD = destination surface stride (16-byte units) x surf_mult: OW*OH*surf_mult for a
    # dense cube [conf 01/04/09][size-e][dw], and tied to DST_SURF_STRIDE by depthwise-conv.md's
    # int8 writer ("SURF_ADD = dst_surf_stride*4"); using the strided value for a tile written
    # into a larger cube is our inference (no foreign program writes a strided tile)
    t.write("DPU_SURFACE_ADD", SURF_ADD=(g.dst_surf_stride // 16) * surf_mult)
    t.write("DPU_UNDOC_40C4")
    # LUT unused: clear its registers so no earlier task's table setup carries over [task]
    for reg in ("ACCESS_CFG", "ACCESS_DATA", "CFG", "INFO", "LE_START", "LE_END", "LO_START",
                "LO_END", "LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
        t.write(f"DPU_LUT_{reg}")

    # ---- DPU_RDMA: programmed every task; MRDMA disabled unless it combines an operand ------
    t.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=g.out_w - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=g.out_h - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=g.out_c - 1)
    if ew_operand is None:
        t.write("DPU_RDMA_RDMA_SRC_BASE_ADDR")
    else:
        t.write_addr("DPU_RDMA_RDMA_SRC_BASE_ADDR", ew_operand.buffer, ew_operand.offset)
    if bias is None:
        t.write("DPU_RDMA_RDMA_BRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
    else:
        t.write("DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)          # the int32 [C] vector
        t.write_addr("DPU_RDMA_RDMA_BS_BASE_ADDR", bias.buffer, bias.offset)
    t.write("DPU_RDMA_RDMA_NRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
    if ew_operand is None:
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)          # no element-wise operand
        t.write("DPU_RDMA_RDMA_EW_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE")
        # fp16 programs also set the (unused) MRDMA fp16->fp32 widening; int8 ones clear it
        # [conf 01/03/04/09]; depthwise repeats its conv mode here [conf 09]
        t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", CONV_MODE=mode, MRDMA_DISABLE=1,
                BURST_LEN=BURST_LEN, MRDMA_FP16TOFP32_EN=int(g.in_dtype == DType.F16))
        notch = 0
    else:
        # the operand's planar advance: MAX(positions, 12) atoms [kacc]; EW_BASE one surface past
        # SRC_BASE, the hardware-verified transport [kacc][conf 02]
        notch = max(g.positions, profile.ew_min_positions)
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=EW_PER_PIXEL,
                ERDMA_DATA_SIZE=EW_DATA_SIZE[g.ew_esize])
        t.write_addr("DPU_RDMA_RDMA_EW_BASE_ADDR", ew_operand.buffer,
                     ew_operand.offset + 16 * g.positions)
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=notch)
        t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", COMB_USE=COMB_CONV_PLUS_ERDMA,
                PROC_PRECISION=p.precision, IN_PRECISION=p.precision, BURST_LEN=BURST_LEN)
    t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
    t.write("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=notch)
    t.write("DPU_RDMA_RDMA_PAD_CFG")
    t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)  # [mesa]
    t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=notch)

    # DMA footprint: the feature's channel groups (rows x width atoms each, at the cube's
    # pitches), the weights, the EW partial (a dense cube of the output geometry) and the
    # output's channel groups at the destination surface stride
    atom = profile.atom_bytes
    g_in = -(-g.in_c // p.feature_c2)
    t.reads(feature, g.in_h * g.line_pitch, g_in, g.surf_pitch)
    t.reads(weight, wbytes)
    g_out = -(-g.out_c // outf.c2)
    if ew_operand is not None:
        # the partial's own atoms: an fp32 partial holds half the channels per atom
        t.reads(ew_operand, -(-g.out_c // (atom // g.ew_esize)) * g.positions * atom)
    if bias is not None:
        t.reads(bias, 4 * g.out_c)
    t.writes(out, g.positions * atom, g_out, g.dst_surf_stride)
    if not p.chainable:
        t.refuse_chaining(
            f"{g.in_dtype.value} uses the integer accumulator, which clears per kick, not per "
            f"task, so chained integer tasks after the first compute garbage "
            f"(notes: encodings/regcmd-task-model.md)")
    return t.finish()


# ---------------------------------------------------------------------------------------------
# a tile plan -> jobs
# ---------------------------------------------------------------------------------------------

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
class TiledJob:
    kicks: list[list[TaskProgram]]
    reads: set[str]
    writes: set[str]


@dataclass
class TiledTasks:
    """The jobs of one plan: per job, its kicks (each a list of tasks) and the buffers it uses."""

    jobs: list[TiledJob] = field(default_factory=list)
    planned: int = 0   # tasks of the plans appended so far (checked against the compile bound)


def build_tiled(plan: ConvPlan, profile: ChipProfile, *, feature: CubeRef, weight_buffer: str,
                weight_offset: Callable[[int, int], int], out: CubeRef, scratch: Scratch,
                host_partials: tuple[str, int] | None, name: str, into: TiledTasks,
                requant: ConvRequant | None = None, bias_buffer: str | None = None) -> None:
    """Append one image's jobs for ``plan`` to ``into``: one job per (row tile, output-channel
    tile), its K steps in order. fp16 K steps are self-chained into one kick (the PC honours the
    in-kick read-after-write of a partial, regcmd-task-model.md "in-kick data dependency");
    integer K steps are separate kicks (the CACC clears per kick) and their partials go to
    ``host_partials`` = (buffer, stride between K steps) for a host add.

    ``weight_offset(j, ki)``: byte offset of the weight tile for kernel tile j, K step ki.
    """
    s = plan.shape
    p = profile.input(s.in_dtype)
    outf = profile.output(s.in_dtype, s.out_dtype)
    c2_in = p.feature_c2
    nk = plan.k_steps
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
    for r in plan.rows:
        for j, ks in enumerate(plan.kernels):
            steps = [plan.kernels[j]] if s.depthwise else list(plan.channels)
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
            tasks: list[TaskProgram] = []
            reads, writes = {feature.buffer, weight_buffer}, set()
            prev: Reloc | None = None
            for ki, cs in enumerate(steps):
                last = ki == nk - 1
                out_dtype = s.out_dtype
                if plan.kacc == KACC_DPU:
                    # the final step lands in the output; earlier ones alternate backwards from it
                    dst = Reloc(out.buffer, final_off) if last else slots[(nk - 1 - ki) % 2]
                    dsurf = out.surf_pitch if last else part_surf
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
                    requant=requant)
                feat = Reloc(feature.buffer, feature.offset + (cs.start // c2_in) * feature.surf_pitch
                             + r.in_row * feature.line_pitch)
                wt = Reloc(weight_buffer, weight_offset(j, ki))
                tname = f"{name}.r{r.out_row}.n{ks.start}.k{cs.start}"
                # the requant vector of this kernel tile: int32 per output channel
                bias = None if bias_buffer is None else Reloc(bias_buffer, 4 * ks.start)
                tasks.append(emit_conv_task(g, profile, feat, wt, dst,
                                            ew_operand=prev if g.ew_esize else None, name=tname,
                                            bias=bias))
                if bias is not None:
                    reads.add(bias.buffer)
                writes.add(dst.buffer)
                prev = dst
            # a buffer written inside the job is listed as written only: the intra-kick read of
            # a partial is device-internal, and a BO in both the in- and out-list makes the
            # kernel complete the job without running it (regcmd-task-model.md, "Two traps")
            kicks = [tasks] if p.chainable else [[t] for t in tasks]
            into.jobs.append(TiledJob(kicks, reads - writes, writes))


def assemble(profile: ChipProfile, tiled: TiledTasks, buffers: list[BufferSpec],
             host_steps: Sequence[HostStep], macs: int, integer: bool,
             regcmd: str = "regcmd") -> OpProgram:
    """Lay every kick out in the op's regcmd buffer and wrap everything in an OpProgram."""
    jobs, pos = [], 0
    for job in tiled.jobs:
        kicks: list[Kick] = []
        for tasks in job.kicks:
            pos = round_up(pos, profile.regcmd_align_bytes)
            k = link(tasks, profile, regcmd, pos)
            kicks.append(k)
            pos += k.nbytes
        jobs.append(NpuJob(tuple(kicks), reads=tuple(sorted(job.reads)),
                           writes=tuple(sorted(job.writes)), integer=integer))
    bufs = list(buffers) + [BufferSpec(regcmd, "regcmd", round_up(max(pos, 8), 64))]
    steps: list = [NpuStep(tuple(jobs))]
    steps.extend(host_steps)
    return OpProgram(tuple(bufs), tuple(steps), macs=macs)


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


# ---------------------------------------------------------------------------------------------
# conv2d / depthwise / conv1d
# ---------------------------------------------------------------------------------------------

_SUPPORTED = {(DType.F16, DType.F16), (DType.F16, DType.F32), (DType.I8, DType.I32)}


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D convolution, NCHW / OIHW (the IR's conv operand order)."""

    batch: int
    in_c: int
    height: int
    width: int
    out_c: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))   # (top, bottom), (left, right)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def out_h(self) -> int:
        (pt, pb), _ = self.padding
        return (self.height + pt + pb - (self.kh - 1) * self.dilation[0] - 1) // self.stride[0] + 1

    @property
    def out_w(self) -> int:
        _, (pl, pr) = self.padding
        return (self.width + pl + pr - (self.kw - 1) * self.dilation[1] - 1) // self.stride[1] + 1

    @property
    def depthwise(self) -> bool:
        return self.groups > 1

    def macs(self) -> int:
        per = self.kh * self.kw * (1 if self.depthwise else self.in_c)
        return self.batch * self.out_h * self.out_w * self.out_c * per


def _validate(spec: ConvSpec, in_dtype: DType, out_dtype: DType) -> None:
    if (in_dtype, out_dtype) not in _SUPPORTED:
        ok = ", ".join(f"{i.value}->{o.value}" for i, o in sorted(_SUPPORTED, key=str))
        raise LoweringError(f"conv {in_dtype.value} -> {out_dtype.value} is not supported; "
                            f"supported: {ok}")
    if min(spec.batch, spec.in_c, spec.height, spec.width, spec.out_c, spec.kh, spec.kw) < 1:
        raise LoweringError(f"conv dimensions must be >= 1: {spec}")
    if min(*spec.stride, *spec.dilation) < 1 or min(x for pr in spec.padding for x in pr) < 0:
        raise LoweringError(f"strides/dilations must be >= 1 and padding >= 0: {spec}")
    if spec.groups != 1 and not (spec.groups == spec.in_c == spec.out_c):
        raise LoweringError(
            f"grouped conv with {spec.groups} groups of {spec.in_c} -> {spec.out_c} channels: only "
            f"groups=1 (direct) and groups=in=out channels (depthwise) map to the CNA; split a "
            f"general grouped conv into per-group convs first")
    if spec.out_h < 1 or spec.out_w < 1:
        raise LoweringError(f"conv output would be empty ({spec.out_h}x{spec.out_w}): {spec}")


@dataclass(frozen=True)
class ConvLayouts:
    input: CubeLayout
    output: CubeLayout
    in_stride: int    # bytes between batch images in the input buffer
    out_stride: int


def conv_layouts(spec: ConvSpec, in_dtype: DType, out_dtype: DType,
                 profile: ChipProfile) -> ConvLayouts:
    """The input and output cubes a direct/depthwise conv reads and writes (per image)."""
    p = profile.input(in_dtype)
    o = profile.output(in_dtype, out_dtype)
    c_pad = round_up(spec.in_c, p.dw_group if spec.depthwise else p.k_align)
    oc_pad = c_pad if spec.depthwise else round_up(spec.out_c, p.n_align)
    # zero rows below a too-short input act as bottom padding (pad value 0)
    h = max(spec.height, profile.min_feature_rows)
    lin = CubeLayout(h, spec.width, c_pad, p.feature_c2, in_dtype.to_numpy())
    lout = CubeLayout(spec.out_h, spec.out_w, oc_pad, o.c2, out_dtype.to_numpy())
    return ConvLayouts(lin, lout, round_up(lin.nbytes, 64), round_up(lout.nbytes, 64))


def conv_shape(spec: ConvSpec, in_dtype: DType, out_dtype: DType, profile: ChipProfile) -> ConvShape:
    lay = conv_layouts(spec, in_dtype, out_dtype, profile)
    (pt, _), (pl, _) = spec.padding
    return ConvShape(in_dtype, out_dtype, spec.depthwise, lay.input.height, spec.width,
                     lay.input.channels, lay.output.channels, spec.kh, spec.kw, spec.stride[0],
                     spec.stride[1], spec.dilation[0], spec.dilation[1], pt, pl, spec.out_h,
                     spec.out_w)


def pack_conv_weights(plan: ConvPlan, profile: ChipProfile, w: np.ndarray) -> tuple[np.ndarray, Callable[[int, int], int]]:
    """Weights OIHW (direct) or [C, 1, KH, KW] / [C, KH, KW] (depthwise) -> tile-major bytes.

    Each (kernel tile, K step) block is one contiguous weight layout; with a single K step this is
    exactly the plain layout (its kernel groups are already tile-contiguous)."""
    s = plan.shape
    dt = s.in_dtype.to_numpy()
    w = np.asarray(w)
    if w.dtype != dt:
        raise LoweringError(f"conv weights must be {dt} (got {w.dtype}); cast before lowering")
    if s.depthwise:
        w = w.reshape(w.shape[0], s.kh, s.kw)
        wp = np.zeros((s.channels, s.kh, s.kw), dt)
        wp[:w.shape[0]] = w
        lay = depthwise_weight_layout(profile, s.in_dtype, s.channels, s.kh, s.kw)
        esize = dt.itemsize
        return lay.pack(wp), lambda j, ki: plan.kernels[j].start * s.kh * s.kw * esize
    oc, ic = w.shape[0], w.shape[1]
    wp = np.zeros((s.kernels, s.channels, s.kh, s.kw), dt)
    wp[:oc, :ic] = w.reshape(oc, ic, s.kh, s.kw)
    blobs, offsets, pos = [], {}, 0
    for j, ks in enumerate(plan.kernels):
        for ki, cs in enumerate(plan.channels):
            lay = weight_layout(profile, s.in_dtype, ks.size, cs.size, s.kh, s.kw)
            blob = lay.pack(np.ascontiguousarray(wp[ks.start:ks.start + ks.size, cs.start:cs.start + cs.size]))
            offsets[(j, ki)] = pos
            blobs.append(blob)
            pos += blob.size
    return np.concatenate(blobs), lambda j, ki: offsets[(j, ki)]


def lower_conv2d(spec: ConvSpec, in_dtype: DType, out_dtype: DType, profile: ChipProfile,
                 weights: np.ndarray, *, name: str = "conv", patchify: str = "auto",
                 max_rows: int | None = None, max_kernels: int | None = None,
                 max_channels: int | None = None) -> OpProgram:
    """A conv2d with constant weights -> OpProgram.

    Buffers: "x" input (bind 0, per-image cube ``conv_layouts(...).input``, images
    ``in_stride`` apart; shape NCHW), "w" const (prepacked), "y" output (bind 0, cube per image,
    ``out_stride`` apart; shape NCHW with the real channel count), "kacc"/"kpart" scratch when K
    is split, "regcmd". A non-overlapping patchify may instead lower to an im2col host step + a
    matmul (``choose_patchify``; ``patchify`` = "auto" | "direct" | "im2col"), and under "auto"
    so does any ungrouped conv the direct form cannot run (a stride past CONV_X/Y_STRIDE, or no
    direct tiling).
    """
    _validate(spec, in_dtype, out_dtype)
    route = choose_patchify(spec, in_dtype, profile) if patchify == "auto" else patchify
    if route == "im2col":
        return lower_patchify_im2col(spec, in_dtype, out_dtype, profile, weights, name=name)
    if route != "direct":
        raise LoweringError(f"patchify must be 'auto', 'direct' or 'im2col', got {patchify!r}")
    top = field_limit("CNA_CONV_CON3", "CONV_X_STRIDE", profile.encoding)
    if max(spec.stride) > top:
        raise LoweringError(
            f"stride {spec.stride} of a {'depthwise' if spec.depthwise else 'direct'} conv is past "
            f"CNA_CONV_CON3.CONV_X_STRIDE/CONV_Y_STRIDE (1..{top}), and only an ungrouped conv has "
            f"the im2col + matmul form that takes any stride: use strides <= {top}, or a stride "
            f"dividing it followed by a strided slice (y[..., ::s])")
    shape = conv_shape(spec, in_dtype, out_dtype, profile)
    try:
        plan = plan_conv(shape, profile, max_rows=max_rows, max_kernels=max_kernels,
                         max_channels=max_channels)
    except LoweringError:
        if patchify != "auto" or spec.groups != 1:
            raise
        # no direct form for this geometry (a register field, a too-wide input, no CBUF
        # tile): the im2col + matmul route takes any ungrouped conv
        return lower_patchify_im2col(spec, in_dtype, out_dtype, profile, weights, name=name)
    lay = conv_layouts(spec, in_dtype, out_dtype, profile)
    want = (spec.out_c, 1 if spec.depthwise else spec.in_c, spec.kh, spec.kw)
    if tuple(np.shape(weights)) != want:
        raise LoweringError(f"conv weights must have shape {want} (OIHW), got {np.shape(weights)}")
    wbytes, woff = pack_conv_weights(plan, profile, np.asarray(weights))
    return _conv_program(spec, plan, profile, lay, wbytes, woff, name)


def _conv_program(spec: ConvSpec, plan: ConvPlan, profile: ChipProfile, lay: ConvLayouts,
                  wbytes: np.ndarray, woff: Callable[[int, int], int], name: str) -> OpProgram:
    s = plan.shape
    tiled = TiledTasks()
    scratch = Scratch("kacc")
    out_total = lay.out_stride * spec.batch
    host = ("kpart", out_total) if plan.kacc == KACC_HOST else None
    for b in range(spec.batch):
        feat = CubeRef("x", b * lay.in_stride, lay.input.line_stride, lay.input.surf_stride)
        out = CubeRef("y", b * lay.out_stride, lay.output.line_stride, lay.output.surf_stride)
        build_tiled(plan, profile, feature=feat, weight_buffer="w", weight_offset=woff, out=out,
                    scratch=scratch, host_partials=host, name=f"{name}.b{b}", into=tiled)
    buffers = [
        BufferSpec("x", "input", lay.in_stride * spec.batch, lay.input, s.in_dtype.value,
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0),
        BufferSpec("w", "const", int(wbytes.size), None, s.in_dtype.value, None, data=wbytes),
        BufferSpec("y", "output", out_total, lay.output, s.out_dtype.value,
                   (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0),
    ]
    steps: list[HostStep] = []
    if plan.kacc == KACC_DPU:
        buffers.append(BufferSpec("kacc", "scratch", max(scratch.nbytes, 64)))
    if plan.kacc == KACC_HOST:
        buffers.append(BufferSpec("kpart", "scratch", out_total * (plan.k_steps - 1)))
        hs, descs = host_partial_sum("y", "kpart", out_total, plan.k_steps)
        steps.extend(hs)
        buffers.extend(descs)
    return assemble(profile, tiled, buffers, steps, spec.macs(), integer=s.in_dtype.is_int)


def lower_qconv2d(spec: ConvSpec, profile: ChipProfile, weights: np.ndarray, vector: np.ndarray,
                  requant: ConvRequant, *, name: str = "qconv", max_rows: int | None = None,
                  max_kernels: int | None = None, max_channels: int | None = None) -> OpProgram:
    """An int8 -> int8 conv2d / depthwise with on-chip requantization (``ConvRequant``).

    ``vector``: the int32 per-output-channel operand the BS ALU adds (rockjit.quant folds the
    bias, the zero-point cross term and its range offset into it). Buffers as lower_conv2d
    ("x" int8 cube in, "y" int8 cube out, "w" packed weights) plus the const "bias" vector.
    The requant is one pass over the whole accumulator, so the input channels must fit one K
    step (an integer K split sums int32 partials on the host, after which no on-chip requant
    is left); a split is refused, naming the limit."""
    _validate(spec, DType.I8, DType.I32)
    if spec.height < profile.min_feature_rows:
        raise LoweringError(
            f"quantized conv input height {spec.height} < {profile.min_feature_rows}: the cube is "
            f"padded with zero rows below the image, which would read as 0 instead of the input "
            f"zero point {requant.pad_value}; pad the image to {profile.min_feature_rows} rows "
            f"with the zero point first")
    shape = conv_shape(spec, DType.I8, DType.I8, profile)
    plan = plan_conv(shape, profile, max_rows=max_rows, max_kernels=max_kernels,
                     max_channels=max_channels)
    if plan.k_steps != 1:
        raise LoweringError(
            f"quantized conv {spec.in_c} input channels x {spec.kh}x{spec.kw} need {plan.k_steps} "
            f"K steps in CBUF; the on-chip requant needs the whole sum in one pass. Split the "
            f"input channels into convs that fit (or run this conv as int8 -> int32 and "
            f"requantize on the host)")
    lay = conv_layouts(spec, DType.I8, DType.I8, profile)
    want = (spec.out_c, 1 if spec.depthwise else spec.in_c, spec.kh, spec.kw)
    if tuple(np.shape(weights)) != want:
        raise LoweringError(f"conv weights must have shape {want} (OIHW), got {np.shape(weights)}")
    wbytes, woff = pack_conv_weights(plan, profile, np.asarray(weights))
    vec = np.zeros(lay.output.channels, "<i4")
    vec[:spec.out_c] = np.asarray(vector, np.int64)
    tiled = TiledTasks()
    for b in range(spec.batch):
        feat = CubeRef("x", b * lay.in_stride, lay.input.line_stride, lay.input.surf_stride)
        out = CubeRef("y", b * lay.out_stride, lay.output.line_stride, lay.output.surf_stride)
        build_tiled(plan, profile, feature=feat, weight_buffer="w", weight_offset=woff, out=out,
                    scratch=Scratch("kacc"), host_partials=None, name=f"{name}.b{b}", into=tiled,
                    requant=requant, bias_buffer="bias")
    vb = vec.view(np.uint8)
    buffers = [
        BufferSpec("x", "input", lay.in_stride * spec.batch, lay.input, "i8",
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0),
        BufferSpec("w", "const", int(wbytes.size), None, "i8", None, data=wbytes),
        BufferSpec("bias", "const", int(vb.size), None, "i32", None, data=vb),
        BufferSpec("y", "output", lay.out_stride * spec.batch, lay.output, "i8",
                   (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0),
    ]
    return assemble(profile, tiled, buffers, [], spec.macs(), integer=True)


def lower_conv1d(batch: int, in_c: int, length: int, out_c: int, k: int, in_dtype: DType,
                 out_dtype: DType, profile: ChipProfile, weights: np.ndarray, *, stride: int = 1,
                 padding: tuple[int, int] = (0, 0), dilation: int = 1, groups: int = 1,
                 name: str = "conv1d", **overrides: int) -> OpProgram:
    """conv1d NCW / OIK with time on the height axis (width 1): whisper-encoder.md, "the
    width-on-time layout overflows the feature banks; time on HEIGHT tiles by output rows".
    Buffers as lower_conv2d with cubes H = time, W = 1 (shape NCHW with W = 1)."""
    spec = ConvSpec(batch, in_c, length, 1, out_c, k, 1, (stride, 1), (tuple(padding), (0, 0)),
                    (dilation, 1), groups)
    w = np.asarray(weights)
    want = (out_c, 1 if groups > 1 else in_c, k)
    if w.shape != want:
        raise LoweringError(f"conv1d weights must have shape {want} (OIK), got {w.shape}")
    return lower_conv2d(spec, in_dtype, out_dtype, profile, w.reshape(*want, 1), name=name,
                        patchify="direct", **overrides)


# ---------------------------------------------------------------------------------------------
# patchify: im2col on the host + a matmul
# ---------------------------------------------------------------------------------------------

def is_patchify(spec: ConvSpec) -> bool:
    (pt, pb), (pl, pr) = spec.padding
    return (spec.stride == (spec.kh, spec.kw) and spec.dilation == (1, 1) and spec.groups == 1
            and pt == pb == pl == pr == 0 and spec.height % spec.kh == 0
            and spec.width % spec.kw == 0)


def choose_patchify(spec: ConvSpec, in_dtype: DType, profile: ChipProfile) -> str:
    """The cost rule for a non-overlapping patchify (stride == kernel, no padding/dilation).

    Both routes read every input byte exactly once (the patches do not overlap, so im2col copies
    each byte once, like the host pack the input needs anyway) and do the same useful MACs. They
    differ in padding waste: the direct conv pads the *input channels* to K's atom before the
    kernel taps multiply them (round_up(C, k_align) * KH * KW MACs per output), im2col pads the
    flattened patch once (round_up(C * KH * KW, k_align)). im2col + matmul is chosen when it
    does strictly less MAC work (e.g. SigLIP 3x16x16: 32*256 = 8192 vs 768), or when the direct
    conv cannot run (input wider than one task reads, or a stride past CNA_CONV_CON3's 3-bit
    field); otherwise the direct conv, which needs no host step.
    """
    stride_top = field_limit("CNA_CONV_CON3", "CONV_X_STRIDE", profile.encoding)
    if not is_patchify(spec):
        # a stride past the 3-bit field has no direct form; im2col gathers only the windows
        # the stride visits (each input byte at most KH*KW / (SY*SX) < 1 + KH*KW/8 times)
        if spec.groups == 1 and max(spec.stride) > stride_top:
            return "im2col"
        return "direct"
    p = profile.input(in_dtype)
    direct = round_up(spec.in_c, p.k_align) * spec.kh * spec.kw
    im2col = round_up(spec.in_c * spec.kh * spec.kw, p.k_align)
    if im2col < direct or spec.width > profile.max_feature_cols or max(spec.stride) > stride_top:
        return "im2col"
    return "direct"


def lower_patchify_im2col(spec: ConvSpec, in_dtype: DType, out_dtype: DType,
                          profile: ChipProfile, weights: np.ndarray, *,
                          name: str = "patchify") -> OpProgram:
    """im2col on the host (row-major NCHW input -> the matmul's A cube) + a matmul per image.

    The im2col is a pure strided copy of the generic host-op library (``im2col_steps_for``):
    A[oy*OW + ox, (c*KH + ky)*KW + kx] = x[c, oy*SY + ky*DY, ox*SX + kx*DX] (the order of a
    reshaped [OC, C*KH*KW] weight, notes: encodings/siglip-encoder.md); "a" is zero-filled
    scratch so the cube's padding rows/channels read as zero. Any ungrouped conv has this form
    (used for a non-overlapping patchify, and for a stride past CONV_X/Y_STRIDE's field); a
    padded one is first copied into the interior of a zero-filled "xpad" scratch image.
    The output "y" is the matmul's cube per image, H = OH*OW rows (padded), W = 1 -- byte-
    identical to the conv's [OC/C2][OH][OW][C2] cube whenever OH*OW is a multiple of 4.
    """
    from .matmul import lower_matmul  # matmul builds on this module

    if spec.groups != 1:
        raise LoweringError(f"im2col lowering needs an ungrouped conv (groups=1): {spec}")
    w = np.asarray(weights)
    if w.shape != (spec.out_c, spec.in_c, spec.kh, spec.kw):
        raise LoweringError(f"conv weights must have shape {(spec.out_c, spec.in_c, spec.kh, spec.kw)}"
                            f" (OIHW), got {w.shape}")
    m = spec.out_h * spec.out_w
    kk = spec.in_c * spec.kh * spec.kw
    mm = lower_matmul(m, kk, spec.out_c, in_dtype, out_dtype, profile, batch=spec.batch,
                      b=w.reshape(spec.out_c, kk), name=name)
    a = mm.buffer("a")
    p = profile.input(in_dtype)
    xbytes = spec.batch * spec.in_c * spec.height * spec.width * p.esize
    x = BufferSpec("x", "input", xbytes, None, in_dtype.value,
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0)
    a_scratch = BufferSpec("a", "scratch", a.nbytes, a.layout, a.dtype, a.shape, zero=True)
    pad_steps, pad_bufs, src, src_bytes = _pad_steps(spec, in_dtype, xbytes)
    im2col_steps, extra = im2col_steps_for(spec, in_dtype, a.layout, a.nbytes // spec.batch,
                                           src, "a", src_bytes, a.nbytes)
    im2col_steps = pad_steps + im2col_steps
    extra = pad_bufs + extra
    y = mm.buffer("c")
    y_out = BufferSpec("y", "output", y.nbytes, y.layout, y.dtype,
                       (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0)
    rename = {"c": "y"}
    bufs = [x, a_scratch, y_out] + extra + [b for b in mm.buffers if b.name not in ("a", "c")]
    steps = im2col_steps + [_rename_step(st, rename) for st in mm.steps]
    return OpProgram(tuple(bufs), tuple(steps), macs=mm.macs)


def _pad_steps(spec: ConvSpec, dtype: DType, xbytes: int
               ) -> tuple[list[HostStep], list[BufferSpec], str, int]:
    """(steps, buffers, im2col source, its bytes): a padded conv's input copied into the
    interior of a zero-filled scratch image "xpad" (NCHW, padded H and W), so the im2col reads
    the zeros of the padding like any other pixel; an unpadded one reads "x" itself."""
    from ..host_rules import HostView, host_op_step

    (pt, pb), (pl, pr) = spec.padding
    if not (pt or pb or pl or pr):
        return [], [], "x", xbytes
    es = np.dtype(dtype.to_numpy()).itemsize
    b, c, h, w = spec.batch, spec.in_c, spec.height, spec.width
    hp, wp = h + pt + pb, w + pl + pr
    nbytes = b * c * hp * wp * es
    sizes = {"x": xbytes, "xpad": nbytes, "pad_desc": 0}
    dview = HostView("xpad", dtype, pt * wp + pl, (c * hp * wp, hp * wp, wp, 1))
    sview = HostView("x", dtype, 0, (c * h * w, h * w, w, 1))
    st, desc = host_op_step("copy", (b, c, h, w), dview, [sview], sizes, "pad_desc",
                            what="conv padding copy")
    xpad = BufferSpec("xpad", "scratch", nbytes, None, dtype.value, (b, c, hp, wp), zero=True)
    return [st], [xpad, desc], "xpad", nbytes


def im2col_steps_for(spec: ConvSpec, dtype: DType, lay: CubeLayout, image_stride: int, src: str,
                     dst: str, src_bytes: int, dst_bytes: int
                     ) -> tuple[list[HostStep], list[BufferSpec]]:
    """The im2col as host-op copies into the A cube ``lay`` (per image ``image_stride`` bytes
    apart) from ``src``, the NCHW image with the conv's padding already in it. Window (oy, ox)
    tap (ky, kx) reads pixel (oy*SY + ky*DY, ox*SX + kx*DX): strides affine in every index, so
    a strided view. Cube element (m, k) sits at (k // C2) * surf + m * line + k % C2
    (layouts.py); when KW is a whole number of C2 atoms, kx splits into (kx // C2, kx % C2)
    and the whole im2col is one rank-7 strided copy (batch, oy, ox, c, ky, kx_hi, kx_lo).
    Otherwise a copy makes row-major patches [M, K] (scratch) and pack_cube steps pack them
    per image."""
    from ..host_rules import HostView, host_op_step

    es = np.dtype(lay.dtype).itemsize
    c2 = lay.c2
    line, surf, img = lay.line_stride // es, lay.surf_stride // es, image_stride // es
    (pt, pb), (pl, pr) = spec.padding
    b, c, kh, kw = spec.batch, spec.in_c, spec.kh, spec.kw
    h, w = spec.height + pt + pb, spec.width + pl + pr
    (sy, sx), (dy, dx) = spec.stride, spec.dilation
    oh, ow = spec.out_h, spec.out_w
    sizes = {src: src_bytes, dst: dst_bytes, "im2col_desc": 0}
    if kw % c2 == 0:
        shape = (b, oh, ow, c, kh, kw // c2, c2)
        dview = HostView(dst, dtype, 0, (img, ow * line, line, kh * (kw // c2) * surf,
                                         (kw // c2) * surf, surf, 1))
        sview = HostView(src, dtype, 0, (c * h * w, sy * w, sx, h * w, dy * w, c2 * dx, dx))
        st, desc = host_op_step("copy", shape, dview, [sview], sizes, "im2col_desc",
                                what="im2col copy")
        return [st], [desc]
    m, k = oh * ow, c * kh * kw
    sizes["patches"] = b * m * k * es
    shape = (b, oh, ow, c, kh, kw)
    dview = HostView("patches", dtype, 0, (m * k, ow * k, k, kh * kw, kw, 1))
    sview = HostView(src, dtype, 0, (c * h * w, sy * w, sx, h * w, dy * w, dx))
    st, desc = host_op_step("copy", shape, dview, [sview], sizes, "im2col_desc",
                            what="im2col copy")
    steps = [st]
    for i in range(b):
        steps.append(HostStep("pack_cube", {"src": Slice("patches", i * m * k * es, m * k * es),
                                            "dst": Slice(dst, i * image_stride, lay.nbytes)},
                              {"height": m, "width": 1, "channels": k, "c2": c2, "esize": es,
                               "line_stride": lay.line_stride, "surf_stride": lay.surf_stride}))
    return steps, [desc, BufferSpec("patches", "scratch", sizes["patches"])]


def _rename_step(step, rename: dict[str, str]):
    """A matmul's steps with its output buffer renamed (relocations included)."""
    if isinstance(step, HostStep):
        ops = {k: Slice(rename.get(v.buffer, v.buffer), v.offset, v.nbytes)
               for k, v in step.operands.items()}
        return HostStep(step.kind, ops, step.params)
    jobs = []
    for job in step.jobs:
        kicks = []
        for k in job.kicks:
            rel = {i: Reloc(rename.get(r.buffer, r.buffer), r.offset) for i, r in k.relocs.items()}
            ren = [Access(rename.get(a.buffer, a.buffer), a.offset, a.extent, a.nbytes,
                          a.pieces, a.pitch) for a in k.reads + k.writes]
            kicks.append(Kick(k.regcmd_buffer, k.base_offset, k.words, rel, k.task_offsets,
                              k.task_counts, k.enables, tuple(ren[:len(k.reads)]),
                              tuple(ren[len(k.reads):])))
        jobs.append(NpuJob(tuple(kicks), tuple(rename.get(b, b) for b in job.reads),
                           tuple(rename.get(b, b) for b in job.writes), job.integer))
    return NpuStep(tuple(jobs))
