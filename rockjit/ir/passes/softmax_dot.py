"""Attention's softmax normalisation after the value product (issue 9: program shape).

``softmax(x) @ v`` over the softmax's axis is ``(e @ v) / s`` with ``e = exp(x - max x)`` and
``s = sum(e)`` per row: the per-row division moves from the [rows, keys] probabilities to the
[rows, head_dim] product, 16x fewer elements for SigLIP at 1024 tokens (a 1024-key row against
a 64-wide head), and the probabilities are never written. Exact in real arithmetic.

Range: ``e`` lies in [0, 1] and ``s`` in [1, keys], so ``e @ v`` can reach ``keys * max|v|``
(a uniform row), past fp16 where the quotient is not. The lowering therefore writes that product
in fp32 (``is_deferred_product``: pipeline.py's ``fp32_values``, rules/contract.py) and scales
it by the split reciprocal of s in one NPU pass per head (rules/eltwise_vectors.py,
``deferred_division_calls``), or divides on the host in f32 where that pass does not fit: no
value of the rewritten graph is narrower than in the original, and the quotient is rounded to
fp16 once, where the original rounded the probabilities and then the product. Where ``s`` has
no other reader, the lowering takes it from a ones kernel of the product itself (``e @ [v |
1]``, lowering/rules/row_sum.py) instead of a separate pass over ``e``.

Matched: a ``softmax`` over the last axis whose only user is a ``dot_general`` taking it as the
lhs and contracting that axis. The division keeps the dot's result value, so nothing
downstream changes.
"""
from __future__ import annotations

from ..graph import Graph, Node, Value
from ..ops import Op
from ..composites import softmax_numerator
from ..rules import infer_type


def _row_dims(dot: Node) -> list[int] | None:
    """Where each kept axis of the softmax's operand (all but the last) lands in the dot's
    output: batch axes first, then the lhs's free axes in order. None where those positions
    do not increase (broadcast_in_dim keeps axis order)."""
    a = dot.attrs
    rank = dot.inputs[0].type.rank
    batch = list(a["lhs_batch"])
    free = [i for i in range(rank) if i not in batch and i not in a["lhs_contract"]]
    dims = [batch.index(i) if i in batch else len(batch) + free.index(i)
            for i in range(rank - 1)]
    return dims if all(p < q for p, q in zip(dims, dims[1:])) else None


def find_softmax_products(graph: Graph) -> dict[int, tuple[Node, Node, list[int]]]:
    """dot's value id -> (softmax node, dot node, the row axes' positions in the dot's output)."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    found = {}
    for dot in graph.nodes:
        if dot.op is not Op.DOT_GENERAL:
            continue
        p = dot.inputs[0]
        sm = producers.get(p.id)
        if sm is None or sm.op is not Op.SOFTMAX or p.id in outputs:
            continue
        rank = p.type.rank
        if list(sm.attrs["axes"]) != [rank - 1] or \
                list(dot.attrs["lhs_contract"]) != [rank - 1] or \
                [u.out.id for u in users.get(p.id, [])] != [dot.out.id] or \
                dot.inputs[1].id == p.id:
            continue
        dims = _row_dims(dot)
        if dims is not None:
            found[dot.out.id] = (sm, dot, dims)
    return found


def defer_softmax_division(graph: Graph) -> Graph:
    """Every matched ``softmax(x) @ v`` as ``(exp(x - max x) @ v) / sum(exp(x - max x))``."""
    found = find_softmax_products(graph)
    if not found:
        return graph
    dead = {sm.out.id for sm, _, _ in found.values()}
    next_id = max([v.id for n in graph.nodes for v in n.outputs]
                  + [v.id for v in graph.inputs], default=0) + 1
    nodes: list[Node] = []
    for n in graph.nodes:
        if len(n.outputs) == 1 and n.out.id in dead:
            continue
        hit = found.get(n.out.id) if len(n.outputs) == 1 else None
        if hit is None:
            nodes.append(n)
            continue
        sm, dot, dims = hit

        def emit(op: Op, ins, attrs=None, out_type=None, loc=sm.loc) -> Value:
            nonlocal next_id
            attrs = dict(attrs or {})
            v = Value(next_id, infer_type(op, [i.type for i in ins], attrs, out_type))
            next_id += 1
            nodes.append(Node(op, tuple(ins), (v,), attrs, loc))
            return v

        x = sm.inputs[0]
        rank = x.type.rank
        e, _ = softmax_numerator(emit, x, (rank - 1,))
        s = emit(Op.REDUCE_SUM, [e], {"axes": [rank - 1]})
        y = emit(Op.DOT_GENERAL, [e, dot.inputs[1]], dot.attrs, loc=dot.loc)
        sb = emit(Op.BROADCAST_IN_DIM, [s], {"broadcast_dimensions": dims}, y.type, loc=dot.loc)
        nodes.append(Node(Op.DIV, (y, sb), dot.outputs, {}, dot.loc))
    from .canonicalize import cse

    return cse(Graph(graph.name, graph.inputs, nodes, graph.outputs))


def deferred_division(div: Node, producers) -> Node | None:
    """The ``e @ v`` dot when ``div`` is exactly the division this pass emits: ``(e @ v) /
    broadcast(sum(e))`` with each row sum broadcast onto its own row of the product (e =
    exp(...), the sum over the axis the dot contracts). None for anything else: a bound or an
    fp32 write relies on the pairing of rows, so the pairing is checked, not assumed."""
    if div.op is not Op.DIV:
        return None
    x, b = div.inputs
    dot, pb = producers.get(x.id), producers.get(b.id)
    if dot is None or dot.op is not Op.DOT_GENERAL or pb is None or \
            pb.op is not Op.BROADCAST_IN_DIM:
        return None
    e = dot.inputs[0]
    pe = producers.get(e.id)
    dims = _row_dims(dot) if list(dot.attrs["lhs_contract"]) == [e.type.rank - 1] else None
    ps = producers.get(pb.inputs[0].id)
    if pe is None or pe.op is not Op.EXP or dims is None or ps is None or \
            ps.op is not Op.REDUCE_SUM or ps.inputs[0].id != e.id or \
            list(ps.attrs["axes"]) != [e.type.rank - 1]:
        return None
    return dot if list(pb.attrs["broadcast_dimensions"]) == dims else None


def is_deferred_product(node: Node, producers, users) -> bool:
    """Whether ``node`` is the ``e @ v`` of a deferred softmax, read only by its
    ``deferred_division``. The lowering writes it in fp32."""
    us = users.get(node.out.id, [])
    return node.op is Op.DOT_GENERAL and len(us) == 1 and \
        deferred_division(us[0], producers) is node and us[0].inputs[0].id == node.out.id
