"""The IR verifier: SSA order, attribute sets, every node's type against its shape rule, and
one type per param name.

Run between passes (always in tests) so a pass that breaks the graph is caught at its source.
"""
from __future__ import annotations

from ..errors import VerifyError
from .graph import Graph, Node, Value
from .ops import Op
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


def _check_param(n: Node, seen: dict[str, Node]) -> None:
    """One param name binds one weight: every param node of that name must have its type."""
    name = n.attrs.get("name")
    first = seen.setdefault(name, n)
    if first.out.type != n.out.type:
        raise VerifyError(f"{_where(n)}: param {name!r} is declared as {n.out.type} here but as "
                          f"{first.out.type} by {_where(first)}; one name binds one weight, so "
                          "rename one of them")


def verify(graph: Graph, typed: dict[int, Node] | None = None) -> None:
    """Raise ``VerifyError`` at the first broken rule, naming the node, its op and location.
    ``typed``: nodes whose result type already passed its shape rule, by identity (a pass
    pipeline verifies after every pass, and most nodes come through a pass unchanged: a node
    is immutable, so its rule's answer cannot change); the nodes checked here are added."""
    defined: dict[int, Value] = {}
    params: dict[str, Node] = {}
    for v in graph.inputs:
        if v.id in defined:
            raise VerifyError(f"graph {graph.name!r}: input {v} is declared twice")
        defined[v.id] = v
    known = defined.get
    typed_get = typed.get if typed is not None else None
    for n in graph.nodes:
        for v in n.inputs:
            if known(v.id) is not v:     # mostly the very Value defined: no type compare
                _check_use(n, v, defined)
        if len(n.outputs) != 1:
            raise VerifyError(f"{_where(n)}: every op has exactly one result, this node has "
                              f"{len(n.outputs)}")
        (out,) = n.outputs
        if typed_get is None or typed_get(id(n)) is not n:
            try:
                infer_type(n.op, [v.type for v in n.inputs], n.attrs, out.type)
            except VerifyError as e:
                raise VerifyError(f"{_where(n)}: {e}") from None
            if typed is not None:
                typed[id(n)] = n    # held, so its id is not reused by another node meanwhile
        if n.op is Op.PARAM:
            _check_param(n, params)
        if out.id in defined:
            raise VerifyError(f"{_where(n)}: {out} is defined again (each value is defined once)")
        defined[out.id] = out
    for i, v in enumerate(graph.outputs):
        d = defined.get(v.id)
        if d is None:
            raise VerifyError(f"graph {graph.name!r}: output {i} ({v}) is never defined")
        if d.type != v.type:
            raise VerifyError(f"graph {graph.name!r}: output {i} ({v}) is returned as {v.type} "
                              f"but defined as {d.type}")
