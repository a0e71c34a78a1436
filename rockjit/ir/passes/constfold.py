"""Constant folding with the op references.

Any node whose operands are all known constants (including operand-less iota, so RoPE tables
and masks built from iota fold) is evaluated and replaced by a CONSTANT node with the same
result and location.  PARAM nodes are never folded: weights stay bound by name.  A
broadcast_in_dim of a constant is evaluated as a view (so its consumers can fold) but not
materialised: constants stay small and the consumer broadcasts.  Results above
``MAX_FOLD_ELEMENTS`` are left alone.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..graph import Graph, Node
from ..ops import Op
from ..reference import evaluate
from ..types import TensorType
from .canonicalize import dce

MAX_FOLD_ELEMENTS = 16 * 1024 * 1024

_NEVER_FOLD = {Op.PARAM}


def constfold(graph: Graph, max_elements: int = MAX_FOLD_ELEMENTS) -> Graph:
    known: dict[int, np.ndarray] = {}
    # Broadcasts' values held as views (ids): a scalar broadcast to an attention-sized shape
    # whose consumers do not fold (a mask fill) must not become a fresh array of tens of MB on
    # every compile. A consumer that folds gets the whole array the reference makes, made once
    # (the references then see exactly the operands they always saw: same bits, same layout).
    views: set[int] = set()

    def operand(vid: int) -> np.ndarray:
        if vid in views:
            views.discard(vid)
            known[vid] = np.array(known[vid])
        return known[vid]

    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op is Op.CONSTANT:
            known[n.out.id] = n.attrs["value"]
            nodes.append(n)
            continue
        foldable = (n.op not in _NEVER_FOLD and all(v.id in known for v in n.inputs)
                    and n.out.type.size <= max_elements)
        if not foldable:
            nodes.append(n)
            continue
        if n.op is Op.BROADCAST_IN_DIM:
            known[n.out.id] = _broadcast_view(known[n.inputs[0].id], n.attrs, n.out.type)
            views.add(n.out.id)
            nodes.append(n)
            continue
        value = evaluate(n.op, [operand(v.id) for v in n.inputs], n.attrs, n.out.type)
        known[n.out.id] = value
        nodes.append(Node(Op.CONSTANT, (), n.outputs, {"value": value}, n.loc))
    # Operands of folded nodes (iotas, intermediate tables) are now unused.
    return dce(Graph(graph.name, graph.inputs, nodes, graph.outputs))


def _broadcast_view(x: np.ndarray, attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    """broadcast_in_dim as ir/reference.py defines it, as a zero-copy read-only view."""
    shape = [1] * t.rank
    for src, dst in enumerate(attrs["broadcast_dimensions"]):
        shape[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(shape), t.shape)
