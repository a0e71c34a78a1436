"""Canonicalization: local simplifications, dead-code elimination and CSE, to a fixed point.

Local rules live in ``SIMPLIFY`` keyed on the op.  A rule returns an existing value to use
instead of the node's result (the node disappears), a replacement node defining the same
result, or None to keep the node.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..graph import Graph, Node, Value
from ..ops import Op

Producers = dict[int, Node]
SimplifyRule = Callable[[Node, Producers], "Value | Node | None"]


def _identity_if_same_type(n: Node, prod: Producers) -> Value | None:
    (x,) = n.inputs[:1]
    return x if x.type == n.out.type else None


def _reshape(n: Node, prod: Producers) -> Value | Node | None:
    (x,) = n.inputs
    if x.type == n.out.type:
        return x
    p = prod.get(x.id)
    if p is not None and p.op is Op.RESHAPE:
        # reshape(reshape(y)) == reshape(y): only the final shape matters in row-major order.
        return replace(n, inputs=p.inputs)
    return None


def _transpose(n: Node, prod: Producers) -> Value | Node | None:
    (x,) = n.inputs
    perm = n.attrs["permutation"]
    if list(perm) == list(range(len(perm))):
        return x
    p = prod.get(x.id)
    if p is not None and p.op is Op.TRANSPOSE:
        inner = p.attrs["permutation"]
        return replace(n, inputs=p.inputs, attrs={"permutation": tuple(inner[i] for i in perm)})
    return None


def _slice(n: Node, prod: Producers) -> Value | None:
    (x,) = n.inputs
    whole = (all(s == 0 for s in n.attrs["start"]) and tuple(n.attrs["limit"]) == x.type.shape
             and all(s == 1 for s in n.attrs["strides"]))
    return x if whole else None


def _broadcast(n: Node, prod: Producers) -> Value | None:
    (x,) = n.inputs
    same = (x.type == n.out.type
            and list(n.attrs["broadcast_dimensions"]) == list(range(x.type.rank)))
    return x if same else None


def _pad(n: Node, prod: Producers) -> Value | None:
    zero = all(v == 0 for k in ("low", "high", "interior") for v in n.attrs[k])
    return n.inputs[0] if zero else None


def _concatenate(n: Node, prod: Producers) -> Value | None:
    return n.inputs[0] if len(n.inputs) == 1 else None


SIMPLIFY: dict[Op, SimplifyRule] = {
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.CONVERT: _identity_if_same_type,
    Op.SLICE: _slice,
    Op.BROADCAST_IN_DIM: _broadcast,
    Op.PAD: _pad,
    Op.CONCATENATE: _concatenate,
}


def _rebuild(graph: Graph, nodes: list[Node], subst: dict[int, Value]) -> Graph:
    outputs = tuple(subst.get(v.id, v) for v in graph.outputs)
    return Graph(graph.name, graph.inputs, nodes, outputs)


def _resolve(n: Node, subst: dict[int, Value]) -> Node:
    for v in n.inputs:
        if v.id in subst:
            return replace(n, inputs=tuple(subst.get(v.id, v) for v in n.inputs))
    return n


def simplify(graph: Graph) -> Graph:
    """Apply the ``SIMPLIFY`` rules once over the graph (each node until it stops changing)."""
    subst: dict[int, Value] = {}
    prod: Producers = {}
    nodes: list[Node] = []
    for n in graph.nodes:
        if subst:
            n = _resolve(n, subst)
        while (rule := SIMPLIFY.get(n.op)) is not None:
            r = rule(n, prod)
            if isinstance(r, Node):
                n = r
                continue
            if isinstance(r, Value):
                subst[n.out.id] = r
                n = None  # type: ignore[assignment]
            break
        if n is not None:
            nodes.append(n)
            for v in n.outputs:
                prod[v.id] = n
    return _rebuild(graph, nodes, subst)


def dce(graph: Graph) -> Graph:
    """Drop nodes none of whose results reach an output (every op is pure)."""
    live = {v.id for v in graph.outputs}
    kept: list[Node] = []
    for n in reversed(graph.nodes):
        for v in n.outputs:
            if v.id in live:
                break
        else:
            continue
        kept.append(n)
        for v in n.inputs:
            live.add(v.id)
    kept.reverse()
    return Graph(graph.name, graph.inputs, kept, graph.outputs)


def cse(graph: Graph) -> Graph:
    """Merge nodes with the same op, operands, attributes and result types."""
    seen: dict[Any, Node] = {}
    subst: dict[int, Value] = {}
    nodes: list[Node] = []
    for n in graph.nodes:
        if subst:
            n = _resolve(n, subst)
        key = n.cse_key
        first = seen.get(key)
        if first is None:
            seen[key] = n
            nodes.append(n)
        else:
            subst.update({a.id: b for a, b in zip(n.outputs, first.outputs)})
    return _rebuild(graph, nodes, subst)


def canonicalize(graph: Graph) -> Graph:
    """simplify + DCE + CSE until nothing changes."""
    while True:
        new = cse(dce(simplify(graph)))
        if new == graph:
            return new
        graph = new
