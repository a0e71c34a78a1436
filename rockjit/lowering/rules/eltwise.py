"""Element-wise IR ops -> DPU element-wise / LUT OpCalls on fp16 cubes.

Element-wise ops preserve the cube (notes: encodings/cross-op-chaining.md), so the operand's
existing cube form is kept and the result takes the same form: no host round trip between a
matmul and its bias add / activation. The operand shapes decide the datapath:

  x OP y, both run-time, same shape        -> eltwise.lower_binary        (flat view)
  x OP c, c a compile-time scalar          -> eltwise.lower_binary_scalar (flat view)
  x OP v[c], v a compile-time channel vector -> eltwise.lower_binary_channel (one cube)
  x OP s[row], s a run-time per-row vector  -> eltwise.lower_binary_row   (one cube)
  f(x) for a LUT function                   -> lut emitter, domain from calibration

Everything else (a division by a run-time tensor, pow, integer math) has no DPU form and goes
to the host rules.
"""
from __future__ import annotations

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ..layouts import CubeLayout, feature_layout
from ..regcmd import LoweringError
from .base import CubeForm, NoNpuForm, OpCall, RuleContext, RuleResult, Use, npu_dtype_of
from .forms import cube_form

BINARY = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.MAX: "max", Op.MIN: "min"}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def canonical_layout(ctx: RuleContext, shape: tuple[int, ...]) -> CubeLayout:
    """The cube a float tensor gets when nothing chose one: a matrix cube with rows padded
    like a matmul's M (>= 4, multiple of 4) and channels like its K (multiple of 32), so a
    following matmul reads it in place (notes: matmul-as-conv.md, alignment)."""
    prof = ctx.profile
    p = prof.input(DType.F16)
    c = shape[-1] if shape else 1
    m = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return feature_layout(prof, DType.F16, max(prof.min_feature_rows, _round_up(m, prof.row_align)),
                          1, _round_up(c, p.k_align))


def operand_form(ctx: RuleContext, v) -> CubeForm:
    """The cube form ``v`` is (or will be) held in for a lane-wise op."""
    for f in ctx.forms(v):
        if isinstance(f, CubeForm):
            return f
    return cube_form(canonical_layout(ctx, v.type.shape), v.type.shape,
                     ("b",) * (len(v.type.shape) - 2) + ("h", "c") if len(v.type.shape) >= 2
                     else ("c",))


def _flat_layout(form: CubeForm) -> CubeLayout | None:
    """A layout spanning every cube of ``form`` when they tile one dense run of bytes (so a
    lane-wise op can treat them as one flat cube); None otherwise."""
    items = sorted(off for _, off in form.batch_items())
    n = form.layout.nbytes
    if any(b - a != n for a, b in zip(items, items[1:])) or items[0] != 0:
        return None
    total = n * len(items)
    atom = form.layout.c2 * form.layout.esize
    return CubeLayout(total // atom, 1, form.layout.c2, form.layout.c2, form.layout.dtype)


def _scalar(c: np.ndarray) -> float | None:
    flat = np.asarray(c).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return None


def _channel_vector(c: np.ndarray) -> np.ndarray | None:
    a = np.asarray(c)
    if a.ndim == 0:
        return None
    ref = a.reshape(-1, a.shape[-1])
    return ref[0].copy() if np.all(ref == ref[0]) else None


def _row_source(ctx: RuleContext, v, shape: tuple[int, ...]):
    """If ``v`` is a broadcast of a run-time per-row vector (every axis but the last), that
    vector's value; else None."""
    prod = ctx.producer(v)
    if prod is None or prod.op is not Op.BROADCAST_IN_DIM or ctx.const(v) is not None:
        return None
    src = prod.inputs[0]
    while True:
        p2 = ctx.producer(src)
        if p2 is not None and p2.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE) and \
                int(np.prod(p2.inputs[0].type.shape, dtype=np.int64)) == \
                int(np.prod(src.type.shape, dtype=np.int64)):
            src = p2.inputs[0]
            continue
        break
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if int(np.prod(src.type.shape, dtype=np.int64)) != rows:
        return None
    dims = tuple(prod.attrs["broadcast_dimensions"])
    # the broadcast must keep the leading axes and add the last
    if len(shape) - 1 in dims and prod.inputs[0].type.shape[dims.index(len(shape) - 1)] != 1:
        return None
    return src


def lower_binary_op(ctx: RuleContext) -> RuleResult:
    from ..emitters import eltwise as ew

    node = ctx.node
    op = BINARY[node.op]
    x, y = node.inputs
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
            s = _scalar(const)
            if s is not None:
                flat = _flat_layout(form)
                if flat is None:
                    raise NoNpuForm("operand cubes are not one dense run")
                prog = ew.lower_binary_scalar(op, flat, s, reverse, ctx.profile)
                return RuleResult([OpCall(prog, (Use(run),), (Use(node.out),), f"{op} scalar",
                                          emitter="eltwise.lower_binary_scalar",
                                          forms_in=(form,), forms_out=(form,))])
            vec = _channel_vector(const)
            if vec is not None and len(form.batch_items()) == 1:
                lay = form.layout
                v = np.zeros(lay.channels, np.float32)
                v[:vec.size] = vec
                prog = ew.lower_binary_channel(op, lay, v.astype(np.float16), reverse, ctx.profile)
                return RuleResult([OpCall(prog, (Use(run),), (Use(node.out),), f"{op} channel",
                                          emitter="eltwise.lower_binary_channel",
                                          forms_in=(form,), forms_out=(form,))])
            raise NoNpuForm("a constant operand that is neither a scalar nor a channel vector")
        other = y if run is x else x
        srow = _row_source(ctx, other, shape)
        if srow is not None and len(form.batch_items()) == 1:
            lay = form.layout
            if lay.width != 1:
                raise NoNpuForm("per-row operand on a cube with W > 1")
            prog = ew.lower_binary_row(op, lay, run is y, ctx.profile)
            nrows = int(np.prod(srow.type.shape, dtype=np.int64))
            s_form = cube_form(ew.row_vector_layout(lay.height * lay.width, ctx.profile),
                               (nrows, 1))
            return RuleResult([OpCall(prog, (Use(run), Use(srow, shape=(nrows, 1))),
                                      (Use(node.out),), f"{op} row",
                                      emitter="eltwise.lower_binary_row",
                                      forms_in=(form, s_form), forms_out=(form,))])
        if other.type.shape != shape:
            raise NoNpuForm("operand shapes differ")
        flat = _flat_layout(form)
        if flat is None:
            raise NoNpuForm("operand cubes are not one dense run")
        prog = ew.lower_binary(op, flat, ctx.profile)
        return RuleResult([OpCall(prog, (Use(x), Use(y)), (Use(node.out),), op,
                                  emitter="eltwise.lower_binary",
                                  forms_in=(form, form), forms_out=(form,))])
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None


LUT_FUNCS = {Op.EXP: "exp", Op.TANH: "tanh", Op.LOGISTIC: "sigmoid", Op.RSQRT: "rsqrt"}


def lower_lut_op(ctx: RuleContext) -> RuleResult:
    """A transcendental on the DPU LUT (emitters/lut.lower_activation) over the calibrated
    domain widened by a margin (calibrate.lut_domain). Outside the domain the emitter clamps the
    input to the table's ends (f(clamp(x)); lut.py module docstring)."""
    from ..calibrate import lut_domain
    from ..emitters import lut

    node = ctx.node
    x = node.inputs[0]
    if npu_dtype_of(node.out.type.dtype) is not DType.F16:
        raise NoNpuForm("integer LUT")
    kind = LUT_FUNCS[node.op]
    domain = lut_domain(ctx, kind, x)
    form = operand_form(ctx, x)
    flat = _flat_layout(form)
    if flat is None:
        raise NoNpuForm("operand cubes are not one dense run")
    try:
        prog = lut.lower_activation(kind, flat, domain, ctx.profile)
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    return RuleResult([OpCall(prog, (Use(x),), (Use(node.out),), f"lut {kind}",
                              emitter="lut.lower_activation", forms_in=(form,),
                              forms_out=(form,))], note=f"{kind} domain {domain}")


RULES = {op: lower_binary_op for op in BINARY}
RULES.update({op: lower_lut_op for op in LUT_FUNCS})
