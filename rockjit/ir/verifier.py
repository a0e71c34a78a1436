"""The IR verifier: SSA order, attribute sets, and every node's type against its shape rule.

Run between passes (always in tests) so a pass that breaks the graph is caught at its source.
"""
from __future__ import annotations

from ..errors import VerifyError
from .graph import Graph, Node, Value
from .rules import infer_type


def _where(n: Node) -> str:
    res = ", ".join(str(v) for v in n.outputs) or "(no result)"
    return f"node {res} = {n.op.text}" + (f" at {n.loc}" if n.loc else "")


def _check_use(n: Node, v: Value, defined: dict[int, Value]) -> None:
    d = defined.get(v.id)
    if d is None:
        raise VerifyError(f"{_where(n)}: operand {v} is used before it is defined")
    if d.type != v.type:
        raise VerifyError(f"{_where(n)}: operand {v} is used as {v.type} but defined as {d.type}")


def verify(graph: Graph) -> None:
    """Raise ``VerifyError`` at the first broken rule, naming the node, its op and location."""
    defined: dict[int, Value] = {}
    for v in graph.inputs:
        if v.id in defined:
            raise VerifyError(f"graph {graph.name!r}: input {v} is declared twice")
        defined[v.id] = v
    for n in graph.nodes:
        for v in n.inputs:
            _check_use(n, v, defined)
        if len(n.outputs) != 1:
            raise VerifyError(f"{_where(n)}: every op has exactly one result, this node has "
                              f"{len(n.outputs)}")
        try:
            infer_type(n.op, [v.type for v in n.inputs], n.attrs, n.out.type)
        except VerifyError as e:
            raise VerifyError(f"{_where(n)}: {e}") from None
        for v in n.outputs:
            if v.id in defined:
                raise VerifyError(f"{_where(n)}: {v} is defined again (each value is defined "
                                  "once)")
            defined[v.id] = v
    for i, v in enumerate(graph.outputs):
        d = defined.get(v.id)
        if d is None:
            raise VerifyError(f"graph {graph.name!r}: output {i} ({v}) is never defined")
        if d.type != v.type:
            raise VerifyError(f"graph {graph.name!r}: output {i} ({v}) is returned as {v.type} "
                              f"but defined as {d.type}")
