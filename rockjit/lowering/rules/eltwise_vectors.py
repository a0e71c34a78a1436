"""Element-wise rules' run-time vector operands: a per-row vector (LayerNorm's and softmax's
row statistics) and a per-channel vector (an attention mask's per-key bias) combined with a
cube by the one-pass emitters of emitters/eltwise_row.py, one call per cube (attention's
heads), and the host reciprocal of a per-row divisor."""
from __future__ import annotations

import math

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType, TensorType
from ... import cost
from ..arith import round_up
from ..layouts import CubeLayout
from ..op_lowering import BufferSpec, HostStep, OpLowering
from .base import CubeForm, NoNpuForm, OpCall, RowForm, RuleContext, Use
from .forms import cube_form
from .row_chain import row_split_cuts


def one_cube(form: CubeForm) -> bool:
    """Every element of ``form`` lies in its one layout cube: batch axes only step whole rows
    inside it (a matmul's rows folded as batch x rows, a patch grid's OH x OW)."""
    lay = form.layout
    for r, st, n in zip(form.roles, form.strides, form.shape):
        if r == "b" and n > 1 and (st % lay.line_stride or st * (n - 1) >= lay.height * lay.line_stride):
            return False
    return True


def row_source(ctx: RuleContext, v, shape: tuple[int, ...]):
    """If ``v`` is a broadcast of a run-time per-row vector (every axis but the last), that
    vector's value; else None."""
    prod = ctx.producer(v)
    if prod is None or prod.op is not Op.BROADCAST_IN_DIM or ctx.const(v) is not None:
        return None
    src = prod.inputs[0]
    while True:
        p2 = ctx.producer(src)
        if p2 is not None and p2.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE) and \
                int(math.prod(p2.inputs[0].type.shape)) == \
                int(math.prod(src.type.shape)):
            src = p2.inputs[0]
            continue
        break
    rows = int(math.prod(shape[:-1]))
    if int(math.prod(src.type.shape)) != rows:
        return None
    dims = tuple(prod.attrs["broadcast_dimensions"])
    # the broadcast must keep the leading axes and add the last
    if len(shape) - 1 in dims and prod.inputs[0].type.shape[dims.index(len(shape) - 1)] != 1:
        return None
    return src


def flat_layout(form: CubeForm) -> CubeLayout | None:
    """A layout spanning every cube of ``form`` when they tile one dense run of bytes (so a
    lane-wise op can treat them as one flat cube); None otherwise."""
    items = sorted(off for _, off in form.batch_items())
    n = form.layout.nbytes
    if any(b - a != n for a, b in zip(items, items[1:])) or items[0] != 0:
        return None
    total = n * len(items)
    atom = form.layout.c2 * form.layout.esize
    return CubeLayout(total // atom, 1, form.layout.c2, form.layout.c2, form.layout.dtype)


def flat_parts(ctx: RuleContext, form: CubeForm, passes: int = 1) -> int:
    """How many jobs a flat-view op over ``form`` offers placement (eltwise.part_bounds): one
    per cube when several cubes tile the run (attention's heads), so job h reads only the
    bytes the producer's jobs for head h wrote and placement can keep each head on the core
    that holds it; a single long cube is cut into ``cores`` ranges once it moves at least what
    the DMA moves during one dispatch of a job of ``passes`` kicks. Below that the op is one
    job: placement decides whether parts run spread or on one core, and parts kept on one core
    cost a dispatch each, which so small an op cannot pay back. Above it, the parts on
    different cores dispatch side by side, so a spread costs no more dispatch than one job
    while each core moves a third of the bytes, and ranges matching the producer's (a
    768-channel matmul's three 256-channel tiles) let the op run on the cores that already hold
    its input, in the producer's step (coalesce.py) and with no copy: SigLIP-224 (a 301 KB
    residual add) 20 -> 18 NPU steps per layer, 213.6 -> 202.1 ms modelled per forward.
    Placement (resident_placement.py) prices the copies a spread would need and keeps the
    parts on one core where the model says that is cheaper."""
    items = form.batch_items()
    if len(items) > 1 and flat_layout(form) is not None:
        return len(items)
    # a batch folded into one cube's rows (one_cube) is one long run
    c = cost.calibrated()
    least = (c.job_us + passes * c.kick_us) * 1e-6 * c.dma_gbps * 1e9
    return ctx.profile.cores if form.layout.nbytes >= least else 1


def row_calls(ctx: RuleContext, op: str, run, srow, reverse: bool, form: CubeForm,
               shape: tuple[int, ...], srow_use_shape: tuple[int, ...] | None = None
               ) -> list[OpCall]:
    """x OP s[row] for a run-time per-row ``srow`` (stored in the row-vector form of
    eltwise.build_binary_row): one call for a single cube, one per cube (independent, so their
    jobs run side by side) for a tensor held as several cubes (attention's heads)."""
    from ..emitters import eltwise_row as ewr
    from ..emitters.eltwise_rows import ROW_OPS, build_row_rows

    out = ctx.node.out
    items = form.batch_items()
    if len(items) == 1 or one_cube(form):
        # a batch folded into the cube's rows is one cube: one call over all its rows. Per
        # item, each call would run over the whole layout from that item's first row and the
        # row vector would hold only the item's rows, leaving the rest of its positions unwritten
        lay = form.layout
        if lay.width != 1:
            raise NoNpuForm("per-row operand on a cube with W > 1")
        cuts = row_split_cuts(ctx, form) if not reverse and op in ROW_OPS else ()
        if cuts:
            # feeding a feature reduce: by the reduce's rows (rules/row_chain.py)
            prog = build_row_rows(op, lay, ctx.profile, cuts, real=shape[-1])
        else:
            # kernel ranges as jobs, cut where a flat-view op over the same cube cuts its
            # planes (eltwise_row._one_pass): a norm's passes stay on the cores holding them
            prog = ewr.build_binary_row(op, lay, reverse, ctx.profile, flat_parts(ctx, form),
                                        real=shape[-1])
        nrows = int(math.prod(shape[:-1]))
        s_form = cube_form(ewr.row_vector_layout(lay.height * lay.width, ctx.profile), (nrows, 1))
        return [OpCall(prog, (Use(run), Use(srow, shape=srow_use_shape or (nrows, 1))),
                       (Use(out),), f"{op} row", emitter="eltwise.lower_binary_row",
                       forms_in=(form, s_form), forms_out=(form,))]
    calls = []
    for ix, _ in items:
        sub, _ = form.sub(ix)
        if sub.layout.width != 1 or "b" in sub.roles:
            raise NoNpuForm("per-row operand on cubes that are not matrices")
        lay = sub.layout
        prog = ewr.build_binary_row(op, lay, reverse, ctx.profile, real=shape[-1])
        rows = sub.hwc()[0]
        s_form = cube_form(ewr.row_vector_layout(lay.height * lay.width, ctx.profile), (rows, 1))
        calls.append(OpCall(prog, (Use(run, ix), Use(srow, ix, shape=(rows, 1))),
                            (Use(out, ix),), f"{op} row {ix}", emitter="eltwise.lower_binary_row",
                            forms_in=(sub, s_form), forms_out=(sub,)))
    return calls


def channel_source(ctx: RuleContext, v, shape: tuple[int, ...]):
    """If ``v`` broadcasts a run-time vector along the last axis only (one value per channel,
    the same for every row and batch item: an attention mask's per-key bias), that vector."""
    from ...ir.passes.pattern import broadcast_source

    if ctx.const(v) is not None:
        return None
    src, _, depth = broadcast_source(v, ctx.producers, [])
    if not depth or ctx.const(src) is not None or src.type.size != shape[-1] or \
            src.type.size == int(math.prod(shape)):
        return None
    axis = [i for i, n in enumerate(src.type.shape) if n != 1]
    if len(axis) > 1:
        return None
    dims = broadcast_source(v, ctx.producers, axis or [src.type.rank - 1])[1]
    return src if dims == [len(shape) - 1] else None


def channel_calls(ctx: RuleContext, op: str, run, vec, reverse: bool,
                   form: CubeForm) -> list[OpCall]:
    """x OP v[channel] for a run-time vector: one call per cube (a head each), every call
    reading the vector in the weight layout [C, 1] (eltwise_row.build_binary_channel_runtime)."""
    from ..emitters import eltwise_row as ewr

    if form.roles[-1:] != ("c",) or "c" in form.roles[:-1]:
        raise NoNpuForm("a channel vector on a transposed cube (channels not last)")
    items = form.batch_items()
    subs = [(ix, form.sub(ix)[0]) for ix, _ in items] if len(items) > 1 and \
        not one_cube(form) else [((), form)]
    calls = []
    for ix, sub in subs:
        lay = sub.layout
        prog = ewr.build_binary_channel_runtime(op, lay, reverse, ctx.profile)
        c = lay.channels
        calls.append(OpCall(prog, (Use(run, ix), Use(vec, shape=(c, 1))),
                            (Use(ctx.node.out, ix),), f"{op} channel vector {ix}".rstrip(),
                            emitter="eltwise.lower_binary_channel_runtime",
                            forms_in=(sub, None), forms_out=(sub,)))
    return calls


def _row_vector_out(ctx: RuleContext, positions: int, batch_shape: tuple[int, ...], rows: int):
    """The fresh per-row factor a host tail writes for per-row passes: the row-vector cube of
    ``positions`` (channel 0 per row) once, or once per batch item at 64-byte aligned strides.
    Returns (factor value, its form, the layout, the item stride, the bytes all items span)."""
    from ..emitters import eltwise_row as ewr

    lay = ewr.row_vector_layout(positions, ctx.profile)
    r_shape = tuple(batch_shape) + (rows, 1)
    if batch_shape:
        item = round_up(lay.nbytes, 64)
        form = cube_form(lay, r_shape, ("b",) * len(batch_shape) + ("h", "c"), item_stride=item)
    else:
        item = lay.nbytes
        form = cube_form(lay, r_shape, ("h", "c"))
    batch = math.prod(batch_shape)
    return ctx.fresh(TensorType(DType.F16, r_shape)), form, lay, item, item * (batch - 1) + lay.nbytes


def recip_rows(ctx: RuleContext, srow, form: CubeForm, shape: tuple[int, ...]):
    """r = 1 / s per row on the host (the O(rows) tail of a division by a per-row value),
    written straight into the row-vector cube(s) the per-row multiply reads: one host-op
    binary divide, fp32 in, fp16 out. Returns (host OpCall, r value, the form r is in)."""
    from ..host_rules import BINARY_CODES, HostView, host_op_step

    items = form.batch_items()
    rows_total = math.prod(shape[:-1])
    if len(items) == 1 or one_cube(form):
        batch, rows, lead, sub = 1, rows_total, (), form
    else:
        sub, _ = form.sub(items[0][0])
        batch, rows, lead = len(items), sub.hwc()[0], tuple(shape[:len(items[0][0])])
    if batch * rows != rows_total:
        raise NoNpuForm("the per-row vector does not match the operand's rows")
    r, r_form, lay, item, nbytes_out = _row_vector_out(
        ctx, sub.layout.height * sub.layout.width, lead, rows)
    s_rows = RowForm(DType.F32, tuple(srow.type.shape))
    es = 2
    sizes = {"s": s_rows.nbytes, "one": 4, "out": nbytes_out, "rdesc": 0}
    step, desc = host_op_step(
        "binary", (batch, rows),
        HostView("out", DType.F16, 0, (item // es, lay.line_stride // es)),
        [HostView("one", DType.F32, 0, (0, 0)), HostView("s", DType.F32, 0, (rows, 1))],
        sizes, "rdesc", code=BINARY_CODES[Op.DIV], what="per-row reciprocal")
    prog = OpLowering((BufferSpec("s", "input", s_rows.nbytes, dtype="f32",
                                 shape=s_rows.shape, bind=0),
                      BufferSpec("one", "const", 4, data=np.ones(1, np.float32).view(np.uint8)),
                      # only the real rows' channel 0 is written; build_binary_row broadcasts
                      # every position of the layout (rows padded to the row alignment), so
                      # the rest must be finite: zero (x * 0 stays finite)
                      BufferSpec("out", "output", nbytes_out, layout=lay, bind=0, zero=True),
                      desc),
                     (step,))
    call = OpCall(prog, (Use(srow),), (Use(r),), "1/s per row", where="host",
                  emitter="host per-row reciprocal", forms_in=(s_rows,), forms_out=(r_form,))
    return call, r


def deferred_division_calls(ctx: RuleContext, x, srow, shape: tuple[int, ...]) -> list[OpCall]:
    """(e @ v) / s per row for a deferred softmax (ir/passes/softmax_dot.py): x is the fp32
    cube form the value product wrote, s the fp32 row sums on the host. The host splits
    r = 1/s into two fp16 channels of the row-vector cube (hi = fp16(r), lo = fp16((r - hi) /
    LO_SCALE), one host step each) and one NPU pass per cube (a head) scales x by hi + lo * LO_SCALE (exact in
    fp32) into the fp16 cube the next op reads: one rounding of the quotient, as on the host,
    without the fp32 tensor crossing to the CPU (eltwise_row.build_row_scale_wide)."""
    from ..emitters import eltwise_row as ewr
    from ..host_rules import BINARY_CODES, HostView, host_op_step
    from ...runtime import host_abi as ABI
    from ..layouts import feature_layout

    form = next((f for f in ctx.forms(x) if isinstance(f, CubeForm)), None)
    if form is None or form.dtype is not DType.F32 or form.roles[-1:] != ("c",) or \
            "c" in form.roles[:-1]:
        raise NoNpuForm("the deferred product is not held as an fp32 matrix cube")
    items = form.batch_items()
    rows_total = math.prod(shape[:-1])
    if len(items) == 1 or one_cube(form):
        # a batch folded into the cube's rows is one cube: one call over all of its rows
        subs, nb, rows = [((), form)], 0, rows_total
    else:
        subs = [(ix, form.sub(ix)[0]) for ix, _ in items]
        nb, rows = len(items[0][0]), subs[0][1].hwc()[0]
    lay32 = subs[0][1].layout
    if any(s.layout != lay32 or s.layout.width != 1 or (nb and "b" in s.roles) for _, s in subs):
        raise NoNpuForm("the deferred product's cubes are not equal matrices")
    if lay32.surf_stride != lay32.height * lay32.line_stride:
        # items as row ranges of one taller cube: the pass reads its operand dense
        raise NoNpuForm("the deferred product's cubes are not dense")
    lay16 = feature_layout(ctx.profile, DType.F16, lay32.height, 1, lay32.channels)
    batch = len(subs)
    if batch * rows != rows_total:
        raise NoNpuForm("the row sums do not match the product's rows")
    r, r_form, vlay, item, n_out = _row_vector_out(ctx, lay16.height, tuple(shape[:nb]), rows)
    s_rows = RowForm(DType.F32, tuple(srow.type.shape))
    sizes = {"s": s_rows.nbytes, "one": 4, "out": n_out}
    hv = ((batch, rows), (rows, 1))
    ov = (item // 2, vlay.line_stride // 2)
    f32, f16 = DType.F32, DType.F16
    lo_shift = -int(np.log2(ewr.LO_SCALE))
    plan = [  # hi = fp16(1 / s); lo = fp16((1 / s - f32(hi)) / LO_SCALE): two steps, each
              # reading s once (csrc/runtime/host_ops.c RJ_UN_RECIP_LO)
        ("binary", BINARY_CODES[Op.DIV], HostView("out", f16, 0, ov),
         [HostView("one", f32, 0, (0, 0)), HostView("s", f32, 0, hv[1])], ()),
        ("unary", ABI.UNARY["recip_lo"], HostView("out", f16, 1, ov),
         [HostView("s", f32, 0, hv[1])], (lo_shift,))]
    steps, descs = [], []
    for j, (kind, code, out_v, ins, iparams) in enumerate(plan):
        st, desc = host_op_step(kind, hv[0], out_v, ins, {**sizes, f"rdesc{j}": 0},
                                f"rdesc{j}", code=code, iparams=iparams,
                                what="split per-row reciprocal")
        # O(rows) elements through strided views, not the row-vector cubes' whole bytes
        moved = batch * rows * sum(v.dtype.to_numpy().itemsize for v in (out_v, *ins))
        steps.append(HostStep(st.kind, st.operands, {"bytes": moved}))
        descs.append(desc)
    prog = OpLowering((BufferSpec("s", "input", s_rows.nbytes, dtype="f32", shape=s_rows.shape,
                                  bind=0),
                       BufferSpec("one", "const", 4, data=np.ones(1, np.float32).view(np.uint8)),
                       # padding rows of the row vector are read by the pass: zero, finite
                       BufferSpec("out", "output", n_out, layout=vlay, bind=0, zero=True),
                       *descs), tuple(steps))
    calls = [OpCall(prog, (Use(srow),), (Use(r),), "1/s per row, split hi + lo", where="host",
                    emitter="host per-row reciprocal (hi + lo)", forms_in=(s_rows,),
                    forms_out=(r_form,))]
    prog16 = ewr.build_row_scale_wide(lay16, ctx.profile)
    out_form = cube_form(lay16, shape, form.roles, item_stride=round_up(lay16.nbytes, 64)) \
        if nb else cube_form(lay16, shape, form.roles)
    for ix, sub in subs:
        o_sub = out_form.sub(ix)[0] if nb else out_form
        r_sub = r_form.sub(ix)[0] if nb else r_form
        calls.append(OpCall(prog16, (Use(x, ix), Use(r, ix, shape=(rows, 1))),
                            (Use(ctx.node.out, ix),), f"deferred softmax division {ix}".rstrip(),
                            emitter="eltwise_row.build_row_scale_wide",
                            forms_in=(sub, r_sub), forms_out=(o_sub,)))
    return calls
