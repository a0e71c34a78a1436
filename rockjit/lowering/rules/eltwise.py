"""Element-wise IR ops -> DPU element-wise / LUT OpCalls on fp16 cubes.

Element-wise ops preserve the cube (notes: encodings/cross-op-chaining.md), so the operand's
existing cube form is kept and the result takes the same form: no host round trip between a
matmul and its bias add / activation. The operand shapes decide the datapath:

  x OP y, both run-time, same shape        -> eltwise.build_binary        (flat view)
  x OP c, c a compile-time scalar          -> eltwise.build_binary_scalar (flat view)
  x OP v[c], v a compile-time channel vector -> eltwise.build_binary_channel (one cube)
  x OP s[row], s a run-time per-row vector  -> eltwise.build_binary_row   (one cube)
  f(x) for a LUT function                   -> lut emitter, domain from the function
                                              (calibrate.lut_domain), else the host

Everything else (a division by a run-time tensor, pow, integer math) has no DPU form and goes
to the host rules.
"""
from __future__ import annotations

import math
import numpy as np

from ...ir.ops import Op
from ...ir.activations import ACTIVATIONS
from ...ir.types import DType
from ..arith import round_up
from ..compile_cache import memo_of_array
from ..const_views import uniform_value
from ..layouts import CubeLayout, feature_layout
from ..regcmd import LoweringError
from .base import (CubeForm, NoNpuForm, OpCall, RuleContext, RuleResult, Use,
                   npu_dtype_of)
from .eltwise_vectors import (channel_calls, channel_source, deferred_division_calls,
                              flat_layout, flat_parts, one_cube, recip_rows, row_calls,
                              row_source)
from .forms import cube_form
from .row_chain import row_split_cuts

BINARY = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.MAX: "max", Op.MIN: "min"}


def canonical_layout(ctx: RuleContext, shape: tuple[int, ...]) -> CubeLayout:
    """The cube a float tensor gets when nothing chose one: a matrix cube with rows padded
    like a matmul's M (>= 4, multiple of 4) and channels like its K (multiple of 32), so a
    following matmul reads it in place (notes: matmul-as-conv.md, alignment)."""
    prof = ctx.profile
    p = prof.input(DType.F16)
    c = shape[-1] if shape else 1
    m = int(math.prod(shape[:-1])) if len(shape) > 1 else 1
    return feature_layout(prof, DType.F16, max(prof.min_feature_rows, round_up(m, prof.row_align)),
                          1, round_up(c, p.k_align))


def operand_form(ctx: RuleContext, v) -> CubeForm:
    """The cube form ``v`` is (or will be) held in for a lane-wise op."""
    for f in ctx.forms(v):
        if isinstance(f, CubeForm):
            return f
    return cube_form(canonical_layout(ctx, v.type.shape), v.type.shape,
                     ("b",) * (len(v.type.shape) - 2) + ("h", "c") if len(v.type.shape) >= 2
                     else ("c",))


def _channel_vector(c: np.ndarray) -> np.ndarray | None:
    a = np.asarray(c)
    if a.ndim == 0:
        return None
    # a broadcast's repeated rows are one row: compared once, not copied
    ref = _cut_repeats(a, a.ndim - 1).reshape(-1, a.shape[-1])
    return ref[0].copy() if np.all(ref == ref[0]) else None


def _channel_vector_of(c: np.ndarray, form: CubeForm) -> np.ndarray | None:
    """The per-channel vector of a constant broadcast over every axis but the cube's channel
    axis (wherever that axis sits in the value: NCHW's axis 1, a matrix's last), or None."""
    a = np.asarray(c)
    # a read of the constant's values, the same for every layer's identical constant (a
    # shared table): once per array, roles and shape in a compile (compile_cache.py); the
    # vector is only read by the callers
    return memo_of_array("channel_vector", a, lambda: _scan_channel_vector(a, form),
                         form.roles, tuple(form.shape))


def _scan_channel_vector(a: np.ndarray, form: CubeForm) -> np.ndarray | None:
    if a.ndim == 0 or "c" not in form.roles or a.shape != tuple(form.shape):
        return _channel_vector(a) if a.ndim and form.roles[-1:] == ("c",) else None
    ax = form.roles.index("c")
    # the repeats of a broadcast (stride-0 axes other than the channels) hold the first row's
    # values again: cut to one (const_views.py), the comparison reads each distinct row once
    moved = np.moveaxis(_cut_repeats(a, ax), ax, -1).reshape(-1, a.shape[ax])
    return moved[0].copy() if np.all(moved == moved[0]) else None


def _cut_repeats(a: np.ndarray, keep: int) -> np.ndarray:
    """``a`` with each stride-0 axis but ``keep`` cut to index 0 (const_views.py): the rows
    such an axis repeats are the same bytes, so a test over all of them reads each once."""
    return a[tuple(slice(0, 1) if st == 0 and i != keep else slice(None)
                   for i, st in enumerate(a.strides))]


# A per-row statistic (LayerNorm's mean and variance, softmax's max and sum) is O(rows): once
# it is on the host (a reduce's tail), packing it into a cube for one DPU pass and unpacking
# the result costs more than the host's arithmetic on it (design.md: host steps for the small
# scalar tails).
SMALL_HOST_ELEMENTS = 1 << 14   # the error oracle (oracle/tolerance.py) reads this one too


def prefer_host(ctx: RuleContext, *values) -> None:
    """NoNpuForm when every run-time operand is a small vector held off the fp16 cubes."""
    run = [v for v in values if ctx.const(v) is None]
    if not run:
        return
    for v in run:
        if v.type.size > SMALL_HOST_ELEMENTS:
            return
        if any(isinstance(f, CubeForm) and f.dtype is DType.F16 for f in ctx.forms(v)):
            return
        if v in ctx.graph_inputs:
            return
        if not ctx.forms(v):
            return
    raise NoNpuForm(f"a per-row vector of {run[0].type.size} elements already on the host: "
                    f"the host tail is cheaper than a pack/unpack trip through the NPU")


def lower_div_op(ctx: RuleContext) -> RuleResult:
    """x / c (a compile-time scalar) -> x * fp16(1/c) on the DPU; x / s[row] (a run-time
    per-row value: softmax's sum, LayerNorm's deviation) -> the host reciprocal of the O(rows)
    vector + an NPU per-row multiply. Anything else has no DPU form (the DPU cannot divide)."""
    from ..emitters import eltwise as ew

    node = ctx.node
    x, y = node.inputs
    if npu_dtype_of(node.out.type.dtype) is not DType.F16:
        raise NoNpuForm(f"{node.out.type.dtype.value} division runs on the host")
    shape = node.out.type.shape
    if x.id in ctx.fp32_values:
        # a deferred softmax's normalisation of its fp32 e @ v (ir/passes/softmax_dot.py)
        srow = row_source(ctx, y, shape)
        if srow is None:
            raise NoNpuForm("a deferred softmax's row sums that are not a per-row vector")
        try:
            return RuleResult(deferred_division_calls(ctx, x, srow, shape),
                              note="1/s split hi + lo on the host, x * (hi + lo) on the NPU")
        except LoweringError as e:
            raise NoNpuForm(f"the deferred softmax division: {e}; divided on the host in "
                            f"f32") from None
    prefer_host(ctx, x, y)
    if ctx.const(x) is not None or x.type.shape != shape:
        raise NoNpuForm("a division of a constant by a tensor (no DPU reciprocal of a tensor)")
    cy = ctx.const(y)
    form = operand_form(ctx, x)
    try:
        if cy is not None:
            c = uniform_value(cy)
            if c is None or c == 0 or not np.isfinite(1.0 / c):
                raise NoNpuForm("a division by a constant that is not a non-zero scalar")
            flat = flat_layout(form)
            if flat is None:
                raise NoNpuForm("operand cubes are not one dense run")
            prog = ew.build_binary_scalar("mul", flat, 1.0 / c, False, ctx.profile,
                                          flat_parts(ctx, form))
            return RuleResult([OpCall(prog, (Use(x),), (Use(node.out),), "div scalar",
                                      emitter="eltwise.lower_binary_scalar (x * 1/c)",
                                      forms_in=(form,), forms_out=(form,))])
        srow = row_source(ctx, y, shape)
        if srow is None:
            raise NoNpuForm("a division by a full run-time tensor (no DPU divide)")
        if not srow.type.dtype.is_float:
            raise NoNpuForm("an integer divisor")
        recip, r = recip_rows(ctx, srow, form, shape)
        rows = row_calls(ctx, "mul", x, r, False, form, shape,
                          srow_use_shape=r.type.shape)
        return RuleResult([recip] + rows, note="1/s on the host (O(rows)), x * (1/s) on the NPU")
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None


def _dense_f16_operand(ctx: RuleContext, x) -> tuple:
    """(form, one dense layout) of a single fp16 operand a flying DPU pass reads whole; refuses
    (NoNpuForm, the host runs it) for other dtypes or operands that are not one dense run."""
    node = ctx.node
    if npu_dtype_of(node.out.type.dtype) is not DType.F16:
        raise NoNpuForm(f"{node.out.type.dtype.value} math runs on the host")
    prefer_host(ctx, x)
    form = operand_form(ctx, x)
    flat = flat_layout(form)
    if flat is None:
        raise NoNpuForm("operand cubes are not one dense run")
    return form, flat


def lower_square(ctx: RuleContext) -> RuleResult:
    """x ** 2 -> x * x on the DPU (the two-operand EW multiply of one cube with itself)."""
    from ..emitters import eltwise as ew

    node = ctx.node
    x = node.inputs[0]
    if node.attrs["y"] != 2:
        raise NoNpuForm(f"integer_pow with exponent {node.attrs['y']} (only squares map to one "
                        f"DPU multiply)")
    form, flat = _dense_f16_operand(ctx, x)
    try:
        prog = ew.build_binary("mul", flat, ctx.profile, flat_parts(ctx, form))
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    return RuleResult([OpCall(prog, (Use(x), Use(x)), (Use(node.out),), "square",
                              emitter="eltwise.lower_binary (x * x)", forms_in=(form, form),
                              forms_out=(form,))])


def lower_neg(ctx: RuleContext) -> RuleResult:
    """-x -> x * -1 on the flying DPU (exact in fp16)."""
    from ..emitters import eltwise as ew

    node = ctx.node
    x = node.inputs[0]
    form, flat = _dense_f16_operand(ctx, x)
    try:
        prog = ew.build_binary_scalar("mul", flat, -1.0, False, ctx.profile, flat_parts(ctx, form))
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    return RuleResult([OpCall(prog, (Use(x),), (Use(node.out),), "neg",
                              emitter="eltwise.lower_binary_scalar (x * -1)", forms_in=(form,),
                              forms_out=(form,))])


def _scaled_square(ctx: RuleContext) -> RuleResult | None:
    """``(x 2^-s)^2`` read from x in one pass (rules/scaled_square.py), or None: the square
    of its operand as usual (the pipeline then lowers the prescale too)."""
    from ..emitters import eltwise as ew

    _, x, s = ctx.prescaled[ctx.node.out.id]
    form, flat = _dense_f16_operand(ctx, x)
    if row_split_cuts(ctx, form):
        return None
    try:
        prog = ew.build_scaled_square(flat, s, ctx.profile, flat_parts(ctx, form))
    except LoweringError:
        return None
    return RuleResult([OpCall(prog, (Use(x), Use(x)), (Use(ctx.node.out),), "scaled square",
                              emitter="eltwise.build_scaled_square", forms_in=(form, form),
                              forms_out=(form,))],
                      note=f"(x 2^-{s})^2 from x in one pass")


def lower_binary_op(ctx: RuleContext) -> RuleResult:
    from ..emitters import eltwise as ew
    from ..emitters import eltwise_rows as ew_rows

    node = ctx.node
    if node.out.id in ctx.prescaled:
        res = _scaled_square(ctx)
        if res is not None:
            return res
    op = BINARY[node.op]
    x, y = node.inputs
    prefer_host(ctx, x, y)
    if npu_dtype_of(node.out.type.dtype) is not DType.F16:
        raise NoNpuForm(f"{node.out.type.dtype.value} element-wise math runs on the host")
    shape = node.out.type.shape
    cx, cy = ctx.const(x), ctx.const(y)
    if cx is not None and cy is not None:
        raise NoNpuForm("both operands are constants (folded at compile time)")
    reverse = cx is not None
    run, const = (y, cx) if reverse else (x, cy)
    if run.type.shape != shape:
        raise NoNpuForm("an operand broadcast inside the op")
    form = operand_form(ctx, run)
    try:
        if const is not None:
            s = uniform_value(const)
            cuts = row_split_cuts(ctx, form) if s is not None else ()
            if cuts:
                prog = ew_rows.build_scalar_rows(op, form.layout, s, reverse, ctx.profile, cuts)
                return RuleResult([OpCall(prog, (Use(run),), (Use(node.out),),
                                          f"{op} scalar rows", emitter="eltwise_rows.scalar",
                                          forms_in=(form,), forms_out=(form,))])
            if s is not None:
                flat = flat_layout(form)
                if flat is None:
                    raise NoNpuForm("operand cubes are not one dense run")
                prog = ew.build_binary_scalar(op, flat, s, reverse, ctx.profile,
                                              flat_parts(ctx, form))
                return RuleResult([OpCall(prog, (Use(run),), (Use(node.out),), f"{op} scalar",
                                          emitter="eltwise.lower_binary_scalar",
                                          forms_in=(form,), forms_out=(form,))])
            vec = _channel_vector_of(const, form)
            if vec is not None and one_cube(form):
                lay = form.layout
                v = np.zeros(lay.channels, np.float32)
                v[:vec.size] = vec
                prog = ew.build_binary_channel(op, lay, v.astype(np.float16), reverse, ctx.profile,
                                               flat_parts(ctx, form))
                return RuleResult([OpCall(prog, (Use(run),), (Use(node.out),), f"{op} channel",
                                          emitter="eltwise.lower_binary_channel",
                                          forms_in=(form,), forms_out=(form,))])
            if np.shape(const) == shape and flat_layout(form) is not None:
                # a whole constant tensor (a positional embedding): packed into the operand's
                # cube form once at compile time, combined as two full cubes
                flat = flat_layout(form)
                prog = ew.build_binary(op, flat, ctx.profile, flat_parts(ctx, form))
                cv = x if reverse else y
                return RuleResult([OpCall(prog, (Use(x), Use(y)), (Use(node.out),),
                                          f"{op} const tensor", emitter="eltwise.lower_binary "
                                          "(constant cube)", forms_in=(form, form),
                                          forms_out=(form,))], note=f"%{cv.id} packed once")
            raise NoNpuForm("a constant operand that is neither a scalar nor a channel vector")
        other = y if run is x else x
        srow = row_source(ctx, other, shape)
        if srow is not None:
            if form.roles[-1:] != ("c",) or "c" in form.roles[:-1]:
                # build_binary_row adds one value per cube line (H): a transposed view keeps
                # the value's rows in the channels, where the per-row vector would be applied
                # along the wrong axis (fuzzer: h - max(h, -1) of swapaxes(swapaxes(x) * 1))
                raise NoNpuForm("a per-row operand on a transposed cube (rows in the channels)")
            if len(form.batch_items()) > 1:
                # per-cube calls address the row vector by the cubes' batch index
                bshape = shape[:len(form.batch_items()[0][0])]
                rows = form.sub(form.batch_items()[0][0])[0].hwc()[0]
                if tuple(srow.type.shape) != bshape + (rows,):
                    raise NoNpuForm("a per-row operand not shaped like the operand's rows")
            # one call per head, independent: one step of jobs placement spreads by cost
            # (as separate steps each went wherever its data was, all to one core)
            return RuleResult(row_calls(ctx, op, run, srow, run is y, form, shape),
                              parallel=True)
        csrc = channel_source(ctx, other, shape)
        if csrc is not None:
            try:
                return RuleResult(channel_calls(ctx, op, run, csrc, run is y, form),
                                  parallel=True)
            except (LoweringError, NoNpuForm):
                pass   # v - x, or positions one pass cannot cover: the broadcast form below
        if other.type.shape != shape:
            raise NoNpuForm("operand shapes differ")
        cuts = row_split_cuts(ctx, form) if x is y and op in ew_rows.FLYING_OPS else ()
        if cuts:
            # a square feeding a feature reduce: by the reduce's rows (rules/row_chain.py)
            prog = ew_rows.build_binary_rows(op, form.layout, ctx.profile, cuts)
            return RuleResult([OpCall(prog, (Use(x), Use(y)), (Use(node.out),), f"{op} rows",
                                      emitter="eltwise_rows.binary", forms_in=(form, form),
                                      forms_out=(form,))])
        flat = flat_layout(form)
        if flat is None:
            raise NoNpuForm("operand cubes are not one dense run")
        prog = ew.build_binary(op, flat, ctx.profile, flat_parts(ctx, form))
        return RuleResult([OpCall(prog, (Use(x), Use(y)), (Use(node.out),), op,
                                  emitter="eltwise.lower_binary",
                                  forms_in=(form, form), forms_out=(form,))])
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None


LUT_FUNCS = {Op.EXP: "exp", Op.TANH: "tanh", Op.LOGISTIC: "sigmoid", Op.RSQRT: "rsqrt"}


def lower_lut_op(ctx: RuleContext) -> RuleResult:
    """A transcendental on the DPU LUT (emitters/lut.build_activation) over the domain the
    function itself gives (calibrate.lut_domain). Outside the domain the emitter clamps the
    input to the table's ends (f(clamp(x)); lut.py module docstring), which that domain makes
    harmless."""
    from ..calibrate import is_max_subtracted

    node = ctx.node
    kind = LUT_FUNCS[node.op]
    if kind == "exp" and is_max_subtracted(ctx.producer, ctx.const, node.inputs[0]):
        # softmax's exp: the squared half-exponent table (emitters/lut.py, exp_sq): a one-pass
        # Q0.15 exp table is off by percents for the many small keys of a long row
        return lut_result(ctx, "exp_sq", node.inputs[0], node.out, domain_kind="exp")
    return lut_result(ctx, kind, node.inputs[0], node.out)


def lower_activation_op(ctx: RuleContext) -> RuleResult:
    """A fused composite activation (``activation{kind}``, ir/passes/fuse.py) as one LUT
    activation; without a LUT form the partitioner takes its host expansion (host_rules)."""
    node = ctx.node
    return lut_result(ctx, node.attrs["kind"], node.inputs[0], node.out)


def lut_result(ctx: RuleContext, kind: str, x, out, note: str = "",
               domain_kind: str | None = None) -> RuleResult:
    """``out = kind(x)`` as one LUT activation (also the lowering of a fused composite
    activation, ``lower_activation_op``)."""
    from ..calibrate import npu_lut_domain
    from ..emitters import lut

    if npu_dtype_of(out.type.dtype) is not DType.F16:
        raise NoNpuForm("integer LUT")
    prefer_host(ctx, x)
    domain = npu_lut_domain(ctx, domain_kind or kind, x)
    if domain is None:
        # a table domain could only come from data, and a later call's wider input would be
        # clamped silently: f32 on the host is right for every input (calibrate.py)
        raise NoNpuForm(f"{kind} of a value with no data-independent table domain (only a "
                        f"softmax's max-subtracted exp and saturating functions have one)")
    form = operand_form(ctx, x)
    flat = flat_layout(form)
    if flat is None:
        raise NoNpuForm("operand cubes are not one dense run")
    try:
        passes = 2 if ACTIVATIONS[kind].post in ("gate", "square", "affine") else 1
        prog = lut.build_activation(kind, flat, domain, ctx.profile,
                                    flat_parts(ctx, form, passes))
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    return RuleResult([OpCall(prog, (Use(x),), (Use(out),), f"lut {kind}",
                              emitter=f"lut.lower_activation[{kind}]", forms_in=(form,),
                              forms_out=(form,))],
                      note=f"{kind} domain {domain}" + (f"; {note}" if note else ""))


RULES = {op: lower_binary_op for op in BINARY}
RULES.update({op: lower_lut_op for op in LUT_FUNCS})
RULES.update({Op.ACTIVATION: lower_activation_op, Op.DIV: lower_div_op, Op.INTEGER_POW: lower_square, Op.NEG: lower_neg})
