"""The CBUF-fit tile planner for convolutions and matmuls (a matmul is a 1x1 conv).

Every task of the CNA->CORE->DPU path holds its whole feature tile and its whole weight tile in
the CBUF at once (notes: matmul-as-conv.md "Tiling"), so a problem is cut into tasks along three
axes:

* output rows (a matmul's M): each row tile reads the input rows its outputs need, kernel halo
  and stride included; independent tasks.
* output channels (a matmul's N; a depthwise conv's channels): independent tasks.
* input channels (a matmul's K): partial sums that must be added. On the fp16 path the DPU's
  element-wise unit adds the previous partial (notes: encodings/k-accumulation.md); integer
  partials can only be summed on the host (same page, "Integer EW K-accumulation -- DEAD").

The rules, all read from the chip profile or the register table (no number of our own):

1. Atoms: K (input channels) a multiple of ``k_align``, N a multiple of ``n_align`` (fp16 16,
   int8 32), matmul row tiles a multiple of ``row_align`` (notes: matmul-as-conv.md, alignment
   table). Depthwise channel tiles are whole ``dw_group``s (depthwise-conv.md).
2. CBUF: feature banks = ceil(rows * entries * entry_bytes / bank) + the precision's feature slack
   (int8: +1, encodings/cbuf-bank-slack.md); weight banks = ceil(weight bytes / bank); the sum
   must not exceed ``cbuf_banks``. The weights take the banks the feature leaves.
3. Field limits: input rows per task <= ``max_feature_rows`` (FEATURE_GRAINS), width <=
   ``max_feature_cols``; DPU cube dimensions <= ``cube_dim_limit`` (13-bit fields, QUIRK 3);
   and the widths of CNA_DATA_SIZE1.DATAIN_CHANNEL_REAL (channels), CNA_WEIGHT_SIZE1 (bytes per
   kernel), CNA_WEIGHT_SIZE2.WEIGHT_KERNELS, CNA_DATA_SIZE3.DATAOUT_ATOMICS, CNA_PAD_CON0,
   CNA_CONV_CON3 from the register table.
4. Feature height >= ``min_feature_rows`` in every task (matmul-as-conv.md "height < 4 is
   broken"): a row tile's input window is extended downwards (extra rows past the outputs it
   computes are never used) and the planner refuses a window it cannot extend.
5. DPU K-accumulation reads the previous partial through ERDMA, whose planar advance is floored
   at ``ew_min_positions`` positions: with more than one output surface a K-split tile needs at
   least that many output positions (k-accumulation.md "test with M>=12").

Choice: ``candidates`` lists every tiling that satisfies 1-5; tile_choice.plan_conv runs the one
of least modelled time (rockjit.cost), keeping the rule's pick unless the model finds one
clearly faster. The rule: the least ``tasks + bytes_moved / cbuf_bytes``. A task has a fixed
dispatch cost of tens of microseconds (notes: perf/iova-and-multicore.md, ~27-54 us per submit),
about the time LPDDR takes to stream one CBUF's worth (~0.4 MB at ~17 GB/s,
perf/not-mac-bound.md), so one task is weighed like one CBUF of traffic. Bytes moved = feature
reads (once per output-channel tile and K step, halo rows included) + weight reads (once per row
tile) + the output + the K-partial traffic (DPU: read and write of each intermediate partial;
host: the partials written and read back). Row and channel tiles are balanced (equal sizes,
rounded to the atom) so no tail tile is needlessly small.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from ..ir.types import DType
from . import registers as R
from .arith import ceil_div, round_up
from .compile_cache import memo
from .profile import ChipProfile
from .regcmd import LoweringError

if TYPE_CHECKING:
    from .tile_choice import TileChoice

KACC_NONE = "none"    # one K step
KACC_DPU = "dpu"      # partials added by the DPU EW unit (fp16 path)
KACC_HOST = "host"    # integer partials summed by a host step
PARTIAL_ESIZE = 4     # bytes per element of a K partial: fp32 (DPU) or int32 (host)


@lru_cache(maxsize=None)
def field_limit(reg: str, field: str, encoding: str) -> int:
    """Largest value a register field holds (register table; one table per encoding)."""
    if encoding != "rk3588":
        raise LoweringError(f"no register table for encoding {encoding!r}")
    return (1 << R.register(reg).field(field).width) - 1


@dataclass(frozen=True)
class ConvShape:
    """One image's convolution as the CNA sees it (cube terms, padded to the atoms)."""

    in_dtype: DType
    out_dtype: DType
    depthwise: bool
    height: int          # input cube rows
    width: int           # input cube columns
    channels: int        # input channels, padded to k_align
    kernels: int         # output channels padded to n_align (depthwise: == channels)
    kh: int
    kw: int
    sy: int
    sx: int
    dy: int
    dx: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    row_align: int = 1   # output row tiles are multiples of this (a matmul's M: row_align)


@dataclass(frozen=True)
class RowTile:
    """Output rows [out_row, out_row + out_rows) read input rows [in_row, in_row + in_rows)."""

    out_row: int
    out_rows: int
    in_row: int
    in_rows: int
    pad_top: int         # padding rows above in_row this tile's first output row reaches


@dataclass(frozen=True)
class Span:
    start: int
    size: int


@dataclass(frozen=True)
class ConvPlan:
    shape: ConvShape
    rows: tuple[RowTile, ...]
    kernels: tuple[Span, ...]    # output-channel tiles (depthwise: channel tiles)
    channels: tuple[Span, ...]   # input-channel (K) steps (depthwise: one step per kernel tile)
    kacc: str
    cost: float                  # the rule's cost (module docstring, "Choice")
    # tile_choice.py: how this plan was chosen (None: planned without the model); not part of
    # the plan's identity
    choice: "TileChoice | None" = field(default=None, compare=False)

    @property
    def k_steps(self) -> int:
        return 1 if self.shape.depthwise else len(self.channels)

    @property
    def tasks(self) -> int:
        return len(self.rows) * len(self.kernels) * self.k_steps

    def describe(self) -> str:
        s = self.shape
        return (f"{len(self.rows)} row tile(s) of <= {max(r.out_rows for r in self.rows)} output rows, "
                f"{len(self.kernels)} x {max(k.size for k in self.kernels)} output channels, "
                f"{len(self.channels)} x {max(c.size for c in self.channels)} input channels "
                f"(K accumulation: {self.kacc}; {s.in_dtype.value} -> {s.out_dtype.value})")


@dataclass(frozen=True)
class CbufSplit:
    data_entries: int
    data_banks: int
    weight_banks: int


def cbuf_split(profile: ChipProfile, dtype: DType, in_rows: int, width: int, channels: int,
               weight_bytes: int) -> CbufSplit:
    """The CBUF partition of one task (rule 2). Raises when the task does not fit."""
    p = profile.input(dtype)
    # a feature row (one input row, all its channels) fills whole 64-byte entries
    # (CNA_CBUF_CON1.DATA_ENTRIES; notes encodings/tile-layouts.md; conformance 01/04)
    entries = ceil_div(width * channels * p.esize, profile.cbuf_entry_bytes)
    fbytes = in_rows * entries * profile.cbuf_entry_bytes
    data = ceil_div(fbytes, profile.cbuf_bank_bytes) + p.feature_bank_slack
    wneed = ceil_div(weight_bytes, profile.cbuf_bank_bytes)
    if data + wneed > profile.cbuf_banks:
        raise LoweringError(
            f"a task of {in_rows} rows x {width} columns x {channels} channels ({dtype.value}) with "
            f"{weight_bytes} weight bytes needs {data} feature + {wneed} weight CBUF banks, more "
            f"than the {profile.cbuf_banks} of {profile.name}; split K, M or N into smaller tiles")
    return CbufSplit(entries, data, profile.cbuf_banks - data)


def weight_bytes_of(shape: ConvShape, profile: ChipProfile, kernels: int, channels: int) -> int:
    esize = profile.input(shape.in_dtype).esize
    if shape.depthwise:
        return channels * shape.kh * shape.kw * esize
    return kernels * shape.kh * shape.kw * channels * esize


def _input_window(shape: ConvShape, profile: ChipProfile, oy0: int, n: int) -> RowTile:
    """The input rows output rows [oy0, oy0+n) read (rule 4 applied)."""
    start = oy0 * shape.sy - shape.pad_top
    end = (oy0 + n - 1) * shape.sy - shape.pad_top + (shape.kh - 1) * shape.dy + 1
    r0 = max(0, start)
    if r0 >= shape.height:
        raise LoweringError(
            f"output rows {oy0}..{oy0 + n - 1} read only bottom padding (input has {shape.height} "
            f"rows); reduce the bottom padding or crop the output")
    r1 = min(shape.height, end)
    need = profile.min_feature_rows
    r1 = min(shape.height, max(r1, r0 + need))
    if r1 - r0 < need:
        raise LoweringError(
            f"output rows {oy0}..{oy0 + n - 1} read input rows {r0}..{r1 - 1}: fewer than the "
            f"{need} rows one {profile.name} task must read (notes: matmul-as-conv.md, "
            f"'height < 4 is broken'); give the input layout more rows")
    return RowTile(oy0, n, r0, r1 - r0, r0 - start)


def _balanced(total: int, limit: int, align: int) -> list[Span]:
    """Cut ``total`` into the fewest pieces <= limit, sizes whole ``align`` atoms as equal as
    they can be (the larger ones first); only the last piece may end off the atom grid."""
    atoms, cap = ceil_div(total, align), max(1, limit // align)
    n = ceil_div(atoms, cap)
    base, extra = divmod(atoms, n)
    out, s = [], 0
    for i in range(n):
        size = min((base + (i < extra)) * align, total - s)
        out.append(Span(s, size))
        s += size
    return out


def _check_shape(shape: ConvShape, profile: ChipProfile) -> None:
    enc = profile.encoding
    p = profile.input(shape.in_dtype)
    if shape.width > profile.max_feature_cols:
        raise LoweringError(
            f"input width {shape.width} exceeds the {profile.max_feature_cols} columns one "
            f"{profile.name} task reads (CNA_DATA_SIZE0.DATAIN_WIDTH); put the long axis on the "
            f"height (a 1-D conv runs with time on the rows, notes: encodings/whisper-encoder.md)")
    if shape.out_w > profile.cube_dim_limit:
        raise LoweringError(f"output width {shape.out_w} exceeds the DPU cube limit "
                            f"{profile.cube_dim_limit}")
    if shape.height < profile.min_feature_rows:
        raise LoweringError(f"the input cube has {shape.height} rows; a task reads at least "
                            f"{profile.min_feature_rows} (pad the layout with zero rows)")
    if shape.channels % p.k_align or (not shape.depthwise and shape.kernels % p.n_align):
        raise LoweringError(f"channels {shape.channels} / kernels {shape.kernels} are not padded "
                            f"to the {shape.in_dtype.value} atoms (K%{p.k_align}, N%{p.n_align})")
    if shape.depthwise and shape.channels % p.dw_group:
        raise LoweringError(f"depthwise channels {shape.channels} are not whole groups of "
                            f"{p.dw_group}")
    limits = [(shape.sy, "CNA_CONV_CON3", "CONV_Y_STRIDE", "stride"),
              (shape.sx, "CNA_CONV_CON3", "CONV_X_STRIDE", "stride"),
              (shape.dy - 1, "CNA_CONV_CON3", "ATROUS_Y_DILATION", "dilation - 1"),
              (shape.dx - 1, "CNA_CONV_CON3", "ATROUS_X_DILATION", "dilation - 1"),
              (shape.pad_left, "CNA_PAD_CON0", "PAD_LEFT", "left padding"),
              (shape.kh, "CNA_WEIGHT_SIZE2", "WEIGHT_HEIGHT", "kernel height"),
              (shape.kw, "CNA_WEIGHT_SIZE2", "WEIGHT_WIDTH", "kernel width")]
    for v, reg, fld, what in limits:
        top = field_limit(reg, fld, enc)
        if not 0 <= v <= top:
            raise LoweringError(f"{what} {v} does not fit {reg}.{fld} (0..{top})")
    if min(shape.sy, shape.sx, shape.dy, shape.dx, shape.kh, shape.kw) < 1:
        raise LoweringError("strides, dilations and kernel sizes must be >= 1")


def candidates(shape: ConvShape, profile: ChipProfile, *, max_rows: int | None = None,
               max_kernels: int | None = None, max_channels: int | None = None,
               max_k_steps: int | None = None) -> tuple[ConvPlan, ...]:
    """Every legal tiling of ``shape`` (rules 1-5), each with its rule cost, in the order the
    planner enumerates them (the first of least ``cost`` is the rule's choice); raises naming
    why none fits. ``max_*`` cap the tile sizes (tests, and matching a foreign program's forced
    tiling); they never lift a hardware limit. tile_choice.plan_conv picks among them."""
    caps = (max_rows, max_kernels, max_channels, max_k_steps)
    return memo(("tile_candidates", shape, profile, caps),
                lambda: _candidates(shape, profile, *caps))


def rule_choice(plans: tuple[ConvPlan, ...]) -> ConvPlan:
    """The fixed rule's pick: the least ``tasks + bytes_moved / cbuf_bytes`` (module docstring),
    the first enumerated on a tie."""
    return min(plans, key=lambda p: p.cost)


def _candidates(shape: ConvShape, profile: ChipProfile, max_rows: int | None,
                max_kernels: int | None, max_channels: int | None,
                max_k_steps: int | None) -> tuple[ConvPlan, ...]:
    if profile.encoding != "rk3588":
        raise LoweringError(f"the tile planner knows the RK3588 register encoding; chip "
                            f"{profile.name!r} uses {profile.encoding!r}")
    _check_shape(shape, profile)
    p = profile.input(shape.in_dtype)
    out = profile.output(shape.in_dtype, shape.out_dtype)
    enc = profile.encoding
    bank, banks, slack = profile.cbuf_bank_bytes, profile.cbuf_banks, p.feature_bank_slack
    max_ch = field_limit("CNA_DATA_SIZE1", "DATAIN_CHANNEL_REAL", enc) + 1
    max_perk = field_limit("CNA_WEIGHT_SIZE1", "WEIGHT_BYTES_PER_KERNEL", enc)
    max_kern = field_limit("CNA_WEIGHT_SIZE2", "WEIGHT_KERNELS", enc)
    max_atoms = field_limit("CNA_DATA_SIZE3", "DATAOUT_ATOMICS", enc)
    max_pad_top = field_limit("CNA_PAD_CON0", "PAD_TOP", enc)
    nalign = p.dw_group if shape.depthwise else p.n_align
    out_esize = out.esize
    halo = (shape.kh - 1) * shape.dy + 1

    plans: dict[tuple, ConvPlan] = {}
    why_not: list[str] = []
    n_k_steps = 1 if shape.depthwise else shape.channels // p.k_align
    seen_ct: set[int] = set()
    tried: set[tuple[int, int, int]] = set()
    # row tiles (or why none) by output rows per tile, kernel tiles by kernels per tile
    rows_of: dict[int, tuple[RowTile, ...] | str] = {}
    ksp_of: dict[int, tuple[Span, ...]] = {}
    for nk in range(1, min(n_k_steps, max_k_steps or n_k_steps) + 1):
        ct = shape.channels if shape.depthwise else round_up(ceil_div(shape.channels, nk), p.k_align)
        if ct in seen_ct or ceil_div(shape.channels, ct) != nk:
            continue
        seen_ct.add(ct)
        csp = None       # this K step's channel tiles, made when first needed
        if max_channels and ct > max_channels and not shape.depthwise:
            continue
        if ct > max_ch:
            why_not.append(f"{ct} channels exceed DATAIN_CHANNEL_REAL's {max_ch}")
            continue
        kacc = KACC_NONE if nk == 1 else (KACC_HOST if not p.chainable and shape.in_dtype.is_int
                                          else KACC_DPU if shape.in_dtype == DType.F16 else "")
        if not kacc:
            why_not.append(f"{shape.in_dtype.value} has no K-accumulation path")
            break
        for d in range(1, banks - slack):
            wb = banks - slack - d
            if shape.depthwise:
                # channel tiles drive both operands: feature and weights both scale with them
                cands = []
                top = min(shape.channels, max_kernels or shape.channels) // nalign * nalign
                for okt in range(top, 0, -nalign):
                    ent = ceil_div(shape.width * okt * p.esize, profile.cbuf_entry_bytes)
                    rows = min(profile.max_feature_rows, d * bank // (ent * profile.cbuf_entry_bytes))
                    if weight_bytes_of(shape, profile, 0, okt) <= wb * bank and rows >= halo:
                        cands.append((okt, rows))
                        break
                if not cands:
                    continue
                okt_max, ih_max = cands[0]
                ent = ceil_div(shape.width * okt_max * p.esize, profile.cbuf_entry_bytes)
            else:
                ent = ceil_div(shape.width * ct * p.esize, profile.cbuf_entry_bytes)
                ih_max = min(profile.max_feature_rows, d * bank // (ent * profile.cbuf_entry_bytes))
                perk = shape.kh * shape.kw * ct * p.esize
                if perk > max_perk:
                    why_not.append(f"{perk} weight bytes per kernel exceed WEIGHT_BYTES_PER_KERNEL")
                    break
                okt_max = min(shape.kernels, (wb * bank // perk) // nalign * nalign,
                              profile.cube_dim_limit // nalign * nalign, max_kern // nalign * nalign)
                if max_kernels:
                    okt_max = min(okt_max, max_kernels // nalign * nalign)
                if okt_max < nalign:
                    continue
            if ih_max < max(halo, profile.min_feature_rows):
                continue
            oh_max = min(shape.out_h, (ih_max - halo) // shape.sy + 1, profile.cube_dim_limit,
                         max_atoms // shape.out_w)
            if max_rows:
                oh_max = min(oh_max, max_rows)
            oh_max = oh_max // shape.row_align * shape.row_align
            if oh_max < 1:
                continue
            # the tiles below are a function of (ct, oh_max, okt_max) alone (kacc follows from
            # ct): once the caps bind, many bank splits d give the same ones, checked once
            if (ct, oh_max, okt_max) in tried:
                continue
            tried.add((ct, oh_max, okt_max))
            rows = rows_of.get(oh_max)
            if rows is None:
                try:
                    row_spans = _balanced(shape.out_h, oh_max, shape.row_align)
                    rows = tuple(_input_window(shape, profile, s.start, s.size) for s in row_spans)
                except LoweringError as e:
                    rows = str(e)
                rows_of[oh_max] = rows
            if isinstance(rows, str):
                why_not.append(rows)
                continue
            if any(r.pad_top > max_pad_top for r in rows):
                why_not.append(f"a row tile needs more than {max_pad_top} padding rows on top")
                continue
            if kacc == KACC_DPU and min(r.out_rows for r in rows) * shape.out_w < profile.ew_min_positions:
                why_not.append(f"a K-split tile with fewer than {profile.ew_min_positions} output "
                               f"positions cannot be accumulated by the DPU")
                continue
            ksp = ksp_of.get(okt_max)
            if ksp is None:
                ksp = ksp_of[okt_max] = tuple(_balanced(shape.kernels, okt_max, nalign))
            if shape.depthwise:
                csp = ksp
            elif csp is None:
                csp = tuple(_balanced(shape.channels, ct, p.k_align))
            # the real tiles must still fit (balancing never grows a tile past its maximum);
            # the check depends on a tile's size alone, so each size once, in the tiles' order
            # (the first that fails is the first tile that would)
            ih = max(r.in_rows for r in rows)
            try:
                for size in dict.fromkeys(k.size for k in ksp):
                    cw = size if shape.depthwise else max(c.size for c in csp)
                    cbuf_split(profile, shape.in_dtype, ih, shape.width, cw,
                               weight_bytes_of(shape, profile, size, cw))
            except LoweringError as e:
                why_not.append(str(e))
                continue
            if (rows, ksp, csp) not in plans:
                plan = ConvPlan(shape, rows, ksp, csp, kacc, 0.0)
                plans[(rows, ksp, csp)] = replace(plan, cost=_cost(plan, profile, out_esize))
    if not plans:
        detail = "; ".join(dict.fromkeys(why_not)) or "no tile fits the CBUF"
        raise LoweringError(
            f"no tiling of a {shape.height}x{shape.width}x{shape.channels} {shape.in_dtype.value} "
            f"input with {shape.kernels} {shape.kh}x{shape.kw} kernels fits {profile.name}: {detail}")
    return tuple(plans.values())


def _cost(plan: ConvPlan, profile: ChipProfile, out_esize: int) -> float:
    s = plan.shape
    esize = profile.input(s.in_dtype).esize
    nk = 1 if s.depthwise else len(plan.channels)
    feature = sum(r.in_rows for r in plan.rows) * s.width * s.channels * esize
    weights = weight_bytes_of(s, profile, s.kernels, s.channels)
    if not s.depthwise:
        feature *= len(plan.kernels)
    weights *= len(plan.rows)
    outb = s.out_h * s.out_w * s.kernels * out_esize
    # every K step but the last writes a 32-bit partial the next one reads (fp32 on the DPU,
    # k-accumulation.md; int32 for the host's sum), whatever the output's own element size
    partial = 2 * s.out_h * s.out_w * s.kernels * PARTIAL_ESIZE * (nk - 1)
    tasks = len(plan.rows) * len(plan.kernels) * nk
    return tasks + (feature + weights + outb + partial) / profile.cbuf_bytes
