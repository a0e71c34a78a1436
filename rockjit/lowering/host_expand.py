"""Host rules that expand an op into a chain of host-library steps: a fused
``activation{kind}`` with no LUT form runs as its record's expansion (ir/activations.py)."""
from __future__ import annotations

import numpy as np

from ..ir.activations import activation
from ..ir.graph import Builder, Node
from ..ir.ops import Op
from ..ir.types import DType, TensorType
from .host_rules import BINARY_CODES, UNARY_CODES, HostView, _NodeLowering
from .op_lowering import OpLowering


def lower_activation_on_host(node: Node) -> OpLowering:
    """A fused activation on the host (the LUT had no form for it): its record's expansion
    into primitive ops (ir/activations.py ``expand``), one host step per op over scratch
    buffers; scalar constants are one-element const buffers read with stride 0. An fp16 /
    bf16 activation is expanded in f32 and rounded once at the end, as the fused op means
    (a chain of fp16 steps would lose 1 + erf(x) to cancellation)."""
    p = _NodeLowering(node)
    t = node.out.type
    shape = t.shape
    wide = DType.F32 if t.dtype in (DType.F16, DType.BF16) else t.dtype
    b = Builder()
    x = b.input(TensorType(wide, shape))
    y = activation(node.attrs["kind"]).expand(
        lambda op, ins, attrs, out_type=None: b.add(op, ins, out_type, attrs), x)
    names: dict[int, str] = {x.id: "in0"}
    if wide is not t.dtype:
        names[x.id] = "xw"
        p.scratch("xw", TensorType(wide, shape))
        p.step("copy", shape, p.dense("xw"), [p.dense("in0")])
    scalars: dict[int, np.ndarray] = {}
    for i, n in enumerate(b.nodes):
        if n.op is Op.CONSTANT:
            scalars[n.out.id] = np.asarray(n.attrs["value"], n.out.type.dtype.to_numpy())
            continue
        if n.op is Op.BROADCAST_IN_DIM and n.inputs[0].id in scalars:
            scalars[n.out.id] = scalars[n.inputs[0].id]
            continue
        name = "out" if n.out.id == y.id and wide is t.dtype else f"t{i}"
        if name != "out":
            p.scratch(name, n.out.type)
        views = []
        for v in n.inputs:
            if v.id in scalars:
                k = f"k{v.id}"
                if k not in p.types:
                    p.const(k, TensorType(v.type.dtype, (1,)), scalars[v.id].reshape(1))
                views.append(HostView(k, v.type.dtype, 0, (0,) * len(shape)))
            else:
                views.append(p.dense(names[v.id]))
        kind, code = (("unary", UNARY_CODES[n.op]) if n.op in UNARY_CODES
                      else ("binary", BINARY_CODES[n.op]))
        iparams = (int(n.attrs["y"]),) if n.op is Op.INTEGER_POW else ()
        p.step(kind, shape, p.dense(name), views, code=code, iparams=iparams)
        names[n.out.id] = name
    if wide is not t.dtype:
        p.step("copy", shape, p.dense("out"), [p.dense(names[y.id])])
    return p.finish()


# the partitioner's host registry is host_rules.HOST_RULES plus these (partition.host_rules)
EXPANDED_RULES = {Op.ACTIVATION: lower_activation_on_host}
