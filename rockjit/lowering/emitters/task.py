"""The one CNA->CORE->DPU task: a description in, a complete task program out.

Every convolution, matmul (a 1x1 conv, matmul-as-conv.md) and element-wise identity conv is
this task. ``ConvTaskGeom`` says what the CNA and CORE compute; ``DpuStages`` what the DPU does
to the accumulator on its way out -- the BS and BN stages (register or per-channel memory
operands), the EW stage with its ERDMA operand cube, the LUT and the output converter -- each a
parameter with its own branch, the structure of Mesa's rocket task function (rkt_task.c: one
function, a branch per feature). The DPU block is shared with the DPU-only (flying) task of
flying.py through ``write_dpu`` / ``write_dpu_rdma``.

A task's words never depend on its addresses (address words are relocations, regcmd.py), so
``conv_task`` builds each distinct (geometry, stages) once as a ``TaskTemplate`` and binds the
addresses per call: per-word register emission dominated compile time (issue 9).

Register sources (facts; the formulas are ours): [conf] conformance 01-06, 09 programs;
[mesa] Mesa rocket rkt_regcmd.c / rkt_task.c; [mm] matmul-as-conv.md; [dw] depthwise-conv.md;
[kacc] encodings/k-accumulation.md; [tile] encodings/tile-layouts.md; [size-e]
encodings/size-e-quirk.md; [mrdma] encodings/mrdma-trap.md; [task]
encodings/regcmd-task-model.md; [reuse] encodings/cbuf-reuse.md; [lut]
encodings/dpu-lut-activation.md; [rq] encodings/out-cvt-converter.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ...ir.types import DType
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, TaskBuilder, EmittedTask, TaskTemplate, template_of
from ..tiling import CbufSplit, cbuf_split
from .dpu_stages import (BURST_LEN, OUTPUT_TO_MEMORY, EwStage, LutTables, OutCvt, SdpStage,
                         upload_lut)

# CNA/DPU conv mode codes [dw]
CONV_MODE_DIRECT, CONV_MODE_DEPTHWISE = 0, 3
# Depthwise CNA_CONV_CON2.FEATURE_GRAINS = 50 + stride_y + 1, Mesa's empirical constant [dw]
DW_FEATURE_GRAINS_BASE = 50
# Depthwise DPU_BS_OW_OP = 0x80 - weight zero point; our fp16 weights have zero point 0 [dw]
DW_OW_OP_BASE = 0x80
# Depthwise writes with size_e = 3 whatever the output width [dw]
DW_SIZE_E = 3
# EW operand per-pixel mode 1 [kacc]; RDMA COMB_USE 5 combines the conv result with the ERDMA
# stream [kacc][mrdma]
EW_PER_PIXEL, COMB_CONV_PLUS_ERDMA, COMB_FLYING_ERDMA = 1, 5, 4
EW_DATA_SIZE = {2: 2, 4: 3}   # operand element bytes -> EDATA_SIZE / ERDMA_DATA_SIZE code


@dataclass(frozen=True)
class ConvRequant:
    """The int8-output requantizing write-out (Mesa/Teflon's int8 program; facts: [dw] "int8
    depthwise", [rq]). The integer accumulator gets CPEND's ``ow_op`` x the window sum of the
    input (the weight zero point), the per-channel int32 vector read by BRDMA added in the BS
    ALU, then OUT_CVT: round((x * scale) >> shift) (ties away from zero when ``round_away``) +
    ``offset``, saturated to int8. The CNA pads with ``pad_value`` (the input zero point).
    rockjit.quant derives the numbers."""

    pad_value: int            # int8 input zero point, the CNA's pad byte
    ow_op: int                # signed 16: -weight zero point
    scale: int                # OUT_CVT_SCALE, signed 16
    shift: int                # OUT_CVT_SHIFT
    offset: int               # OUT_CVT_OFFSET, signed 32
    round_away: bool = True   # OUT_CVT_SHIFT.CVT_ROUND


@dataclass(frozen=True)
class ConvTaskGeom:
    """What the CNA and CORE of one task compute, besides its addresses."""

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
    # CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL + 1 (None: in_c): channels past it are not real input
    # (Mesa programs the real channel count there; the simulator reads them as 0, an inference)
    real_c: int | None = None
    cbuf: CbufSplit | None = None        # the CBUF partition (None: tiling.cbuf_split)
    # DPU_SURFACE_ADD in 16-byte units (None: dst_surf_stride / 16 x the output's surf_mult)
    surf_add: int | None = None

    @property
    def out_c(self) -> int:
        return self.in_c if self.depthwise else self.kernels

    @property
    def positions(self) -> int:
        return self.out_w * self.out_h


@dataclass(frozen=True)
class DpuStages:
    """The DPU's work on the accumulator, stage by stage (None: the stage bypassed). A BS stage
    with ``alu_src`` 1 reads its per-channel operand through BRDMA (role "bias"); an EW stage
    reads its operand cube (this task's output geometry, dense) through ERDMA (role "ew")."""

    bs: SdpStage | None = None
    bn: SdpStage | None = None
    ew: EwStage | None = None
    lut: LutTables | None = None
    out_cvt: OutCvt = field(default_factory=OutCvt)
    ow_op: int | None = None          # CPEND on (OD_BYPASS 0) with this DPU_BS_OW_OP


def requant_stages(rq: ConvRequant) -> DpuStages:
    """The requantizing writer as stages: the BS ALU adds the BRDMA int32 vector ([dw]
    "DPU_BS_CFG = BS_ALU_ALGO(2)|BS_ALU_SRC(1)|RELU/MUL bypass"), CPEND applies the weight zero
    point, OUT_CVT scales: out = sat8(round((x * SCALE) >> SHIFT) + OFFSET) [rq]."""
    return DpuStages(bs=SdpStage(alu=(2, 0), alu_src=1),
                     out_cvt=OutCvt(offset=rq.offset, scale=rq.scale & 0xFFFF, shift=rq.shift,
                                    round_away=rq.round_away, narrow=False),
                     ow_op=rq.ow_op & 0xFFFF)


def _check(g: ConvTaskGeom, st: DpuStages, profile: ChipProfile, reuse: str) -> None:
    if profile.encoding != "rk3588":
        raise LoweringError(f"the conv emitter writes the RK3588 register encoding; chip "
                            f"{profile.name!r} uses {profile.encoding!r}")
    if reuse not in ("none", "data", "weight"):
        raise LoweringError(f"reuse must be 'none', 'data' or 'weight' (one operand at a time "
                            f"[reuse]), got {reuse!r}")
    rq = g.requant
    if rq is not None and (g.in_dtype, g.out_dtype) != (DType.I8, DType.I8):
        raise LoweringError(f"on-chip requantization is the int8 -> int8 writer; got "
                            f"{g.in_dtype.value} -> {g.out_dtype.value}")
    if g.depthwise and g.in_dtype != DType.F16 and rq is None:
        raise LoweringError(
            f"{g.in_dtype.value} depthwise is not supported: the int32-raw depthwise writer "
            f"lands outputs at twice the stride on hardware and the working int8 depthwise is a "
            f"requantising int8-output mode (notes: depthwise-conv.md); run it in fp16")
    if st.ew is not None and (g.depthwise or g.in_dtype.is_int):
        raise LoweringError("the DPU EW stage exists for the fp16 direct path only ([kacc]: the "
                            "EW ALU is float-only); sum integer partials on the host")
    if g.line_pitch % 16 or g.surf_pitch % 16 or g.surf_pitch // 16 < g.line_pitch // 4:
        raise LoweringError(f"input cube pitches line {g.line_pitch} / surface {g.surf_pitch} B are "
                            f"not whole atoms or the surface is shorter than 4 lines")


def write_dpu(t: TaskBuilder, profile: ChipProfile, st: DpuStages, *, in_dtype: DType,
              out_dtype: DType, flying: bool, mode: int, width: int, height: int,
              channels: int, dst_surf_stride: int, size_e: int, surf_add: int,
              od_bypass: bool) -> None:
    """The DPU register block: write-out geometry, then BS, BN, EW (+LUT), OUT_CVT. The
    destination is role "out". ``flying``: the source is DPU_RDMA's MRDMA stream (no CNA/CORE),
    else the CORE accumulator."""
    p = profile.input(in_dtype)
    outf = profile.output(in_dtype, out_dtype)
    t.write("DPU_FEATURE_MODE_CFG", FLYING_MODE=int(flying), OUTPUT_MODE=OUTPUT_TO_MEMORY,
            CONV_MODE=mode, BURST_LEN=BURST_LEN)
    t.write("DPU_DATA_FORMAT", PROC_PRECISION=p.precision, IN_PRECISION=p.precision,
            OUT_PRECISION=outf.precision)
    t.write("DPU_OFFSET_PEND")
    t.write_addr("DPU_DST_BASE_ADDR", "out")
    # bytes between output channel groups (16-byte field unit): the whole output cube's, so a
    # tile writes its surfaces in place [conf 02: tiles at their offsets]
    t.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=dst_surf_stride // 16)
    t.write("DPU_DATA_CUBE_WIDTH", WIDTH=width - 1)
    t.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.write("DPU_DATA_CUBE_NOTCH_ADDR")
    t.write("DPU_DATA_CUBE_CHANNEL", CHANNEL=channels - 1, ORIG_CHANNEL=channels - 1)
    _write_stage(t, "BS", st.bs)
    t.write("DPU_BS_RELUX_CMP_VALUE")
    # write-out element geometry [size-e]; depthwise: size_e 3 with OD_BYPASS clear [dw];
    # requant: CPEND on (OD_BYPASS = 0), OW_OP = -weight zero point (tests/sim/test_int8_requant)
    t.write("DPU_BS_OW_CFG", OD_BYPASS=int(od_bypass), SIZE_E_0=size_e, SIZE_E_1=size_e,
            SIZE_E_2=size_e)
    t.write("DPU_BS_OW_OP", OW_OP=st.ow_op or 0)
    t.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=channels - 1)
    t.write("DPU_WDMA_SIZE_1", WIDTH_WDMA=width - 1, HEIGHT_WDMA=height - 1)
    _write_stage(t, "BN", st.bn)
    t.write("DPU_BN_RELUX_CMP_VALUE")
    if st.ew is None and st.lut is None:
        t.write("DPU_EW_CFG", EW_BYPASS=1, EW_OP_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_CVT_BYPASS=1,
                EW_RELU_BYPASS=1)
    elif st.ew is None:
        # the LUT runs in the EW stage with the operand op unused: conformance 05's word
        # (EW_RELU_BYPASS | EW_OP_CVT_BYPASS; the register operands, all 0, are inert)
        t.write("DPU_EW_CFG", EW_OP_CVT_BYPASS=1, EW_RELU_BYPASS=1)
    else:
        cfg = dict(st.ew.cfg)
        if st.lut is not None:
            cfg.pop("EW_LUT_BYPASS", None)
        t.write("DPU_EW_CFG", **cfg)
    t.write("DPU_EW_CVT_OFFSET_VALUE")
    t.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)             # identity
    t.write("DPU_EW_RELUX_CMP_VALUE")
    # output converter: identity, narrowing fp32 -> fp16 for an fp16 result [tile]; the affine
    # float form after a LUT [lut]; the int8 requant [rq]
    oc = st.out_cvt
    t.write_raw("DPU_OUT_CVT_OFFSET", oc.offset & 0xFFFFFFFF)
    t.write("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=oc.scale,
            FP32TOFP16_EN=int(outf.fp32_to_fp16 and oc.narrow))
    t.write("DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=oc.shift, MINUS_EXP=oc.minus_exp,
            CVT_ROUND=int(oc.round_away), CVT_TYPE=int(oc.affine))
    for i in range(8):
        t.write(f"DPU_EW_OP_VALUE_{i}")
    # SURF_ADD: the conv path's destination surface stride x surf_mult, [conf 01/04/09][size-e]
    # [dw]; the flying source positions x 1 (conformance 05)
    t.write("DPU_SURFACE_ADD", SURF_ADD=surf_add)
    t.write("DPU_UNDOC_40C4")
    lut = st.lut
    if lut is None:
        # LUT unused: clear its registers so no earlier task's table setup carries over [task]
        for reg in ("ACCESS_CFG", "ACCESS_DATA", "CFG", "INFO", "LE_START", "LE_END", "LO_START",
                    "LO_END", "LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
            t.write(f"DPU_LUT_{reg}")
        return
    t.write("DPU_LUT_CFG", **dict(lut.cfg))
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


def _write_stage(t: TaskBuilder, name: str, st: SdpStage | None) -> None:
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
        cfg[f"{name}_ALU_SRC"] = st.alu_src
    if st.mul is None:
        cfg[f"{name}_MUL_BYPASS"] = 1
    t.write(f"DPU_{name}_CFG", **cfg)
    t.write_raw(f"DPU_{name}_ALU_CFG", st.alu[1] if st.alu else 0)
    t.write(f"DPU_{name}_MUL_CFG", **({f"{name}_MUL_OPERAND": st.mul} if st.mul is not None else {}))


def write_dpu_rdma(t: TaskBuilder, profile: ChipProfile, st: DpuStages, *, in_dtype: DType,
                   flying: bool, mode: int, width: int, height: int, channels: int) -> None:
    """DPU_RDMA, programmed every task [task]: MRDMA streams role "src" on a flying task and is
    disabled on a conv task unless the EW stage combines an operand (else the job hangs
    [mrdma]); BRDMA reads role "bias" for a memory BS operand, ERDMA role "ew"."""
    p = profile.input(in_dtype)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=width - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=channels - 1)
    ew = st.ew
    if flying:
        t.write_addr("DPU_RDMA_RDMA_SRC_BASE_ADDR", "src")
    elif ew is not None:
        t.write_addr("DPU_RDMA_RDMA_SRC_BASE_ADDR", "ew")
    else:
        t.write("DPU_RDMA_RDMA_SRC_BASE_ADDR")
    if st.bs is not None and st.bs.alu_src:
        t.write("DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)          # the int32 [C] vector
        t.write_addr("DPU_RDMA_RDMA_BS_BASE_ADDR", "bias")
    else:
        t.write("DPU_RDMA_RDMA_BRDMA_CFG")
        t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_NRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
    notch = 0
    if ew is None:
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)          # no element-wise operand
        t.write("DPU_RDMA_RDMA_EW_BASE_ADDR")
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE")
        if flying:
            # flying MRDMA: fp16 read and widened to fp32 [lut "Pipeline"]; conformance 05
            t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", FLYING_MODE=1, MRDMA_FP16TOFP32_EN=1,
                    PROC_PRECISION=p.precision, BURST_LEN=BURST_LEN, IN_PRECISION=p.precision)
        else:
            # fp16 programs also set the (unused) MRDMA fp16->fp32 widening; int8 ones clear it
            # [conf 01/03/04/09]; depthwise repeats its conv mode here [conf 09]
            t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", CONV_MODE=mode, MRDMA_DISABLE=1,
                    BURST_LEN=BURST_LEN, MRDMA_FP16TOFP32_EN=int(in_dtype == DType.F16))
    else:
        # the operand's planar advance: MAX(positions, 12) atoms [kacc]; EW_BASE one surface past
        # SRC_BASE, the hardware-verified transport [kacc][conf 02/06]. Flying (DPU-only two-
        # operand EW, one surface, hardware-exact for fp16 add/max/min/mul: seeds 000 "A
        # two-buffer op needs no conv main feed"): EW_BASE the operand itself, COMB_USE 4
        positions = width * height
        notch = max(positions, profile.ew_min_positions)
        t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=EW_PER_PIXEL,
                ERDMA_DATA_SIZE=EW_DATA_SIZE[ew.esize])
        t.write_addr("DPU_RDMA_RDMA_EW_BASE_ADDR", "ew", 0 if flying else 16 * positions)
        t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=notch)
        fly = dict(FLYING_MODE=1, MRDMA_FP16TOFP32_EN=1) if flying else {}
        t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", **fly,
                COMB_USE=COMB_FLYING_ERDMA if flying else COMB_CONV_PLUS_ERDMA,
                PROC_PRECISION=p.precision, IN_PRECISION=p.precision, BURST_LEN=BURST_LEN)
    t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
    t.write("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=notch)
    t.write("DPU_RDMA_RDMA_PAD_CFG")
    t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)  # [mesa]
    t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=notch)


def _cna_core(t: TaskBuilder, g: ConvTaskGeom, profile: ChipProfile, reuse: str, mode: int,
              wbytes: int, per_kernel: int, split: CbufSplit) -> None:
    p = profile.input(g.in_dtype)
    dw = g.depthwise
    rq = g.requant
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
    # channels as stored (padding zeros included) and the last real channel index [mesa][conf]
    t.write("CNA_DATA_SIZE1", DATAIN_CHANNEL=g.in_c, DATAIN_CHANNEL_REAL=(g.real_c or g.in_c) - 1)
    t.write("CNA_DATA_SIZE2", DATAOUT_WIDTH=g.out_w)
    t.write("CNA_DATA_SIZE3", DATAOUT_ATOMICS=g.positions)          # output positions [mesa]
    t.write("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=wbytes)
    t.write("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    # depthwise: one kernel, the channels ride in the weight atom [dw][conf 09]
    t.write("CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=1 if dw else g.kernels, WEIGHT_HEIGHT=g.kh,
            WEIGHT_WIDTH=g.kw)
    # FC_DATA_BANK must stay 0 on the conv path [reuse]
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
    t.write_addr("CNA_FEATURE_DATA_ADDR", "feature")
    t.write("CNA_FC_CON2")
    t.write("CNA_DMA_CON0", DATA_BURST_LEN=BURST_LEN, WEIGHT_BURST_LEN=BURST_LEN)
    # CNA_DMA_CON1 counts 4-byte units ([mesa] W*16/4) [conf 04]; CNA_DMA_CON2 the surface
    # pitch in atoms minus the line field: Mesa's line*(H/4 - 1) = W*H - 4W for a dense cube
    # [mesa][conf 01/02/04]; the pitch of the whole cube a tile is cut from keeps tiles reading
    # their rows in place
    line_field = g.line_pitch // 4
    t.write("CNA_DMA_CON1", LINE_STRIDE=line_field)
    t.write("CNA_DMA_CON2", SURF_STRIDE=g.surf_pitch // 16 - line_field)
    t.write("CNA_FC_DATA_SIZE0", DMA_WIDTH=g.in_w, DMA_HEIGHT=g.in_h)
    t.write("CNA_FC_DATA_SIZE1", DMA_CHANNEL=g.in_c)
    # weights are not compressed: decompression off, the stream read plainly from ADDR0 [mm]
    t.write("CNA_DCOMP_CTRL")
    t.write("CNA_DCOMP_REGNUM")
    t.write_addr("CNA_DCOMP_ADDR0", "weight")
    for i in range(16):
        t.write(f"CNA_DCOMP_AMOUNT{i}")
    t.write("CNA_CVT_CON5")
    # pad value 0, or the input zero point in every byte lane ([dw] "CNA_PAD_CON1 is read per
    # byte lane")
    t.write("CNA_PAD_CON1", PAD_VALUE=0 if rq is None else (rq.pad_value & 0xFF) * 0x01010101)
    # the int8-output requant writer needs QD_EN = 1 ([dw] "CORE_MISC_CFG QD_EN = 1")
    t.write("CORE_MISC_CFG", QD_EN=1 if rq is not None else p.core_qd_en, DW_EN=int(dw),
            PROC_PRECISION=p.precision)
    t.write("CORE_DATAOUT_SIZE_0", DATAOUT_WIDTH=g.out_w - 1, DATAOUT_HEIGHT=g.out_h - 1)
    t.write("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=g.out_c - 1)
    t.write("CORE_CLIP_TRUNCATE")
    t.write("CORE_UNDOC_3030")                                      # written 0 by [mesa], [conf]


def _build(g: ConvTaskGeom, st: DpuStages, profile: ChipProfile, reuse: str) -> TaskTemplate:
    _check(g, st, profile, reuse)
    p = profile.input(g.in_dtype)
    outf = profile.output(g.in_dtype, g.out_dtype)
    dw = g.depthwise
    mode = CONV_MODE_DEPTHWISE if dw else CONV_MODE_DIRECT
    per_kernel = g.kh * g.kw * g.in_c * p.esize
    wbytes = per_kernel * (1 if dw else g.kernels)
    split = g.cbuf or cbuf_split(profile, g.in_dtype, g.in_h, g.in_w, g.in_c, wbytes)
    size_e = DW_SIZE_E if dw else outf.size_e
    surf_mult = size_e + 1          # [size-e][dw]: fp16 2, fp32 4, integer 8, depthwise 4
    surf_add = g.surf_add if g.surf_add is not None else (g.dst_surf_stride // 16) * surf_mult
    t = TaskBuilder("conv", profile)
    # Arm the DPU / DPU_RDMA ping-pong register groups every task [task]; the kernel arms CNA and
    # CORE with its per-core bit, so we must not (seeds 003 s4).
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    if st.lut is not None:
        upload_lut(t, st.lut)
    _cna_core(t, g, profile, reuse, mode, wbytes, per_kernel, split)
    ow_op = st.ow_op if st.ow_op is not None else (DW_OW_OP_BASE if dw else None)
    write_dpu(t, profile, DpuStages(st.bs, st.bn, st.ew, st.lut, st.out_cvt, ow_op),
              in_dtype=g.in_dtype, out_dtype=g.out_dtype, flying=False, mode=mode,
              width=g.out_w, height=g.out_h, channels=g.out_c,
              dst_surf_stride=g.dst_surf_stride, size_e=size_e, surf_add=surf_add,
              od_bypass=not dw and st.ow_op is None)
    write_dpu_rdma(t, profile, st, in_dtype=g.in_dtype, flying=False, mode=mode, width=g.out_w,
                   height=g.out_h, channels=g.out_c)
    # DMA footprint: the feature's channel groups (rows x width atoms each, at the cube's
    # pitches), the weights, the EW operand (a dense cube of the output geometry), the BS
    # vector and the output's channel groups at the destination surface stride. An operand kept
    # in the CBUF by a reuse bit is not fetched [reuse], so it is no stream of this task.
    atom = profile.atom_bytes
    if reuse != "data":
        t.reads(Reloc("feature"), g.in_h * g.line_pitch, -(-g.in_c // p.feature_c2), g.surf_pitch)
    if reuse != "weight":
        t.reads(Reloc("weight"), wbytes)
    if st.ew is not None:
        # the operand's own atoms: an fp32 operand holds half the channels per atom
        t.reads(Reloc("ew"), -(-g.out_c // (atom // st.ew.esize)) * g.positions * atom)
    if st.bs is not None and st.bs.alu_src:
        t.reads(Reloc("bias"), 4 * g.out_c)
    t.writes(Reloc("out"), g.positions * atom, -(-g.out_c // outf.c2), g.dst_surf_stride)
    if not p.chainable:
        t.refuse_chaining(
            f"{g.in_dtype.value} uses the integer accumulator, which clears per kick, not per "
            f"task, so chained integer tasks after the first compute garbage "
            f"(notes: encodings/regcmd-task-model.md)")
    return template_of(t.finish())


# (id(profile), description) -> (profile, template); the profile is kept so its id stays unique.
# SigLIP-224 (12 layers, ~5000 tasks) has 55 distinct task shapes; the bound keeps a process
# that compiles many models from growing without limit.
_TEMPLATES: dict[tuple, tuple[ChipProfile, TaskTemplate]] = {}
_TEMPLATES_MAX = 8192


def cached_template(profile: ChipProfile, key: tuple,
                    build: Callable[[], TaskTemplate]) -> TaskTemplate:
    """``build()``'s template, made once per (profile, key)."""
    k = (id(profile),) + key
    hit = _TEMPLATES.get(k)
    if hit is None or hit[0] is not profile:
        hit = (profile, build())
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        _TEMPLATES[k] = hit
    return hit[1]


def conv_task(g: ConvTaskGeom, profile: ChipProfile, where: Mapping[str, Reloc], *,
              stages: DpuStages = DpuStages(), name: str = "conv",
              reuse: str = "none") -> EmittedTask:
    """The complete, self-contained task ([task]: every task rewrites its whole configuration)
    for ``g`` with the DPU ``stages``. ``where`` maps the roles to addresses: "feature",
    "weight", "out", plus "ew" (the EW operand cube) and "bias" (a BRDMA vector) when the
    stages read them. ``reuse``: "data"/"weight" keeps that CBUF operand from the previous task
    of the job [reuse]."""
    need = {"feature", "weight", "out"}
    if stages.ew is not None:
        need.add("ew")
    if stages.bs is not None and stages.bs.alu_src:
        need.add("bias")
    if set(where) != need:
        raise LoweringError(f"{name}: a task with these stages takes addresses for "
                            f"{sorted(need)}, got {sorted(where)}")
    tpl = cached_template(profile, ("conv", g, stages, reuse), lambda: _build(g, stages, profile, reuse))
    return tpl.bind(name, where)


def emit_conv_task(g: ConvTaskGeom, profile: ChipProfile, feature: Reloc, weight: Reloc,
                   out: Reloc, ew_operand: Reloc | None = None, name: str = "conv",
                   reuse: str = "none", bias: Reloc | None = None) -> EmittedTask:
    """``conv_task`` for a plain, K-accumulating (``g.ew_esize`` with the previous partial at
    ``ew_operand``, added by the EW stage [kacc]) or requantizing (``g.requant`` with its
    int32 vector at ``bias``) conv tile."""
    from .dpu_stages import ew_sum
    if (ew_operand is None) != (g.ew_esize == 0):
        raise LoweringError("a K-accumulating task needs both ew_esize and an ew_operand address")
    if (g.requant is None) != (bias is None):
        raise LoweringError("a requantizing task needs both ConvTaskGeom.requant and the bias "
                            "vector address (and a plain task neither)")
    where = {"feature": feature, "weight": weight, "out": out}
    if g.requant is not None:
        stages = requant_stages(g.requant)
        where["bias"] = bias
    elif ew_operand is not None:
        stages = DpuStages(ew=ew_sum(g.ew_esize))
        where["ew"] = ew_operand
    else:
        stages = DpuStages()
    return conv_task(g, profile, where, stages=stages, name=name, reuse=reuse)
