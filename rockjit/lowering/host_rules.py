"""Host lowering rules: IR nodes that run on the CPU become steps of the C host-op library.

``HOST_RULES[op](node)`` turns one IR node whose operands and result are dense row-major host
buffers into an ``OpLowering``:

* buffers ``in0`` .. ``in{k-1}`` (role ``input``, ``bind`` = operand number), ``out`` (role
  ``output``, ``bind`` = 0), each with the node's dtype/shape, and one ``desc{j}`` per step
  (role ``const``, ``DESC_BYTES``: the step's ``rj_host_op`` descriptor, fixed at compile time and
  address-free, so it can live with the resident weights and in bundles);
* steps ``HostStep(kind, operands)`` with ``kind`` one of ``HOST_KINDS`` and operands
  ``dst`` (output), ``src`` / ``src1`` / ``src2`` (inputs 1..3 of the op) and ``desc``.

The descriptor carries the shapes, dtypes and element strides; every operand Slice covers its
whole buffer from byte 0, so the pipeline only resolves each Slice to (BO, byte offset) and
hands the result to ``rockjit.runtime.host_steps.HOST_STEPS[kind]``. The C library
(csrc/runtime/rj_host_ops.h) defines the kinds; values follow ``rockjit.ir.reference``.

``host_run.run_on_host(program, inputs)`` runs such a program directly through the C library,
without a runtime Program (tests, compile-time folding).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..ir.graph import Node
from ..ir.ops import Op
from ..ir.types import TensorType
from .host_descriptor import (DTYPE_CODES, HOST_KINDS, MAX_RANK, HostView, encode_descriptor,
                              row_major_strides, view_span)
from .op_lowering import BufferSpec, HostStep, OpLowering, Slice
from ..runtime import host_abi as ABI
from .regcmd import LoweringError

# ---------------------------------------------------------------- the C library's numbers
# generated from rj_host_ops.h (tools/gen_host_abi.py -> runtime/host_abi.py); only which IR
# op or dtype each code stands for is said here

UNARY_CODES: dict[Op, int] = {op: ABI.UNARY[name] for op, name in (
    (Op.NEG, "neg"), (Op.ABS, "abs"), (Op.EXP, "exp"), (Op.LOG, "log"), (Op.TANH, "tanh"),
    (Op.LOGISTIC, "logistic"), (Op.ERF, "erf"), (Op.SQRT, "sqrt"), (Op.RSQRT, "rsqrt"),
    (Op.SIN, "sin"), (Op.COS, "cos"), (Op.INTEGER_POW, "ipow"))}
BINARY_CODES: dict[Op, int] = {op: ABI.BINARY[name] for op, name in (
    (Op.ADD, "add"), (Op.SUB, "sub"), (Op.MUL, "mul"), (Op.DIV, "div"), (Op.MAX, "max"),
    (Op.MIN, "min"), (Op.POW, "pow"))}
COMPARE_CODES: dict[Op, int] = {op: ABI.COMPARE[name] for op, name in (
    (Op.EQ, "eq"), (Op.NE, "ne"), (Op.LT, "lt"), (Op.LE, "le"), (Op.GT, "gt"), (Op.GE, "ge"))}
REDUCE_CODES: dict[Op, int] = {op: ABI.REDUCE[name] for op, name in (
    (Op.REDUCE_SUM, "sum"), (Op.REDUCE_MAX, "max"), (Op.REDUCE_WINDOW_SUM, "sum"),
    (Op.REDUCE_WINDOW_MAX, "max"))}

DESC_DTYPE = ABI.DESC_DTYPE
DESC_BYTES = ABI.DESC_BYTES  # sizeof(rj_host_op)

# HostStep operand names of inputs 1..3 (the C step's src, param[0]/param64[0], param[1]/...).
INPUT_SLOTS = ("src", "src1", "src2")



def host_op_step(kind: str, shape: Sequence[int], out: HostView, ins: Sequence[HostView],
                 nbytes: dict[str, int], desc: str, code: int = 0, axis_mask: int = 0,
                 iparams: Sequence[int] = (), what: str = "host op",
                 offsets: dict[str, int] | None = None) -> tuple[HostStep, BufferSpec]:
    """One host-op step over named buffers of an emitter's program, and its descriptor const.

    ``nbytes`` gives each named buffer's size (every view is checked to stay inside, so a
    wrong stride fails at compile time); ``offsets`` an optional byte offset per buffer for
    the operand Slice (the view offsets then count from there). Emitters use this to express
    their host tails (K-partial sums, im2col) with the generic C library instead of private
    step kinds."""
    offsets = offsets or {}
    for i, v in enumerate((out, *ins)):
        esize = v.dtype.to_numpy().itemsize
        vshape, vstrides = tuple(shape), v.strides
        if kind == "reduce" and i == 0:
            vshape = tuple(1 if (axis_mask >> d) & 1 else n for d, n in enumerate(vshape))
        span = view_span(vshape, v.offset, vstrides)
        room = (nbytes[v.buffer] - offsets.get(v.buffer, 0)) // esize
        if span is not None and (span[0] < 0 or span[1] >= room):
            raise LoweringError(f"{what}: view of {v.buffer} reaches elements {span[0]}..{span[1]}"
                                f" of {room}: a bug in the emitter that built it")
    data = encode_descriptor(kind, shape, [out, *ins], code, axis_mask, iparams)

    def whole(name: str) -> Slice:
        off = offsets.get(name, 0)
        return Slice(name, off, nbytes[name] - off)

    operands = {"dst": whole(out.buffer), "desc": Slice(desc, 0, DESC_BYTES)}
    for slot, v in zip(INPUT_SLOTS, ins):
        operands[slot] = whole(v.buffer)
    return HostStep(kind, operands), BufferSpec(desc, "const", DESC_BYTES, data=data, align=8)


# ---------------------------------------------------------------- building one node's program

class _NodeLowering:
    """Collects the buffers and host steps of one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.types: dict[str, TensorType] = {}
        self.buffers: list[BufferSpec] = []
        for i, v in enumerate(node.inputs):
            self._io(f"in{i}", "input", v.type, i)
        self._io("out", "output", node.out.type, 0)
        self.steps: list[HostStep] = []

    def _io(self, name: str, role: str, t: TensorType, bind: int) -> None:
        nbytes = t.size * t.dtype.to_numpy().itemsize
        self.types[name] = t
        self.buffers.append(BufferSpec(name, role, nbytes, dtype=t.dtype.value, shape=t.shape,
                                       bind=bind))

    def scratch(self, name: str, t: TensorType) -> None:
        self.types[name] = t
        self.buffers.append(BufferSpec(name, "scratch", t.size * t.dtype.to_numpy().itemsize))

    def const(self, name: str, t: TensorType, data: np.ndarray) -> None:
        self.types[name] = t
        self.buffers.append(BufferSpec(name, "const", data.nbytes, dtype=t.dtype.value,
                                       shape=t.shape, data=np.frombuffer(data.tobytes(),
                                                                         np.uint8).copy()))

    def dense(self, name: str) -> HostView:
        """A buffer's own row-major view (iteration shape = its shape)."""
        t = self.types[name]
        return HostView(name, t.dtype, 0, row_major_strides(t.shape))

    def step(self, kind: str, shape: Sequence[int], out: HostView, ins: Sequence[HostView],
             code: int = 0, axis_mask: int = 0, iparams: Sequence[int] = ()) -> None:
        """Append one host op, after checking every view stays inside its buffer (a broken
        rule must fail here, at compile time, not scribble over a neighbour at run time)."""
        if any(int(n) == 0 for n in shape) and (kind != "reduce" or self.types[out.buffer].size == 0):
            return  # no element to compute (a reduce over an empty axis still writes its init)
        what = f"host lowering of {self.node.op.text}"
        for i, v in enumerate((out, *ins)):
            t = self.types[v.buffer]
            vshape, vstrides = tuple(shape), v.strides
            if kind == "reduce" and i == 0:  # the output spans the kept axes only
                vshape = tuple(1 if (axis_mask >> d) & 1 else n for d, n in enumerate(vshape))
            if kind == "take" and i == 1:  # the table also spans its gathered axis
                vshape, vstrides = vshape + (max(int(iparams[1]), 1),), vstrides + (iparams[0],)
            span = view_span(vshape, v.offset, vstrides)
            if span is not None and (span[0] < 0 or span[1] >= t.size):
                raise LoweringError(f"{what}: view of {v.buffer} ({t}) reaches elements "
                                    f"{span[0]}..{span[1]}: a bug in rockjit.lowering.host_rules")
        j = len([b for b in self.buffers if b.role == "const"])
        desc = encode_descriptor(kind, shape, [out, *ins], code, axis_mask, iparams)
        self.buffers.append(BufferSpec(f"desc{j}", "const", DESC_BYTES, data=desc, align=8))
        operands = {"dst": self._whole(out.buffer), "desc": Slice(f"desc{j}", 0, DESC_BYTES)}
        for slot, v in zip(INPUT_SLOTS, ins):
            operands[slot] = self._whole(v.buffer)
        self.steps.append(HostStep(kind, operands))

    def _whole(self, name: str) -> Slice:
        t = self.types[name]
        return Slice(name, 0, t.size * t.dtype.to_numpy().itemsize)

    def finish(self) -> OpLowering:
        return OpLowering(tuple(self.buffers), tuple(self.steps))


HostRule = Callable[[Node], OpLowering]


def _elementwise(kind: str, code: int) -> HostRule:
    def rule(node: Node) -> OpLowering:
        p = _NodeLowering(node)
        shape = node.out.type.shape
        ins = [p.dense(f"in{i}") for i in range(len(node.inputs))]
        iparams = (int(node.attrs["y"]),) if node.op is Op.INTEGER_POW else ()
        p.step(kind, shape, p.dense("out"), ins, code=code, iparams=iparams)
        return p.finish()
    return rule


def _copy_rule(node: Node) -> OpLowering:
    """reshape (same bytes in a new shape) and convert (same shape, new dtype)."""
    p = _NodeLowering(node)
    n = node.out.type.size
    p.step("copy", (n,), HostView("out", node.out.type.dtype, 0, (1,)),
           [HostView("in0", node.inputs[0].type.dtype, 0, (1,))])
    return p.finish()


def _transpose(node: Node) -> OpLowering:
    p = _NodeLowering(node)
    xs = row_major_strides(node.inputs[0].type.shape)
    perm = node.attrs["permutation"]
    src = HostView("in0", node.inputs[0].type.dtype, 0, [xs[a] for a in perm])
    p.step("copy", node.out.type.shape, p.dense("out"), [src])
    return p.finish()


def _broadcast_in_dim(node: Node) -> OpLowering:
    p = _NodeLowering(node)
    x, out = node.inputs[0].type, node.out.type
    xs = row_major_strides(x.shape)
    strides = [0] * out.rank
    for i, d in enumerate(node.attrs["broadcast_dimensions"]):
        if x.shape[i] == out.shape[d]:  # a size-1 operand dim repeats: stride 0
            strides[d] = xs[i]
    p.step("copy", out.shape, p.dense("out"), [HostView("in0", x.dtype, 0, strides)])
    return p.finish()


def _slice(node: Node) -> OpLowering:
    p = _NodeLowering(node)
    x = node.inputs[0].type
    xs = row_major_strides(x.shape)
    start, steps = node.attrs["start"], node.attrs["strides"]
    offset = sum(s * st for s, st in zip(start, xs))
    src = HostView("in0", x.dtype, offset, [st * k for st, k in zip(xs, steps)])
    p.step("copy", node.out.type.shape, p.dense("out"), [src])
    return p.finish()


def _concatenate(node: Node) -> OpLowering:
    """One copy per operand into its band of the output."""
    p = _NodeLowering(node)
    out = node.out.type
    os_ = row_major_strides(out.shape)
    dim = node.attrs["dimension"]
    at = 0
    for i, v in enumerate(node.inputs):
        t = v.type
        p.step("copy", t.shape, HostView("out", out.dtype, at * os_[dim], os_),
               [p.dense(f"in{i}")])
        at += t.shape[dim]
    return p.finish()


def _pad(node: Node) -> OpLowering:
    """Fill the output with the padding value (a broadcast copy), then copy the operand's
    surviving elements to their strided places (interior padding spreads them, negative edge
    padding crops them)."""
    p = _NodeLowering(node)
    x, out = node.inputs[0].type, node.out.type
    xs, os_ = row_major_strides(x.shape), row_major_strides(out.shape)
    p.step("copy", out.shape, p.dense("out"), [HostView("in1", x.dtype, 0, [0] * out.rank)])
    counts, x_off, o_off, o_strides = [], 0, 0, []
    for d, (lo, it, n, on) in enumerate(zip(node.attrs["low"], node.attrs["interior"], x.shape,
                                            out.shape)):
        step = it + 1
        first = (-lo + step - 1) // step if lo < 0 else 0  # first j with lo + j*step >= 0
        last = (on - 1 - lo) // step if on - 1 - lo >= 0 else -1  # last j inside the output
        count = max(0, min(n - 1, last) - first + 1)
        counts.append(count)
        x_off += first * xs[d]
        o_off += (lo + first * step) * os_[d]
        o_strides.append(os_[d] * step)
    p.step("copy", counts, HostView("out", out.dtype, o_off, o_strides),
           [HostView("in0", x.dtype, x_off, xs)])
    return p.finish()


def _select_n(node: Node) -> OpLowering:
    """Cases two at a time: each step writes the elements whose selector names one of its
    cases; every step checks the selector against the total case count."""
    p = _NodeLowering(node)
    which = node.inputs[0].type
    out = node.out.type
    w_strides = [0] * out.rank if which.rank == 0 else row_major_strides(which.shape)
    ncases = len(node.inputs) - 1
    for first in range(0, ncases, 2):
        cases = [p.dense(f"in{1 + k}") for k in range(first, min(first + 2, ncases))]
        p.step("select", out.shape, p.dense("out"),
               [HostView("in0", which.dtype, 0, w_strides), *cases], iparams=(first, ncases))
    return p.finish()


def _reduce(node: Node) -> OpLowering:
    p = _NodeLowering(node)
    x, out = node.inputs[0].type, node.out.type
    axes = set(node.attrs["axes"])
    kept = iter(row_major_strides(out.shape))
    o_strides = [0 if d in axes else next(kept) for d in range(x.rank)]
    mask = sum(1 << a for a in axes)
    p.step("reduce", x.shape, HostView("out", out.dtype, 0, o_strides), [p.dense("in0")],
           code=REDUCE_CODES[node.op], axis_mask=mask)
    return p.finish()


def _reduce_window(node: Node) -> OpLowering:
    """A window reduction as one ``reduce`` over the overlapping view [*out, *window] of the
    operand (element (o, k) reads x[o * stride + k]); the window axes are reduced. Padded
    windows would read outside the buffer, so they have no host form here."""
    from .rules.base import NoNpuForm

    x, out = node.inputs[0].type, node.out.type
    pad = [tuple(int(p) for p in pr) for pr in node.attrs["padding"]]
    if any(p != (0, 0) for p in pad):
        raise NoNpuForm(f"a padded window ({pad}): the host reduce reads unpadded views only; "
                        f"pad the input with lax.pad first or keep the window in the PPU's "
                        f"limits (kernel/stride 1..16, padding 0..7 on H, W of N,C,H,W)")
    if 2 * x.rank > MAX_RANK:
        raise NoNpuForm(f"a rank-{x.rank} window (the host reduce iterates over at most "
                        f"{MAX_RANK} axes = {MAX_RANK // 2} window axes)")
    p = _NodeLowering(node)
    xs = row_major_strides(x.shape)
    win = [int(w) for w in node.attrs["window_dimensions"]]
    st = [int(s) for s in node.attrs["window_strides"]]
    in_strides = [a * b for a, b in zip(xs, st)] + list(xs)
    o_strides = list(row_major_strides(out.shape)) + [0] * x.rank
    mask = sum(1 << (x.rank + d) for d in range(x.rank))
    p.step("reduce", tuple(out.shape) + tuple(win), HostView("out", out.dtype, 0, o_strides),
           [HostView("in0", x.dtype, 0, in_strides)], code=REDUCE_CODES[node.op], axis_mask=mask)
    return p.finish()


def _take(node: Node) -> OpLowering:
    """Iterate over the output [x.shape[:axis], idx.shape, x.shape[axis+1:]]: the table's
    strides are 0 over the index dims and its gathered-axis stride is a parameter."""
    p = _NodeLowering(node)
    x, idx, out = node.inputs[0].type, node.inputs[1].type, node.out.type
    axis = node.attrs["axis"]
    xs, is_ = row_major_strides(x.shape), row_major_strides(idx.shape)
    x_strides = list(xs[:axis]) + [0] * idx.rank + list(xs[axis + 1:])
    i_strides = [0] * axis + list(is_) + [0] * (x.rank - axis - 1)
    p.step("take", out.shape, p.dense("out"),
           [HostView("in0", x.dtype, 0, x_strides), HostView("in1", idx.dtype, 0, i_strides)],
           iparams=(xs[axis], x.shape[axis]))
    # a gather touches the rows it picks, not the table (an embedding's 154 MB for 512 tokens)
    if p.steps:     # none for an empty result
        ob = out.size * out.dtype.to_numpy().itemsize
        st = p.steps[-1]
        p.steps[-1] = HostStep(st.kind, st.operands,
                               {"bytes": 2 * ob + idx.size * idx.dtype.to_numpy().itemsize})
    return p.finish()


def _iota(node: Node) -> OpLowering:
    p = _NodeLowering(node)
    p.step("iota", node.out.type.shape, p.dense("out"), [],
           iparams=(node.attrs["dimension"],))
    return p.finish()


HOST_RULES: dict[Op, HostRule] = {
    **{op: _elementwise("unary", c) for op, c in UNARY_CODES.items()},
    **{op: _elementwise("binary", c) for op, c in BINARY_CODES.items()},
    **{op: _elementwise("compare", c) for op, c in COMPARE_CODES.items()},
    Op.SELECT_N: _select_n,
    Op.REDUCE_SUM: _reduce,
    Op.REDUCE_MAX: _reduce,
    Op.REDUCE_WINDOW_SUM: _reduce_window,
    Op.REDUCE_WINDOW_MAX: _reduce_window,
    Op.BROADCAST_IN_DIM: _broadcast_in_dim,
    Op.RESHAPE: _copy_rule,
    Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice,
    Op.CONCATENATE: _concatenate,
    Op.PAD: _pad,
    Op.CONVERT: _copy_rule,
    Op.TAKE: _take,
    Op.IOTA: _iota,
}
# Not here, on purpose: constant/param (sources: the pipeline binds their bytes), and
# dot_general/conv (NPU work; a host matmul would hide a missing emitter).


def lower_on_host(node: Node) -> OpLowering:
    """The host program of one node, or a LoweringError naming the op and its location."""
    rule = HOST_RULES.get(node.op)
    if rule is None:
        where = f" at {node.loc}" if node.loc else ""
        raise LoweringError(f"{node.op.text}{where} has no host implementation (host rules cover "
                            f"{sorted(op.text for op in HOST_RULES)})")
    return rule(node)


__all__: Sequence[str] = (
    "HOST_RULES", "HOST_KINDS", "DTYPE_CODES", "DESC_BYTES", "INPUT_SLOTS", "HostView",
    "encode_descriptor", "host_op_step", "lower_on_host", "row_major_strides",
)
