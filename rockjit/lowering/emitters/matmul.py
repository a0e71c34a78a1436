"""Matmul C[M, N] = A[M, K] . B[N, K]^T as one 1x1-convolution task that fits the CBUF.

The mapping (notes: matmul-as-conv.md): K = the conv's input channels, N = its kernels (output
channels), M = the spatial height of a 1-wide feature map. A is the feature cube H=M, W=1, C=K;
B the weight tile; C the output cube H=M, W=1, C=N (layouts.py).

Supported: fp16 in -> fp16 out (fp32 accumulate, narrowed by the DPU), fp16 in -> fp32 out,
int8 in -> int32 out. Padding (zero rows/channels contribute nothing to a dot product):
  M -> a multiple of 4 and at least 4 (a feature height below 4 mis-computes; matmul-as-conv.md)
  K -> the precision's K alignment (32), N -> its N alignment (fp16 16, int8 32)

Every register value below is a formula over the tile or a fact with its source. Sources:
  [conf]  /work/shared/conformance 01 (fp16) and 03 (int8) programs and case.md
  [mesa]  Mesa src/gallium/drivers/rocket rkt_regcmd.c / rkt_task.c (conv task fields)
  [mm]    notes matmul-as-conv.md      [tile] notes encodings/tile-layouts.md
  [slack] notes encodings/cbuf-bank-slack.md   [size-e] notes encodings/size-e-quirk.md
  [mrdma] notes encodings/mrdma-trap.md        [task] notes encodings/regcmd-task-model.md
  [dw]    notes depthwise-conv.md       [reuse] notes encodings/cbuf-reuse.md
  [prec]  notes encodings/precision-field.md   [seed 003] /work/shared/seeds/003_*.txt
The precision codes, atoms, groups, size_e/surface multipliers and CBUF numbers come from the
chip profile (profile.py), which cites them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir.types import DType
from ..layouts import (CubeLayout, WeightLayout, matrix_feature_layout, matrix_output_layout,
                       pack_matrix, unpack_matrix, weight_layout)
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, Task, TaskProgram

# DMA burst length code 15 (the longest burst) on the CNA feature/weight reads, the DPU write
# and the DPU_RDMA read: the value of every conformance program and of Mesa's conv emitter.
BURST_LEN = 15
# DPU_FEATURE_MODE_CFG.OUTPUT_MODE 2: the value of every CNA->CORE->DPU program that writes
# its result to memory, in [conf] (01-04, 06, 09) and [mesa]. No source documents the other
# codes, so none is used.
OUTPUT_TO_MEMORY = 2

_SUPPORTED = {(DType.F16, DType.F16), (DType.F16, DType.F32), (DType.I8, DType.I32)}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class MatmulTile:
    """One CBUF-resident matmul task: logical and padded sizes, CBUF split, layouts."""

    m: int
    k: int
    n: int
    in_dtype: DType
    out_dtype: DType
    m_pad: int
    k_pad: int
    n_pad: int
    data_entries: int   # 64-byte CBUF entries per feature row
    data_banks: int     # CBUF banks given to the feature (slack included)
    weight_banks: int   # CBUF banks given to the weights (the rest)
    a_layout: CubeLayout
    b_layout: WeightLayout
    c_layout: CubeLayout

    @property
    def a_bytes(self) -> int:
        return self.a_layout.nbytes

    @property
    def b_bytes(self) -> int:
        return self.b_layout.nbytes

    @property
    def c_bytes(self) -> int:
        return self.c_layout.nbytes

    # -- host side -------------------------------------------------------------------------
    def pack_a(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.shape != (self.m, self.k):
            raise LoweringError(f"matmul A must be [{self.m}, {self.k}], got {list(a.shape)}")
        ap = np.zeros((self.m_pad, self.k_pad), self.in_dtype.to_numpy())
        ap[:self.m, :self.k] = a
        return pack_matrix(self.a_layout, ap)

    def pack_b(self, b: np.ndarray) -> np.ndarray:
        b = np.asarray(b)
        if b.shape != (self.n, self.k):
            raise LoweringError(f"matmul B must be [{self.n}, {self.k}] (one row per output "
                                f"column), got {list(b.shape)}")
        bp = np.zeros((self.n_pad, self.k_pad), self.in_dtype.to_numpy())
        bp[:self.n, :self.k] = b
        return self.b_layout.pack(bp)

    def unpack_c(self, raw: bytes | np.ndarray) -> np.ndarray:
        return unpack_matrix(self.c_layout, raw)[:self.m, :self.n]


def plan_matmul_tile(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType,
                     profile: ChipProfile) -> MatmulTile:
    """Pad a matmul to the hardware's atoms and check that it fits one task."""
    if profile.encoding != "rk3588":
        raise LoweringError(f"the matmul emitter writes the RK3588 register encoding; chip "
                            f"{profile.name!r} uses {profile.encoding!r}")
    if (in_dtype, out_dtype) not in _SUPPORTED:
        ok = ", ".join(f"{i.value}->{o.value}" for i, o in sorted(_SUPPORTED, key=str))
        raise LoweringError(f"matmul {in_dtype.value} -> {out_dtype.value} is not supported; "
                            f"supported: {ok}")
    if min(m, k, n) < 1:
        raise LoweringError(f"matmul dimensions must be >= 1, got M={m} K={k} N={n}")
    p = profile.input(in_dtype)
    out = profile.output(in_dtype, out_dtype)
    m_pad = max(profile.min_feature_rows, _round_up(m, profile.row_align))
    k_pad = _round_up(k, p.k_align)
    n_pad = _round_up(n, p.n_align)

    if m_pad > profile.max_feature_rows:
        raise LoweringError(f"matmul M={m} (padded {m_pad}) exceeds the {profile.max_feature_rows} "
                            f"feature rows one {profile.name} task reads; tile M")
    if n_pad > profile.cube_dim_limit:
        raise LoweringError(f"matmul N={n} (padded {n_pad}) exceeds the DPU cube channel limit "
                            f"{profile.cube_dim_limit}; tile N")
    # CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL holds K-1 in 14 bits
    if k_pad > 1 << 14:
        raise LoweringError(f"matmul K={k} (padded {k_pad}) exceeds the 16384 input channels "
                            f"one task's channel field holds; tile K")

    # CBUF split. A feature row (one M position, all K channels) occupies whole 64-byte
    # entries (CNA_CBUF_CON1.DATA_ENTRIES [tile]); the feature gets the banks those rows fill
    # plus the precision's DMA slack [slack], the weights the remaining banks.
    row_bytes = k_pad * p.esize
    data_entries = -(-row_bytes // profile.cbuf_entry_bytes)
    feature_bytes = m_pad * data_entries * profile.cbuf_entry_bytes
    data_banks = -(-feature_bytes // profile.cbuf_bank_bytes) + p.feature_bank_slack
    weight_bytes = n_pad * k_pad * p.esize
    need_w = -(-weight_bytes // profile.cbuf_bank_bytes)
    if data_banks + need_w > profile.cbuf_banks:
        raise LoweringError(
            f"matmul tile M={m_pad} K={k_pad} N={n_pad} ({in_dtype.value}) needs {data_banks} "
            f"feature + {need_w} weight CBUF banks, more than the {profile.cbuf_banks} of "
            f"{profile.name}; split K, M or N into smaller tiles")

    a_layout = matrix_feature_layout(profile, in_dtype, m_pad, k_pad)
    b_layout = weight_layout(profile, in_dtype, n_pad, k_pad)
    c_layout = matrix_output_layout(profile, in_dtype, out_dtype, m_pad, n_pad)
    assert out.c2 == c_layout.c2
    return MatmulTile(m, k, n, in_dtype, out_dtype, m_pad, k_pad, n_pad, data_entries,
                      data_banks, profile.cbuf_banks - data_banks, a_layout, b_layout, c_layout)


def emit_matmul(tile: MatmulTile, profile: ChipProfile, a: Reloc, b: Reloc, c: Reloc,
                name: str = "matmul", reuse: str = "none") -> TaskProgram:
    """The complete task for ``tile``: A read at ``a``, B at ``b``, C written at ``c``.

    ``reuse`` = "data" or "weight" keeps that operand from the previous task of the same job in
    the CBUF instead of fetching it again (CNA_CBUF_CON0 DATA_REUSE / WEIGHT_REUSE [reuse]); the
    caller guarantees the previous task loaded the same operand with the same CBUF split.
    """
    if reuse not in ("none", "data", "weight"):
        raise LoweringError(f"reuse must be 'none', 'data' or 'weight' (one operand at a time "
                            f"[reuse]), got {reuse!r}")
    p = profile.input(tile.in_dtype)
    out = profile.output(tile.in_dtype, tile.out_dtype)
    h, w = tile.m_pad, 1          # the feature map: M rows of one position each
    oh, ow = h, w                 # a 1x1 stride-1 unpadded conv keeps the spatial size
    t = Task(name, profile)

    # Arm the DPU / DPU_RDMA ping-pong register groups at the start of every task [task]; the
    # kernel does the same for CNA and CORE (with its per-core bit), so we must not [seed 003 s4].
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)

    # ---- CNA: feature + weight fetch -------------------------------------------------------
    # direct convolution (CONV_MODE 0), input and MAC precision of the datatype [prec]
    t.write("CNA_CONV_CON1", CONV_MODE=0, IN_PRECISION=p.precision, PROC_PRECISION=p.precision)
    # feature grains = input rows + 1: the derived value that works for direct convs [dw]
    # (conformance 01/02/04: 9, 17, 11 for 8, 16, 10 rows)
    t.write("CNA_CONV_CON2", FEATURE_GRAINS=h + 1)
    t.write("CNA_CONV_CON3", CONV_X_STRIDE=1, CONV_Y_STRIDE=1)
    t.write("CNA_DATA_SIZE0", DATAIN_WIDTH=w, DATAIN_HEIGHT=h)
    # channels as stored (padding zeros included), and the last channel index [mesa]
    t.write("CNA_DATA_SIZE1", DATAIN_CHANNEL=tile.k_pad, DATAIN_CHANNEL_REAL=tile.k_pad - 1)
    t.write("CNA_DATA_SIZE2", DATAOUT_WIDTH=ow)
    t.write("CNA_DATA_SIZE3", DATAOUT_ATOMICS=ow * oh)            # output positions [mesa]
    t.write("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=tile.b_bytes)         # N*K*esize
    t.write("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=tile.k_pad * p.esize)
    t.write("CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=tile.n_pad, WEIGHT_HEIGHT=1, WEIGHT_WIDTH=1)
    # the CBUF partition of plan_matmul_tile and the optional operand reuse [reuse];
    # FC_DATA_BANK must stay 0 on the conv path [reuse]
    t.write("CNA_CBUF_CON0", DATA_BANK=tile.data_banks, WEIGHT_BANK=tile.weight_banks,
            DATA_REUSE=int(reuse == "data"), WEIGHT_REUSE=int(reuse == "weight"))
    t.write("CNA_CBUF_CON1", DATA_ENTRIES=tile.data_entries)
    # input converter bypassed: signed data passes unscaled (scale 1) [mesa][conf]
    t.write("CNA_CVT_CON0", CVT_BYPASS=1, CVT_TYPE=1, DATA_SIGN=1)
    for i in range(1, 5):
        t.write(f"CNA_CVT_CON{i}", **{f"CVT_SCALE{i - 1}": 1})
    t.write("CNA_FC_CON0")
    t.write("CNA_FC_CON1")
    t.write("CNA_PAD_CON0")                                         # no padding
    t.write_addr("CNA_FEATURE_DATA_ADDR", a.buffer, a.offset)
    t.write("CNA_FC_CON2")
    t.write("CNA_DMA_CON0", DATA_BURST_LEN=BURST_LEN, WEIGHT_BURST_LEN=BURST_LEN)
    # feature strides, in 16-byte atoms: line = 4 * W, surface = W * (H - 4)
    # ([mesa] rkt_task.c: line = W*16/4, surface = line * (H/4 - 1); [conf] 01, 02 and 04
    # agree: 4/4, 4/12, 48/72). H >= 4 keeps the surface stride non-negative [mm].
    t.write("CNA_DMA_CON1", LINE_STRIDE=4 * w)
    t.write("CNA_DMA_CON2", SURF_STRIDE=w * (h - 4))
    t.write("CNA_FC_DATA_SIZE0", DMA_WIDTH=w, DMA_HEIGHT=h)
    t.write("CNA_FC_DATA_SIZE1", DMA_CHANNEL=tile.k_pad)
    # weights are not compressed: decompression off, the stream read plainly from ADDR0 [mm]
    t.write("CNA_DCOMP_CTRL")
    t.write("CNA_DCOMP_REGNUM")
    t.write_addr("CNA_DCOMP_ADDR0", b.buffer, b.offset)
    for i in range(16):
        t.write(f"CNA_DCOMP_AMOUNT{i}")
    t.write("CNA_CVT_CON5")
    t.write("CNA_PAD_CON1")

    # ---- CORE: the MAC array ------------------------------------------------------------
    t.write("CORE_MISC_CFG", QD_EN=p.core_qd_en, PROC_PRECISION=p.precision)
    t.write("CORE_DATAOUT_SIZE_0", DATAOUT_WIDTH=ow - 1, DATAOUT_HEIGHT=oh - 1)
    t.write("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=tile.n_pad - 1)
    t.write("CORE_CLIP_TRUNCATE")
    t.write("CORE_UNDOC_3030")                                      # written 0 by [mesa], [conf]

    # ---- DPU: write-out, every SDP stage bypassed -------------------------------------------
    t.write("DPU_FEATURE_MODE_CFG", OUTPUT_MODE=OUTPUT_TO_MEMORY, BURST_LEN=BURST_LEN)
    t.write("DPU_DATA_FORMAT", PROC_PRECISION=p.precision, IN_PRECISION=p.precision,
            OUT_PRECISION=out.precision)
    t.write("DPU_OFFSET_PEND")
    t.write_addr("DPU_DST_BASE_ADDR", c.buffer, c.offset)
    # bytes between output channel groups, in the field's 16-byte unit
    t.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=tile.c_layout.surf_stride // 16)
    t.write("DPU_DATA_CUBE_WIDTH", WIDTH=ow - 1)
    t.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=oh - 1)
    t.write("DPU_DATA_CUBE_NOTCH_ADDR")
    t.write("DPU_DATA_CUBE_CHANNEL", CHANNEL=tile.n_pad - 1, ORIG_CHANNEL=tile.n_pad - 1)
    t.write("DPU_BS_CFG", BS_BYPASS=1, BS_ALU_BYPASS=1, BS_MUL_BYPASS=1, BS_RELU_BYPASS=1)
    t.write("DPU_BS_ALU_CFG")
    t.write("DPU_BS_MUL_CFG")
    t.write("DPU_BS_RELUX_CMP_VALUE")
    # write-out element geometry: size_e per output format [size-e]; OD_BYPASS on the direct
    # path [dw]; BS_OW_OP 0 because BS is bypassed [dw]
    t.write("DPU_BS_OW_CFG", OD_BYPASS=1, SIZE_E_0=out.size_e, SIZE_E_1=out.size_e,
            SIZE_E_2=out.size_e)
    t.write("DPU_BS_OW_OP")
    t.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=tile.n_pad - 1)
    t.write("DPU_WDMA_SIZE_1", WIDTH_WDMA=ow - 1, HEIGHT_WDMA=oh - 1)
    t.write("DPU_BN_CFG", BN_BYPASS=1, BN_ALU_BYPASS=1, BN_MUL_BYPASS=1, BN_RELU_BYPASS=1)
    t.write("DPU_BN_ALU_CFG")
    t.write("DPU_BN_MUL_CFG")
    t.write("DPU_BN_RELUX_CMP_VALUE")
    t.write("DPU_EW_CFG", EW_BYPASS=1, EW_OP_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_CVT_BYPASS=1,
            EW_RELU_BYPASS=1)
    t.write("DPU_EW_CVT_OFFSET_VALUE")
    t.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)             # identity
    t.write("DPU_EW_RELUX_CMP_VALUE")
    # output converter: identity scale, offset 0; narrow fp32 -> fp16 for an fp16 result [tile]
    t.write("DPU_OUT_CVT_OFFSET")
    t.write("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1, FP32TOFP16_EN=int(out.fp32_to_fp16))
    t.write("DPU_OUT_CVT_SHIFT")
    for i in range(8):
        t.write(f"DPU_EW_OP_VALUE_{i}")
    # per output position, surf_mult = size_e + 1 units (fp16 2 [conf 01], fp32 4 [tile],
    # integer 8 [size-e]; depthwise's doubled value [dw] follows the same rule)
    t.write("DPU_SURFACE_ADD", SURF_ADD=ow * oh * out.surf_mult)
    t.write("DPU_UNDOC_40C4")
    # LUT unused: clear its registers so no earlier task's table setup carries over [task]
    for reg in ("ACCESS_CFG", "ACCESS_DATA", "CFG", "INFO", "LE_START", "LE_END", "LO_START",
                "LO_END", "LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
        t.write(f"DPU_LUT_{reg}")

    # ---- DPU_RDMA: must be programmed with MRDMA disabled or the job hangs [mrdma] ---------
    t.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=ow - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=oh - 1)
    t.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=tile.n_pad - 1)
    t.write("DPU_RDMA_RDMA_SRC_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_BRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BS_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_NRDMA_CFG")
    t.write("DPU_RDMA_RDMA_BN_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)              # no element-wise operand
    t.write("DPU_RDMA_RDMA_EW_BASE_ADDR")
    t.write("DPU_RDMA_RDMA_EW_SURF_STRIDE")
    # fp16 programs also set the (unused) MRDMA fp16->fp32 widening; int8 ones clear it [conf]
    t.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", MRDMA_DISABLE=1, BURST_LEN=BURST_LEN,
            MRDMA_FP16TOFP32_EN=int(tile.in_dtype == DType.F16))
    t.write("DPU_RDMA_RDMA_SRC_DMA_CFG")
    t.write("DPU_RDMA_RDMA_SURF_NOTCH")
    t.write("DPU_RDMA_RDMA_PAD_CFG")
    t.write("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1)  # [mesa]
    t.write("DPU_RDMA_RDMA_EW_SURF_NOTCH")

    if not p.chainable:
        t.refuse_chaining(
            f"{tile.in_dtype.value} uses the integer accumulator, which clears per kick, not per "
            f"task, so chained integer tasks after the first compute garbage "
            f"(notes: encodings/regcmd-task-model.md)")
    return t.finish()
