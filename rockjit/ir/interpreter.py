"""Run a graph on numpy arrays with the op references: the executable meaning of the IR.

Values are dropped after their last use so whole encoders fit in memory.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import TraceError, WeightError
from .graph import Graph, Node
from .ops import Op
from .reference import evaluate
from .types import TensorType


def _describe(a: np.ndarray) -> str:
    try:
        return str(TensorType.of(a))
    except TypeError:
        return f"{a.dtype}{list(a.shape)}"


def _bind_param(node: Node, params: Mapping[str, np.ndarray]) -> np.ndarray:
    name = node.attrs["name"]
    if name not in params:
        raise WeightError(f"param {name!r} (declared {node.out.type}"
                          + (f" at {node.loc}" if node.loc else "")
                          + ") is not bound; pass it in params={...}")
    arr = np.asarray(params[name])
    if arr.dtype != node.out.type.dtype.to_numpy() or arr.shape != node.out.type.shape:
        raise WeightError(f"param {name!r}: expected {node.out.type}, got {_describe(arr)}; "
                          "convert or reshape the weight before binding it")
    return arr


# Ops whose value comes from the run's bindings rather than from the reference.
_BOUND: dict[Op, Callable[[Node, Mapping[str, np.ndarray]], np.ndarray]] = {
    Op.PARAM: _bind_param,
}


def _last_uses(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v.id] = i
    return last


def walk(graph: Graph, env: dict[int, Any], compute: Callable[[Node, list[Any]], Any],
         observe: Callable[[Node, Any], None] | None = None) -> list[Any]:
    """The one graph walker: ``compute(node, operand payloads)`` gives each node's payload
    (an array for ``run``, an (array, error) record for the error oracle, ...) in graph
    order, starting from ``env`` (the graph inputs' payloads by value id). ``observe(node,
    payload)`` sees every result before it can be dropped; payloads are dropped after their
    last use, so whole encoders fit in memory. Returns the outputs' payloads."""
    keep = {v.id for v in graph.outputs}
    last = _last_uses(graph)
    for v in graph.inputs:
        if v.id not in last and v.id not in keep:
            env.pop(v.id, None)
    for i, node in enumerate(graph.nodes):
        try:
            args = [env[v.id] for v in node.inputs]
        except KeyError as e:
            raise KeyError(f"%{e.args[0]} is used by {node.op.text} before it is defined; "
                           "run rockjit.ir.verifier.verify(graph)") from None
        res = compute(node, args)
        env[node.out.id] = res
        if observe is not None:
            observe(node, res)
        for v in node.inputs:
            if last.get(v.id) == i and v.id not in keep:
                env.pop(v.id, None)
        if node.out.id not in last and node.out.id not in keep:
            env.pop(node.out.id, None)
    return [env[v.id] for v in graph.outputs]


def run(graph: Graph, inputs: Sequence[Any], params: Mapping[str, np.ndarray] | None = None,
        observe: Callable[[Node, np.ndarray], None] | None = None) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` (one array per graph input, exact dtype and shape) with
    the named ``params``; returns one array per graph output. ``observe(node, value)`` sees
    every intermediate (``walk``)."""
    params = params or {}
    if len(inputs) != len(graph.inputs):
        raise TraceError(f"graph {graph.name!r} takes {len(graph.inputs)} input(s), "
                         f"got {len(inputs)}")
    env: dict[int, Any] = {}
    for i, (v, x) in enumerate(zip(graph.inputs, inputs)):
        arr = np.asarray(x)
        if arr.dtype != v.type.dtype.to_numpy() or arr.shape != v.type.shape:
            raise TraceError(f"input {i} of graph {graph.name!r}: expected {v.type}, got "
                             f"{_describe(arr)}")
        env[v.id] = arr

    def compute(node: Node, args: list[np.ndarray]) -> np.ndarray:
        bound = _BOUND.get(node.op)
        if bound is not None:
            return bound(node, params)
        try:
            return evaluate(node.op, args, node.attrs, node.out.type)
        except Exception as e:
            e.add_note(f"while evaluating %{node.out.id} = {node.op.text}"
                       + (f" at {node.loc}" if node.loc else ""))
            raise

    return walk(graph, env, compute, observe)
