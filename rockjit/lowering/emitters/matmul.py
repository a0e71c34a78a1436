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

from dataclasses import dataclass, replace

import numpy as np

from ...ir.types import DType
from ...weight_timing import timed
from ..compile_cache import compile_scope_memo, memoized
from ..layouts import (CubeLayout, WeightLayout, matrix_feature_layout, matrix_output_layout,
                       pack_matrix, unpack_matrix, weight_layout)
from ..profile import ChipProfile
from ..op_lowering import BufferSpec, OpLowering
from ..regcmd import LoweringError, Reloc, EmittedTask
from ..tile_choice import plan_conv
from ..tiling import ConvPlan, ConvShape, field_limit, round_up
from .task import ConvTaskGeom, DpuStages, emit_conv_task
from .tiled import (CubeRef, Epilogue, Scratch, TiledTasks, assemble, build_tiled,
                    host_partials, k_accumulation)

_SUPPORTED = {(DType.F16, DType.F16), (DType.F16, DType.F32), (DType.I8, DType.I32)}


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


def _check_request(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType,
                   profile: ChipProfile) -> None:
    """Refuse what no matmul plan can serve: another register encoding, an unsupported dtype
    pair, an empty dimension."""
    if profile.encoding != "rk3588":
        raise LoweringError(f"the matmul emitter writes the RK3588 register encoding; chip "
                            f"{profile.name!r} uses {profile.encoding!r}")
    if (in_dtype, out_dtype) not in _SUPPORTED:
        ok = ", ".join(f"{i.value}->{o.value}" for i, o in sorted(_SUPPORTED, key=str))
        raise LoweringError(f"matmul {in_dtype.value} -> {out_dtype.value} is not supported; "
                            f"supported: {ok}")
    if min(m, k, n) < 1:
        raise LoweringError(f"matmul dimensions must be >= 1, got M={m} K={k} N={n}")


def plan_matmul_tile(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType,
                     profile: ChipProfile) -> MatmulTile:
    """Pad a matmul to the hardware's atoms and check that it fits one task."""
    _check_request(m, k, n, in_dtype, out_dtype, profile)
    p = profile.input(in_dtype)
    out = profile.output(in_dtype, out_dtype)
    m_pad = max(profile.min_feature_rows, round_up(m, profile.row_align))
    k_pad = round_up(k, p.k_align)
    n_pad = round_up(n, p.n_align)

    if m_pad > profile.max_feature_rows:
        raise LoweringError(f"matmul M={m} (padded {m_pad}) exceeds the {profile.max_feature_rows} "
                            f"feature rows one {profile.name} task reads; tile M")
    if n_pad > profile.cube_dim_limit:
        raise LoweringError(f"matmul N={n} (padded {n_pad}) exceeds the DPU cube channel limit "
                            f"{profile.cube_dim_limit}; tile N")
    # CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL holds K-1
    k_max = field_limit("CNA_DATA_SIZE1", "DATAIN_CHANNEL_REAL", profile.encoding) + 1
    if k_pad > k_max:
        raise LoweringError(f"matmul K={k} (padded {k_pad}) exceeds the {k_max} input channels "
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
                name: str = "matmul", reuse: str = "none") -> EmittedTask:
    """The complete task for ``tile``: A read at ``a``, B at ``b``, C written at ``c``.

    ``reuse`` = "data" or "weight" keeps that operand from the previous task of the same job in
    the CBUF instead of fetching it again (CNA_CBUF_CON0 DATA_REUSE / WEIGHT_REUSE [reuse]); the
    caller guarantees the previous task loaded the same operand with the same CBUF split.
    The task is the 1x1 stride-1 conv of task.py over an M-row, 1-wide feature map.
    """
    g = ConvTaskGeom(tile.in_dtype, tile.out_dtype, False, tile.m_pad, 1, tile.k_pad,
                     tile.a_layout.line_stride, tile.a_layout.surf_stride, 1, 1, tile.n_pad,
                     1, 1, 1, 1, 0, 0, tile.m_pad, 1, tile.c_layout.surf_stride)
    return emit_conv_task(g, profile, a, b, c, name=name, reuse=reuse)


# ---------------------------------------------------------------------------------------------
# tiled matmul -> OpLowering
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulLayouts:
    """Padded sizes and per-batch-element layouts of a tiled matmul's three operands."""

    m_pad: int
    k_pad: int
    n_pad: int
    a: CubeLayout
    b: WeightLayout          # the plain weight layout (B as an input; one K step only)
    c: CubeLayout
    a_stride: int            # bytes between batch elements
    b_stride: int
    c_stride: int


def _matmul_shape(m_pad: int, k_pad: int, n_pad: int, in_dtype: DType, out_dtype: DType,
                  profile: ChipProfile) -> ConvShape:
    # M rows of one position each: H = M, W = 1, a 1x1 stride-1 kernel [mm]; row tiles stay
    # multiples of the row atom
    return ConvShape(in_dtype, out_dtype, False, m_pad, 1, k_pad, n_pad, 1, 1, 1, 1, 1, 1, 0, 0,
                     m_pad, 1, row_align=profile.row_align)


@memoized     # a pure function of plain arguments; the layers ask it again (compile_cache.py)
def plan_matmul(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType, profile: ChipProfile,
                *, out_channel_align: int | None = None, single_k: bool = False,
                max_m: int | None = None, max_k: int | None = None,
                max_n: int | None = None, images: int = 1) -> tuple[ConvPlan, MatmulLayouts]:
    """Pad C[M,N] = A[M,K].B[N,K]^T to the atoms and tile it (tiling.plan_conv rules).

    M pads to a multiple of ``row_align`` and at least ``min_feature_rows``; if the plan must
    split K on the DPU and M is below ``ew_min_positions``, M pads up to that (the EW partial of
    a multi-surface tile needs 12 positions, k-accumulation.md) -- the extra rows are zero.
    ``out_channel_align`` pads N further so the output cube can be read directly as the next
    matmul's K (cross-op-chaining.md: fp16 N%16 vs K%32). ``images``: how many products of this
    plan share the step's cores (a batch; tile_choice.py prices the tiling with all of them).
    """
    _check_request(m, k, n, in_dtype, out_dtype, profile)
    p = profile.input(in_dtype)
    m_pad = max(profile.min_feature_rows, round_up(m, profile.row_align))
    k_pad = round_up(k, p.k_align)
    n_pad = round_up(n, max(p.n_align, out_channel_align or 1))
    if n_pad % p.n_align:
        raise LoweringError(f"out_channel_align {out_channel_align} is not a multiple of the "
                            f"{in_dtype.value} N atom {p.n_align}")
    caps = dict(max_rows=max_m, max_kernels=max_n, max_channels=max_k,
                max_k_steps=1 if single_k else None, reuse=True, images=images)
    try:
        plan = plan_conv(_matmul_shape(m_pad, k_pad, n_pad, in_dtype, out_dtype, profile), profile, **caps)
    except LoweringError:
        if m_pad >= profile.ew_min_positions:
            raise
        m_pad = round_up(profile.ew_min_positions, profile.row_align)
        plan = plan_conv(_matmul_shape(m_pad, k_pad, n_pad, in_dtype, out_dtype, profile), profile, **caps)
    a = matrix_feature_layout(profile, in_dtype, m_pad, k_pad)
    b = weight_layout(profile, in_dtype, n_pad, k_pad)
    c = matrix_output_layout(profile, in_dtype, out_dtype, m_pad, n_pad)
    lay = MatmulLayouts(m_pad, k_pad, n_pad, a, b, c, round_up(a.nbytes, 64),
                        round_up(b.nbytes, 64), round_up(c.nbytes, 64))
    return plan, lay


def pack_matmul_b(plan: ConvPlan, profile: ChipProfile, b: np.ndarray,
                  out: np.ndarray | None = None) -> np.ndarray:
    """B [N, K] -> tile-major weight bytes: one contiguous weight layout per (N tile, K step),
    N tiles outer (conformance 02's slot order ni*nKt + ki). With one K step this is the plain
    [N/NG][K/KG][NG][KG] layout. Written into ``out`` (np.uint8 of ``packed_b_nbytes``) when
    given, each tile straight from its block of ``b`` (any strides: a transposed weight is
    not copied first)."""
    s = plan.shape
    b = np.asarray(b)
    dt = s.in_dtype.to_numpy()
    if b.dtype != dt:
        raise LoweringError(f"matmul B must be {dt} (got {b.dtype}); cast before lowering")
    if out is None:
        out = np.empty(packed_b_nbytes(plan, profile), np.uint8)
    pos = 0
    for ks in plan.kernels:
        for cs in plan.channels:
            lay = weight_layout(profile, s.in_dtype, ks.size, cs.size)
            lay.pack_into(b[ks.start:ks.start + ks.size, cs.start:cs.start + cs.size],
                          out[pos:pos + lay.nbytes])
            pos += lay.nbytes
    return out


def packed_b_nbytes(plan: ConvPlan, profile: ChipProfile) -> int:
    """The bytes of ``pack_matmul_b``'s result."""
    return sum(weight_layout(profile, plan.shape.in_dtype, ks.size, cs.size).nbytes
               for ks in plan.kernels for cs in plan.channels)


def _b_offsets(plan: ConvPlan, profile: ChipProfile) -> dict[tuple[int, int], int]:
    esize = profile.input(plan.shape.in_dtype).esize
    out, pos = {}, 0
    for j, ks in enumerate(plan.kernels):
        for ki, cs in enumerate(plan.channels):
            out[(j, ki)] = pos
            pos += ks.size * cs.size * esize
    return out


def build_matmul(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType,
                 profile: ChipProfile, *, batch: int = 1, b: np.ndarray | None = None,
                 out_channel_align: int | None = None, name: str = "matmul",
                 max_m: int | None = None, max_k: int | None = None,
                 max_n: int | None = None, epilogue: MatmulEpilogue | None = None) -> OpLowering:
    """C[M,N] = A[M,K].B[N,K]^T, or ``batch`` independent such products -> OpLowering.
    ``epilogue``: C = A.B^T + bias[N], or C = act(A.B^T), in the matmul's own tasks.

    Buffers (names local to the op):
      "a"  input, bind 0: per batch element the feature cube ``layouts.a`` (M_pad rows x K_pad
           channels; rows/channels past M/K zero), elements ``a_stride`` apart; shape
           (batch, M, K) or (M, K).
      "b"  B given (``b`` = [N,K] shared by every batch element, or [batch,N,K]): const with the
           tile-major packed bytes. B omitted (an activation, e.g. attention's K): input bind 1
           in the plain weight layout ``layouts.b`` (BufferSpec.layout holds that WeightLayout),
           elements ``b_stride`` apart; the plan then keeps K in one step.
      "c"  output, bind 0: per element the whole output cube ``layouts.c`` (M_pad x N_pad),
           every tile written at its place, so the next op reads it directly.
      "bias" const (epilogue bias): the bias broadcast over each row tile's rows, one dense
           fp16 cube per distinct tile height (the EW operand is the task's output geometry).
      "kacc" scratch for fp16 K partials; "kpart" scratch + host-op "binary add" steps (int32
           views) for int8 K partials; "regcmd".
    Jobs: per batch element, the M x N tiles in groups that keep a shared feature (one M tile)
    or weight (one N tile) resident in the CBUF (reuse.py), independent, in one NpuStep; an
    fp16 job is one self-chained kick (K step by K step), an int8 job one kick per task.

    In a compile (compile_cache.py) the program is built once per structure -- every argument
    but the values of ``b`` and the bias, and ``name`` (task names reach error messages only,
    and an error is never reused) -- and a matmul of the same structure (the next layer's)
    reuses its tasks and jobs with its own ``b`` and bias packed into the const buffers.
    """
    key = _structure_key(m, k, n, in_dtype, out_dtype, profile, batch, b, out_channel_align,
                         max_m, max_k, max_n, epilogue)
    cache = compile_scope_memo()
    args = (m, k, n, in_dtype, out_dtype, profile, batch, b, out_channel_align, name, max_m,
            max_k, max_n, epilogue)
    if key is None or cache is None:
        return _build_matmul(*args)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _build_matmul(*args)     # an error propagates, never stored
        return hit
    return _with_constants(hit, *args)


def _structure_key(m, k, n, in_dtype, out_dtype, profile, batch, b, out_channel_align, max_m,
                   max_k, max_n, epilogue) -> tuple | None:
    """What the tasks and jobs of a matmul depend on (None: not reusable -- an activation
    epilogue carries its LUT in the registers)."""
    if epilogue is not None and epilogue.act is not None:
        return None
    bkey = None if b is None else (np.shape(b), np.asarray(b).dtype.str)
    bias = None if epilogue is None or epilogue.bias is None else \
        (np.shape(epilogue.bias), np.asarray(epilogue.bias).dtype.str)
    return ("build_matmul", m, k, n, in_dtype, out_dtype, profile, batch, bkey,
            out_channel_align, max_m, max_k, max_n, epilogue is not None, bias)


def _with_constants(low: OpLowering, m, k, n, in_dtype, out_dtype, profile, batch, b,
                    out_channel_align, name, max_m, max_k, max_n, epilogue) -> OpLowering:
    """``low`` (a matmul of the same structure) with this call's ``b`` and bias packed."""
    plan, lay = plan_matmul(m, k, n, in_dtype, out_dtype, profile,
                            out_channel_align=out_channel_align, single_k=b is None,
                            max_m=max_m, max_k=max_k, max_n=max_n, images=batch)
    bufs = []
    for spec in low.buffers:
        if spec.name == "b" and spec.role == "const":
            data, _ = _packed_b(plan, profile, b, batch, n, k)
            spec = replace(spec, data=data)
        elif spec.name == "bias" and spec.role == "const":
            _, ep_bufs = _epilogue(epilogue, plan, lay, n, in_dtype, out_dtype, profile, name)
            spec = replace(spec, data=ep_bufs[0].data)
        bufs.append(spec)
    return replace(low, buffers=tuple(bufs))


def _packed_b(plan: ConvPlan, profile: ChipProfile, b: np.ndarray, batch: int, n: int,
              k: int) -> tuple[np.ndarray, int]:
    """A given B packed tile-major (per batch element ``b_stride`` apart) and that stride."""
    bb = np.asarray(b)
    shared = bb.ndim == 2
    if bb.shape[-2:] != (n, k) or (not shared and bb.shape != (batch, n, k)):
        raise LoweringError(f"matmul B must be [{n}, {k}] or [{batch}, {n}, {k}] (one row per "
                            f"output column), got {list(bb.shape)}")
    with timed("pack") as packed:
        size = packed_b_nbytes(plan, profile)
        b_stride = 0 if shared else round_up(size, 64)
        data = np.empty(max(b_stride * batch, size), np.uint8)
        for i in range(1 if shared else batch):
            pack_matmul_b(plan, profile, bb if shared else bb[i],
                          data[i * b_stride:i * b_stride + size])
            data[i * b_stride + size:(i + 1) * b_stride] = 0
        packed[0] = data.nbytes
    return data, b_stride


def _build_matmul(m: int, k: int, n: int, in_dtype: DType, out_dtype: DType,
                  profile: ChipProfile, batch: int, b: np.ndarray | None,
                  out_channel_align: int | None, name: str, max_m: int | None,
                  max_k: int | None, max_n: int | None,
                  epilogue: MatmulEpilogue | None) -> OpLowering:
    if batch < 1:
        raise LoweringError(f"batch must be >= 1, got {batch}")
    plan, lay = plan_matmul(m, k, n, in_dtype, out_dtype, profile,
                            out_channel_align=out_channel_align, single_k=b is None,
                            max_m=max_m, max_k=max_k, max_n=max_n, images=batch)
    tiled = TiledTasks()
    scratch = Scratch("kacc")
    c_total = lay.c_stride * batch
    host = host_partials(plan, c_total)
    offs = _b_offsets(plan, profile)
    if b is not None:
        data, b_stride = _packed_b(plan, profile, b, batch, n, k)
        b_spec = BufferSpec("b", "const", int(data.size), None, in_dtype.value,
                            tuple(np.shape(b)), data=data)
    else:
        if plan.k_steps != 1:
            raise LoweringError("internal: an activation B needs a single K step")
        b_stride = lay.b_stride
        b_spec = BufferSpec("b", "input", b_stride * batch, lay.b, in_dtype.value,  # type: ignore[arg-type]
                            (batch, n, k) if batch > 1 else (n, k), bind=1)
    ep, ep_bufs = _epilogue(epilogue, plan, lay, n, in_dtype, out_dtype, profile, name)
    for i in range(batch):
        feat = CubeRef("a", i * lay.a_stride, lay.a.line_stride, lay.a.surf_stride)
        out = CubeRef("c", i * lay.c_stride, lay.c.line_stride, lay.c.surf_stride)
        base = i * b_stride
        build_tiled(plan, profile, feature=feat, weight_buffer="b",
                    weight_offset=lambda j, ki, base=base: base + offs[(j, ki)], out=out,
                    scratch=scratch, host_partials=host, name=f"{name}.{i}", into=tiled,
                    epilogue=ep, reuse=True, images=batch)
    shape_a = (batch, m, k) if batch > 1 else (m, k)
    shape_c = (batch, m, n) if batch > 1 else (m, n)
    buffers = [
        BufferSpec("a", "input", lay.a_stride * batch, lay.a, in_dtype.value, shape_a, bind=0),
        b_spec,
        BufferSpec("c", "output", c_total, lay.c, out_dtype.value, shape_c, bind=0),
    ] + ep_bufs
    steps = []
    kbufs, ksteps = k_accumulation(plan, scratch, "c", c_total)
    buffers += kbufs
    steps += ksteps
    return assemble(profile, tiled, buffers, steps, batch * m * n * k)


@dataclass(frozen=True)
class MatmulEpilogue:
    """What a matmul's own DPU applies to C on the way out, instead of separate passes (issue 9):
    ``bias`` [N] added by the EW stage from a resident broadcast cube (ERDMA) in the first K
    step, or ``act`` the BN / LUT / OUT_CVT stages of a LUT activation (e.g. a
    lut_tables.LutTable's bn, lut and out_cvt; K in one pass). One of the two per matmul
    (tiled.Epilogue says why)."""

    bias: np.ndarray | None = None
    act: DpuStages | None = None


def _epilogue(ep: MatmulEpilogue | None, plan: ConvPlan, lay: MatmulLayouts, n: int,
              in_dtype: DType, out_dtype: DType, profile: ChipProfile,
              name: str) -> tuple[Epilogue | None, list[BufferSpec]]:
    if ep is None:
        return None, []
    if (in_dtype, out_dtype) != (DType.F16, DType.F16):
        raise LoweringError(f"{name}: a matmul epilogue runs on the fp16 -> fp16 path; got "
                            f"{in_dtype.value} -> {out_dtype.value}")
    if ep.bias is None:
        return Epilogue(act=ep.act), []
    bias = np.asarray(ep.bias, np.float16)
    if bias.shape != (n,):
        raise LoweringError(f"{name}: epilogue bias must be [{n}], got {list(bias.shape)}")
    # one dense [rows x N_pad] broadcast cube per distinct row-tile height: the EW operand is a
    # dense cube of the task's own output geometry, in that task's output format -- fp32 when
    # the bias rides the first of several K steps (an fp32 partial, k-accumulation.md)
    full = np.zeros(lay.n_pad, np.float16)
    full[:n] = bias
    cube_dtype = DType.F32 if plan.k_steps > 1 else out_dtype
    blobs, offs, pos = [], {}, 0
    with timed("pack") as packed:           # the bias bytes, packed: weight work
        for rows in sorted({r.out_rows for r in plan.rows}):
            cube = matrix_output_layout(profile, in_dtype, cube_dtype, rows, lay.n_pad)
            mat = np.broadcast_to(full.astype(cube_dtype.to_numpy()), (rows, lay.n_pad))
            blob = pack_matrix(cube, mat)       # a broadcast view: pack reads it in place
            offs[rows] = pos
            blobs.append(blob)
            pos += round_up(blob.size, 64)
        # the cubes joined into the one constant (part of packing the bias)
        data = np.zeros(pos, np.uint8)
        for rows, blob in zip(sorted(offs), blobs):
            data[offs[rows]:offs[rows] + blob.size] = blob
        packed[0] = pos
    c2 = cube.c2
    short = [r.out_rows for r in plan.rows if r.out_rows < profile.ew_min_positions]
    if short and lay.n_pad > c2:
        # the ERDMA's surface stride floor (k-accumulation.md); the simulator refuses it too
        raise LoweringError(f"{name}: an EW epilogue operand needs >= {profile.ew_min_positions} "
                            f"positions per task when N spans several surfaces; a row tile has "
                            f"{short[0]}")
    def where(rows: int, ch: int) -> int:
        return offs[rows] + (ch // c2) * rows * profile.atom_bytes
    return (Epilogue(ew=("add", "bias", where), act=ep.act, ew_esize=cube.esize),
            [BufferSpec("bias", "const", int(data.size), None, "f16", (n,), data=data)])
