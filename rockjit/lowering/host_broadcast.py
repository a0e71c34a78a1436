"""A host element-wise op reading a broadcast operand in place: a per-row or per-column
vector (the row sums of a deferred softmax divided on the host, ir/passes/softmax_dot.py; a
power by a per-row exponent) is read through a stride-0 view of its source, so the replicated
tensor is never written (otherwise one host copy of the whole result's size)."""
from __future__ import annotations

from typing import Sequence

from ..ir.graph import Node, Value
from .host_rules import BINARY_CODES, HostView, _NodeLowering, row_major_strides
from .op_lowering import OpLowering
from .rules.base import RuleContext


def broadcast_sources(node: Node, ctx: RuleContext) -> list[tuple[Value, list[int]]] | None:
    """For a binary element-wise node with an operand that broadcasts a run-time value: each
    operand as (the value the host reads, where its axes land in the output); None when no
    operand is such a broadcast."""
    from ..ir.passes.pattern import broadcast_source

    if node.op not in BINARY_CODES or any(v.type.shape != node.out.type.shape
                                          for v in node.inputs):
        return None
    out, found = [], False
    for v in node.inputs:
        src, _, depth = broadcast_source(v, ctx.producers, [])
        if depth and ctx.const(v) is None and ctx.const(src) is None and \
                src.type.size < v.type.size and src.type.dtype == v.type.dtype:
            out.append((src, broadcast_source(v, ctx.producers, list(range(src.type.rank)))[1]))
            found = True
        else:
            out.append((v, list(range(v.type.rank))))
    return out if found else None


def binary_over_sources(node: Node, sources: Sequence[tuple[Value, Sequence[int]]]) -> OpLowering:
    """A binary element-wise ``node`` whose operand i is read from ``sources[i]`` = (value,
    where its axes land in the output): a broadcast operand through a stride-0 view of its
    source, so the replicated tensor is never written (bind i is that source)."""
    ins = tuple(v for v, _ in sources)
    p = _NodeLowering(Node(node.op, ins, node.outputs, node.attrs, node.loc))
    shape = node.out.type.shape
    views = []
    for i, (v, dims) in enumerate(sources):
        vs = row_major_strides(v.type.shape)
        st = [0] * len(shape)
        for j, a in enumerate(dims):
            if v.type.shape[j] == shape[a]:
                st[a] = vs[j]
        views.append(HostView(f"in{i}", v.type.dtype, 0, st))
    p.step("binary", shape, p.dense("out"), views, code=BINARY_CODES[node.op])
    return p.finish()
