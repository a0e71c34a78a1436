"""Element-wise ops with a run-time vector operand on the DPU: out[p, c] = x[p, c] OP s[p]
(LayerNorm's centring and scaling, softmax's row max), the row vector s arriving in the
row-vector cube form (``row_vector_layout``); and out[p, c] = x[p, c] OP v[c] for a run-time
channel vector (an attention mask's per-key bias) in the weight layout. One pass where a conv
task can cover every position (``_one_pass``); else, per row, the broadcast conv into a
scratch cube and a full EW pass."""
from __future__ import annotations

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, feature_layout, output_layout, weight_layout
from ..op_lowering import BufferSpec, OpLowering
from ..profile import ChipProfile
from ..regcmd import EmittedTask, LoweringError, Reloc
from ..tiling import ceil_div, round_up
from ..compile_cache import memoized
from .eltwise import (EW_VIEW_CHANNELS, check_fp16_cube, emit_conv_dpu, full_ew_tasks,
                      npu_program, part_bounds, resolve_profile)


def row_vector_layout(positions: int, profile: ChipProfile | str | None = None) -> CubeLayout:
    """The runtime per-row operand of build_binary_row: an fp16 cube of ``positions`` rows x
    32 channels whose channel 0 holds s[row], i.e. s[row] at byte 16*row. Only channel 0 is
    real input (DATAIN_CHANNEL_REAL = 0): the other bytes of the span may hold anything
    (the row max of a softmax arrives in this form)."""
    profile = resolve_profile(profile)
    return feature_layout(profile, DType.F16, positions, 1, EW_VIEW_CHANNELS)


def pack_row_vector(s: np.ndarray, profile: ChipProfile | str | None = None) -> np.ndarray:
    s = np.asarray(s, np.float16).reshape(-1)
    lay = row_vector_layout(s.size, profile)
    full = np.zeros((s.size, 1, EW_VIEW_CHANNELS), np.float16)
    full[:, 0, 0] = s
    return lay.pack(full)


def _bcast_tasks(profile: ChipProfile, src: str, positions: int, weights: str, out: str,
                 channels: int, name: str) -> list[EmittedTask]:
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
            f"broken'); use the scalar form (build_binary_scalar) for a single row")
    kernels = round_up(channels, p.n_align)
    r_max = profile.max_feature_rows // align * align
    # weights: ones in input channel 0 of each kernel, so out = s exactly (fp32 product by 1).
    # Kernel tiles keep the CBUF split legal.
    n_tile = _kernel_tile(profile, r_max, kernels)
    if n_tile is None:
        raise LoweringError(f"a per-row operand over {r_max}-row tiles: no kernel tile fits "
                            f"the CBUF")
    tasks = []
    for n0 in range(0, kernels, n_tile):
        nk = min(n_tile, kernels - n0)
        for m0, rows in _row_spans(positions, r_max, align):
            tasks.append(emit_conv_dpu(
                f"{name}{len(tasks)}", profile, feature=Reloc(src, m0 * atom), rows=rows,
                feature_surf_pitch=positions * atom,
                weights=Reloc(weights, n0 * EW_VIEW_CHANNELS * p.esize), kernels=nk,
                out=Reloc(out, (n0 // p.feature_c2) * positions * atom + m0 * atom),
                out_channels=nk, out_surf_stride=positions * atom, real_channels=1))
    return tasks


def _row_spans(rows: int, r_max: int, align: int) -> list[tuple[int, int]]:
    """(first row, rows) of a broadcast's row tiles: whole aligned tiles of at most ``r_max``,
    then the aligned part of the rest, then one aligned tile ending at the last row
    (overlapping its predecessor; the callers checked rows >= the 4-row floor)."""
    spans: list[tuple[int, int]] = []
    m0 = 0
    while rows - m0 >= align:
        n = min(r_max, (rows - m0) // align * align)
        spans.append((m0, n))
        m0 += n
    if m0 < rows:
        spans.append((rows - align, align))
    return spans


def bcast_range_tasks(profile: ChipProfile, src: str, positions: int, r0: int, rows: int,
                      weights: str, out: str, at: int, name: str, kernels: int | None = None
                      ) -> list[EmittedTask]:
    """Tasks writing out[p - r0, c] = src[p, channel 0] * w[c] for rows p in [r0, r0 + rows)
    of the row-vector cube ``src`` (``positions`` rows), w the first ``kernels`` (default one
    kernel group) of ``weights``: the cube at byte ``at`` of ``out``, dense over the range
    (surfaces rows * 16 B apart), so one surface of it is a flying EW operand lined up with
    the range's rows.
    Row tiles as ``_bcast_tasks`` (a ragged tail moved back to overlap its predecessor:
    scratch, rewritten with the same values)."""
    p = profile.input(DType.F16)
    atom = profile.atom_bytes
    align = profile.row_align
    if rows < profile.min_feature_rows:
        raise LoweringError(f"a per-row operand over {rows} rows: the broadcast conv needs at "
                            f"least {profile.min_feature_rows} feature rows (matmul-as-conv.md)")
    r_max = profile.max_feature_rows // align * align
    spans = _row_spans(rows, r_max, align)
    return [emit_conv_dpu(f"{name}{i}", profile, feature=Reloc(src, (r0 + m0) * atom), rows=n,
                          feature_surf_pitch=positions * atom, weights=Reloc(weights),
                          kernels=kernels or p.n_align, out=Reloc(out, at + m0 * atom),
                          out_channels=kernels or p.n_align, out_surf_stride=rows * atom,
                          real_channels=1)
            for i, (m0, n) in enumerate(spans)]


def _kernel_tile(profile: ChipProfile, positions: int, kernels: int) -> int | None:
    """The most kernels (halving from all of them) one flat-view conv task over ``positions``
    can hold beside its 32-channel feature in the CBUF and within a cube dimension, or None."""
    p = profile.input(DType.F16)
    bank = profile.cbuf_bank_bytes
    entries = ceil_div(EW_VIEW_CHANNELS * p.esize, profile.cbuf_entry_bytes)
    data_banks = ceil_div(positions * entries * profile.cbuf_entry_bytes, bank)
    n_tile = kernels
    while data_banks + ceil_div(n_tile * EW_VIEW_CHANNELS * p.esize, bank) > profile.cbuf_banks \
            or n_tile > profile.cube_dim_limit:
        if n_tile <= p.n_align:
            return None
        n_tile = round_up(n_tile // 2, p.n_align)
    return n_tile


def _row_fold(positions: int, profile: ChipProfile) -> tuple[int, int] | None:
    """(rows, width) folding ``positions`` into the lines of one conv task: the fewest lines
    of equal width within the task's row limit, or None (no such divisor)."""
    for width in range(1, positions + 1):
        if positions % width:
            continue
        rows = positions // width
        if rows < profile.min_feature_rows:
            return None
        if rows <= profile.max_feature_rows:
            return rows, width
    return None


# the ERDMA ALU op of a one-pass per-row op, and the sign of the broadcast (x - s = x + (-s))
_ONE_PASS = {"add": ("add", 1.0), "sub": ("add", -1.0), "mul": ("mul", 1.0),
             "max": ("max", 1.0), "min": ("min", 1.0)}


# the low part of a split per-row factor is stored scaled up by 2^12 (hi's relative rounding
# is at most 2^-11), so it stays a normal fp16 number where an unscaled one would be subnormal
# (a 1/1500 factor's low part is ~1e-7) and lose most of its bits; the conv scales it back
LO_SCALE = 2.0 ** -12


def _one_pass(op: str, layout: CubeLayout, reverse: bool, profile: ChipProfile, per: str,
              wide: bool = False, parts: int = 1, real: int | None = None) -> OpLowering | None:
    """x OP s in one pass, s one value per position (``per`` "row": input ``s``, the
    row-vector cube) or per channel (``per`` "channel": input ``c``, the vector in the weight
    layout [C, 1]). Each task's 1x1 conv broadcasts s -- row: weights +-1 on input channel 0
    of every kernel over the row vector; channel: the vector's weights over a constant
    feature of +-1 in channel 0 -- an exact fp32 product, and its EW stage combines the result
    with x, read by the ERDMA as the operand cube [kacc]. That operand must be dense over the
    task's positions (its surfaces exactly positions * 16 B apart), so one task covers every
    position of the cube, folded into lines (``_row_fold``); kernel tiles split the channels.
    None where that does not fit (s - x: the EW stage cannot negate its operand).

    ``wide`` (per row): x is an fp32 cube of ``layout``'s shape (a K partial's format, read as
    a 32-bit EW operand [kacc]) and s arrives split in two fp16 channels, s = hi + lo *
    LO_SCALE, summed exactly in fp32 by the conv (weights 1 and LO_SCALE on channels 0 and 1):
    the product is rounded once, into the fp16 output.

    ``real`` (per row): the value's own channel count where the cube holds more (padded for
    a consumer's K): the kernels past it broadcast 0, so those lanes keep x's padding (x OP 0;
    0 for mul). A row value there would make x - mean's padding -mean, whose square after a
    norm's per-row scale can overflow, and a ones-vector reduce's 0 * inf is NaN.

    ``parts`` > 1 (fp16 x only): the kernels are cut into that many ranges of whole kernel
    groups (``_kernel_parts``), each range one job (npu_program's bounds at its first output
    surface). A kernel range is a run of whole channel planes of x and out, so each job reads
    and writes the same bytes a flat-view op's job over those planes does (part_bounds puts
    the cuts on the same planes where it can), and placement keeps the chain of a norm's
    passes on the cores that hold its planes. The split only moves tasks: every output lane
    is the same conv product and EW operation."""
    if op == "sub" and reverse:
        return None
    p = profile.input(DType.F16)
    atom = profile.atom_bytes
    positions = layout.height * layout.width
    fold = _row_fold(positions, profile)
    if fold is None or positions < profile.ew_min_positions or \
            layout.surf_stride != positions * atom:
        return None
    rows, width = fold
    ew_op, sign = _ONE_PASS[op]
    kernels = round_up(layout.channels, p.n_align)
    n_tile = _kernel_tile(profile, positions, kernels)
    if n_tile is None:
        return None
    s_lay = row_vector_layout(positions, profile)
    wl = weight_layout(profile, DType.F16, kernels, EW_VIEW_CHANNELS)
    x_lay, x_c2 = layout, p.feature_c2
    if wide:
        x_lay = output_layout(profile, DType.F16, DType.F32, layout.height, layout.width,
                              layout.channels)
        x_c2 = profile.output(DType.F16, DType.F32).c2
        if x_lay.surf_stride != positions * atom:
            return None
    if per == "row":
        ones = np.zeros((kernels, EW_VIEW_CHANNELS), np.float16)
        ones[:real, 0] = sign
        if wide:
            ones[:real, 1] = LO_SCALE
        const = wl.pack(ones)
        feature, weights = "s", "ones"
        operand = BufferSpec("s", "input", s_lay.nbytes, layout=s_lay, bind=1)
    else:
        const = pack_row_vector(np.full(positions, sign, np.float16), profile)
        feature, weights = "ones", "c"
        vec = weight_layout(profile, DType.F16, layout.channels, 1)
        if vec.nbytes < wl.nbytes:
            return None
        operand = BufferSpec("c", "input", vec.nbytes, layout=vec, bind=1)
    cuts = _kernel_parts(layout, profile, parts) if parts > 1 and not wide else ()
    tasks = []
    for lo, hi in zip((0, *cuts), (*cuts, kernels)):
        for n0 in range(lo, hi, n_tile):
            tasks.append(_one_pass_task(profile, per, len(tasks), feature, weights, rows, width,
                                        positions, n0, min(n_tile, hi - n0), ew_op, x_c2, wide))
    span = (kernels // p.feature_c2) * positions * atom
    x_span = ceil_div(kernels, x_c2) * positions * atom
    bufs = [BufferSpec("x", "input", x_span, layout=x_lay, bind=0), operand,
            BufferSpec("out", "output", span, layout=layout, bind=0),
            BufferSpec("ones", "const", const.size, data=const)]
    bounds = tuple(c // p.feature_c2 * positions * atom for c in cuts)
    return npu_program(bufs, [tasks], profile, ("x", operand.name, "ones"), ("out",),
                       positions * kernels * EW_VIEW_CHANNELS, bounds)


def _one_pass_task(profile: ChipProfile, per: str, i: int, feature: str, weights: str,
                   rows: int, width: int, positions: int, n0: int, nk: int, ew_op: str,
                   x_c2: int, wide: bool) -> EmittedTask:
    """The one-pass conv task over kernels [n0, n0 + nk) and every position."""
    p = profile.input(DType.F16)
    atom = profile.atom_bytes
    return emit_conv_dpu(
        f"{per}{i}", profile, feature=Reloc(feature, 0), rows=rows, width=width,
        feature_surf_pitch=positions * atom,
        weights=Reloc(weights, n0 * EW_VIEW_CHANNELS * p.esize), kernels=nk,
        out=Reloc("out", (n0 // p.feature_c2) * positions * atom), out_channels=nk,
        out_surf_stride=positions * atom,
        ew=(ew_op, Reloc("x", (n0 // x_c2) * positions * atom), 4 if wide else 2),
        real_channels=2 if wide else 1)


def _kernel_parts(layout: CubeLayout, profile: ChipProfile, parts: int) -> tuple[int, ...]:
    """The interior kernel cuts of up to ``parts`` kernel ranges of whole kernel groups: the
    flat-view cuts (eltwise.part_bounds over the cube's bytes) that fall on a kernel group's
    first surface, so a one-pass job covers the very planes a flat-view job over the same
    cube does; where one does not, the kernel group nearest its share."""
    p = profile.input(DType.F16)
    plane = layout.height * layout.width * profile.atom_bytes
    group = p.n_align // p.feature_c2 * plane           # bytes of one kernel group's planes
    kernels = round_up(layout.channels, p.n_align)
    cuts: list[int] = []
    flat = part_bounds(layout.nbytes, profile, parts)
    for j in range(1, parts):
        b = flat[j - 1] if len(flat) == parts - 1 else -1
        if b > 0 and b % group == 0:
            k = b // plane * p.feature_c2
        else:
            k = round(j * kernels / parts / p.n_align) * p.n_align
        if (cuts[-1] if cuts else 0) < k < kernels:
            cuts.append(k)
    return tuple(cuts)


@memoized
def build_row_scale_wide(layout: CubeLayout, profile: ChipProfile | str | None = None
                         ) -> OpLowering:
    """out[p, c] = x[p, c] * (hi[p] + lo[p]) into the fp16 cube ``layout``, x the fp32 cube of
    the same shape (input ``x``, bind 0) and the per-row factor split in channels 0 and 1 of
    the row-vector cube (input ``s``, bind 1): a deferred softmax's normalisation of its fp32
    e @ v (ir/passes/softmax_dot.py) in one pass, the factor good to ~2^-22, the product rounded
    once. Raises where one task cannot cover the positions (the caller divides on the host)."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, "a per-row scale of an fp32 cube")
    prog = _one_pass("mul", layout, False, profile, "row", wide=True)
    if prog is None:
        raise LoweringError(f"a per-row scale of an fp32 cube: no one-pass form for "
                            f"{layout.height}x{layout.width} positions")
    return prog


@memoized
def build_binary_channel_runtime(op: str, layout: CubeLayout, reverse: bool = False,
                                 profile: ChipProfile | str | None = None) -> OpLowering:
    """out[p, c] = x[p, c] OP v[c] (v OP x with ``reverse``) with v a run-time vector (an
    attention mask's per-key bias): one pass (``_one_pass``) reading v in the weight layout
    [C, 1] (input ``c``, bind 1; the pipeline packs it there). Raises where one task cannot
    cover the cube's positions (the caller keeps the broadcast form)."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a run-time channel vector")
    prog = _one_pass(op, layout, reverse, profile, "channel")
    if prog is None:
        raise LoweringError(f"element-wise {op} with a run-time channel vector: no one-pass "
                            f"form for {layout.height}x{layout.width} positions"
                            + (" (v - x)" if op == "sub" and reverse else ""))
    return prog


@memoized
def build_binary_row(op: str, layout: CubeLayout, reverse: bool = False,
                     profile: ChipProfile | str | None = None, parts: int = 1,
                     real: int | None = None) -> OpLowering:
    """out[p, c] = x[p, c] OP s[p] (s OP x with ``reverse``) with s a run-time vector, one
    value per position p = h * W + w (a matrix cube's rows).

    Buffers: ``x`` (input 0), ``s`` (input 1, ``row_vector_layout(H*W)``: s in channel 0),
    ``out`` (output 0), ``bcast`` (scratch: the broadcast cube), ``ones`` (const),
    ``regcmd``. Two passes: the broadcast conv tasks, then the flying EW tasks. ``parts``
    > 1 offers the one-pass form's kernel ranges as that many jobs (``_one_pass``); ``real``
    the value's channel count where the cube is padded past it (``_one_pass``)."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, f"element-wise {op} with a per-row vector")
    one = _one_pass(op, layout, reverse, profile, "row", parts=parts, real=real)
    if one is not None:
        return one
    p = profile.input(DType.F16)
    positions = layout.height * layout.width
    kernels = round_up(layout.channels, p.n_align)
    # the broadcast cube holds whole kernel groups of surfaces: same strides as x, maybe one
    # more surface than x at the end
    bcast_bytes = (kernels // p.feature_c2) * positions * profile.atom_bytes
    ones = np.zeros((kernels, EW_VIEW_CHANNELS), np.float16)
    ones[:real, 0] = 1.0       # padding lanes broadcast 0 (``_one_pass``)
    wl = weight_layout(profile, DType.F16, kernels, EW_VIEW_CHANNELS)
    ones_packed = wl.pack(ones)
    tasks = _bcast_tasks(profile, "s", positions, "ones", "bcast", layout.channels, "bcast")
    a, b = ("bcast", "x") if reverse else ("x", "bcast")
    ew, span = full_ew_tasks(op, a, b, "out", layout.nbytes, profile)
    s_lay = row_vector_layout(positions, profile)
    bufs = [BufferSpec("x", "input", span, layout=layout, bind=0),
            BufferSpec("s", "input", s_lay.nbytes, layout=s_lay, bind=1),
            BufferSpec("out", "output", span, layout=layout, bind=0),
            # the flying EW pass reads bcast over x's bytes only (span <= bcast_bytes), lane
            # by lane: no stale byte reaches a real output
            BufferSpec("bcast", "scratch", max(bcast_bytes, span)),
            BufferSpec("ones", "const", ones_packed.size, data=ones_packed)]
    return npu_program(bufs, [tasks, ew], profile, ("x", "s", "ones"), ("out",),
                       positions * kernels * EW_VIEW_CHANNELS)
