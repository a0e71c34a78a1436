"""Composite ops the fusion pass finds (``softmax``, ``layer_norm``) and the expansion the lowering runs first.

A composite makes a structure visible in the printed IR, the verifier and the golden tests;
until an emitter lowers it natively, ``expand`` rewrites it back into primitive ops, spelled
as JAX spells it (jax.nn.softmax, then cse), so the lowering sees the graph it always saw. The
expansion keeps the composite's result value: nothing downstream changes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .graph import Graph, Node, Value
from .ops import Group, Op
from .rules import infer_type
from .types import TensorType

Emit = Callable[..., Value]


def _keep_dims(x: TensorType, axes: tuple[int, ...]) -> tuple[tuple[int, ...], list[int]]:
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return shape, [i for i in range(x.rank) if i not in axes]


def softmax_numerator(emit: Emit, x: Value, axes: tuple[int, ...]
                      ) -> tuple[Value, Callable[[Value], Value]]:
    """exp(x - max(-inf, max(x))) as jax.nn.softmax spells it (the range plan and the LUT
    calibration recognise this form), and the broadcast that puts a row statistic back on
    x's rows."""
    keep, kept = _keep_dims(x.type, axes)
    full = list(range(x.type.rank))

    def back(v: Value) -> Value:
        k = emit(Op.BROADCAST_IN_DIM, [v], {"broadcast_dimensions": kept},
                 TensorType(x.type.dtype, keep))
        return emit(Op.BROADCAST_IN_DIM, [k], {"broadcast_dimensions": full}, x.type)

    m = emit(Op.REDUCE_MAX, [x], {"axes": list(axes)})
    c = emit(Op.CONSTANT, [], {"value": np.array(-np.inf, x.type.dtype.to_numpy())})
    cb = emit(Op.BROADCAST_IN_DIM, [c], {"broadcast_dimensions": []}, m.type)
    return emit(Op.EXP, [emit(Op.SUB, [x, back(emit(Op.MAX, [cb, m]))])]), back


def expand_softmax(emit: Emit, x: Value, attrs) -> Value:
    """jax.nn.softmax: exp(x - max(-inf, max(x))) / sum(...), max and sum kept as rows."""
    axes = tuple(attrs["axes"])
    e, back = softmax_numerator(emit, x, axes)
    return emit(Op.DIV, [e, back(emit(Op.REDUCE_SUM, [e], {"axes": list(axes)}))])


def expand_layer_norm(emit: Emit, x: Value, attrs) -> Value:
    """models/layers.layer_norm's spelling: mean = sum / n, c = x - mean, var = sum(c c) / n,
    c * rsqrt(var + eps), the row statistics kept as rows."""
    axes = tuple(attrs["axes"])
    keep, kept = _keep_dims(x.type, axes)
    kt = TensorType(x.type.dtype, keep)
    full = list(range(x.type.rank))
    dt = x.type.dtype.to_numpy()
    count = int(np.prod([x.type.shape[a] for a in axes], dtype=np.int64))

    def rows(v: Value) -> Value:
        return emit(Op.BROADCAST_IN_DIM, [v], {"broadcast_dimensions": kept}, kt)

    def scalar(value: float) -> Value:
        c = emit(Op.CONSTANT, [], {"value": np.array(value, dt)})
        return emit(Op.BROADCAST_IN_DIM, [c], {"broadcast_dimensions": []}, kt)

    def back(v: Value) -> Value:
        return emit(Op.BROADCAST_IN_DIM, [v], {"broadcast_dimensions": full}, x.type)

    s1 = rows(emit(Op.REDUCE_SUM, [x], {"axes": list(axes)}))
    n = scalar(float(count))
    c = emit(Op.SUB, [x, back(emit(Op.DIV, [s1, n]))])
    s2 = rows(emit(Op.REDUCE_SUM, [emit(Op.MUL, [c, c])], {"axes": list(axes)}))
    var = emit(Op.DIV, [s2, n])
    r = emit(Op.RSQRT, [emit(Op.ADD, [var, scalar(attrs["eps"])])])
    return emit(Op.MUL, [c, back(r)])


def expand_matmul_epilogue(emit: Emit, lhs: Value, attrs, *operands: Value) -> Value:
    """dot_general, then * scale, + bias (each broadcast along the last axis), + residual,
    then the activation: the order of the op's definition (ops.py)."""
    rhs, *rest = operands
    dims = {k: attrs[k] for k in ("lhs_contract", "rhs_contract", "lhs_batch", "rhs_batch")}
    y = emit(Op.DOT_GENERAL, [lhs, rhs], dims)
    vec = {}
    for name in ("bias", "scale"):
        if attrs[name]:
            vec[name] = rest.pop(0)
    last = [y.type.rank - 1]
    if "scale" in vec:
        y = emit(Op.MUL, [y, emit(Op.BROADCAST_IN_DIM, [vec["scale"]],
                                  {"broadcast_dimensions": last}, y.type)])
    if "bias" in vec:
        y = emit(Op.ADD, [y, emit(Op.BROADCAST_IN_DIM, [vec["bias"]],
                                  {"broadcast_dimensions": last}, y.type)])
    if attrs["residual"]:
        y = emit(Op.ADD, [y, rest.pop(0)])
    if attrs["act"] != "none":
        y = emit(Op.ACTIVATION, [y], {"kind": attrs["act"]})
    return y


EXPANSIONS: dict[Op, Callable[..., Value]] = {
    Op.SOFTMAX: expand_softmax, Op.LAYER_NORM: expand_layer_norm,
    Op.MATMUL_EPILOGUE: expand_matmul_epilogue}
assert set(EXPANSIONS) == {op for op in Op if op.group is Group.COMPOSITE}


def expand(graph: Graph) -> Graph:
    """Every composite op as its expansion (fresh value ids; the result value kept)."""
    if not any(n.op in EXPANSIONS for n in graph.nodes):
        return graph
    next_id = max([v.id for n in graph.nodes for v in n.outputs]
                  + [v.id for v in graph.inputs], default=0) + 1
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op not in EXPANSIONS:
            nodes.append(n)
            continue
        new: list[Node] = []

        def emit(op: Op, ins, attrs=None, out_type=None, n=n, new=new) -> Value:
            nonlocal next_id
            attrs = dict(attrs or {})
            t = infer_type(op, [v.type for v in ins], attrs, out_type)
            v = Value(next_id, t)
            next_id += 1
            new.append(Node(op, tuple(ins), (v,), attrs, n.loc))
            return v

        y = EXPANSIONS[n.op](emit, n.inputs[0], n.attrs, *n.inputs[1:])
        last = new[-1]
        assert last.out.id == y.id and y.type == n.out.type
        new[-1] = Node(last.op, last.inputs, n.outputs, last.attrs, last.loc)
        nodes += new
    # one -inf constant for every softmax, as the traced graph had after its own cse
    from .passes.canonicalize import cse

    return cse(Graph(graph.name, graph.inputs, nodes, graph.outputs))
