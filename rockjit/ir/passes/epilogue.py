"""Matmul epilogues: ``dot_general(x, w) + broadcast(b)`` -> ``matmul_epilogue{bias}`` (issue 9).

The match is structural: a dot_general of a run-time activation with a constant weight (a
value computed from params and constants only) whose rhs has one free axis -- the output's
last axis, N -- added to a constant rank-1 vector ``b[N]`` broadcast along that axis (one or
several broadcast_in_dim whose composed dimensions put b on the last axis). The product must
have no other user, else it is needed anyway and fusing would compute it twice.

This pass is *not* part of ``fuse``: the range plan (lowering/range_plan.py) looks for
dot_general patterns (the matmul-input prescale, the score-scale move), so the lowering forms
epilogues after it has run (pipeline.lower_graph), asking the lowering through ``accept``
whether its emitter takes each match; a refused match stays dot_general + add.
"""
from __future__ import annotations

from typing import Callable

from ..graph import Graph, Node, Value
from ..ops import Op
from .canonicalize import dce
from .pattern import broadcast_source

Accept = Callable[[Node, Value], bool]


def constant_values(graph: Graph) -> set[int]:
    """Ids of the values that depend on no graph input (params, literals and what is
    computed from them only)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.op in (Op.PARAM, Op.CONSTANT, Op.IOTA) or (
                n.inputs and all(v.id in out for v in n.inputs)):
            out.update(v.id for v in n.outputs)
    return out


def _last_axis_vector(v: Value, producers) -> Value | None:
    """The rank-1 vector ``v`` broadcasts along its last axis, or None."""
    src, dims, depth = broadcast_source(v, producers, [0])
    if not depth or src.type.rank != 1:
        return None
    return src if dims == [v.type.rank - 1] else None


def find_matmul_epilogues(graph: Graph, accept: Accept | None = None
                          ) -> dict[int, tuple[Node, Value]]:
    """add's value id -> (the dot_general, the bias vector) of each matmul + bias."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    consts = constant_values(graph)
    found = {}
    for node in graph.nodes:
        if node.op is not Op.ADD or not node.out.type.dtype.is_float:
            continue
        for d, b in (node.inputs, node.inputs[::-1]):
            dot = producers.get(d.id)
            if dot is None or dot.op is not Op.DOT_GENERAL or d.id in outputs or \
                    [u.out.id for u in users.get(d.id, [])] != [node.out.id]:
                continue
            lhs, rhs = dot.inputs
            free = rhs.type.rank - len(dot.attrs["rhs_contract"]) - len(dot.attrs["rhs_batch"])
            if rhs.id not in consts or lhs.id in consts or free != 1:
                continue
            vec = _last_axis_vector(b, producers)
            if vec is None or vec.id not in consts or vec.type.dtype != d.type.dtype or \
                    vec.type.shape != (d.type.shape[-1],):
                continue
            if accept is not None and not accept(dot, vec):
                continue
            found[node.out.id] = (dot, vec)
            break
    return found


def fuse_matmul_epilogue(graph: Graph, accept: Accept | None = None) -> Graph:
    """Each matmul + bias as one ``matmul_epilogue{bias}`` node (the add's result value kept,
    the dot_general's location: the op is the matmul)."""
    found = find_matmul_epilogues(graph, accept)
    if not found:
        return graph
    dead = {dot.out.id for dot, _ in found.values()}
    nodes = []
    for n in graph.nodes:
        if len(n.outputs) == 1 and n.out.id in dead:
            continue
        hit = found.get(n.out.id) if len(n.outputs) == 1 else None
        if hit is not None:
            dot, vec = hit
            attrs = {**dot.attrs, "bias": True, "scale": False, "residual": False, "act": "none"}
            n = Node(Op.MATMUL_EPILOGUE, (*dot.inputs, vec), n.outputs, attrs, dot.loc)
        nodes.append(n)
    return dce(Graph(graph.name, graph.inputs, nodes, graph.outputs))
