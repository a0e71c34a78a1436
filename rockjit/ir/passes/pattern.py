"""A small structural pattern matcher over the IR's dataflow (tinygrad's UPat is the model).

A ``UPat`` describes a value by the op that makes it and the patterns of its operands:

    x = UPat.var("x")
    SILU = UPat(Op.MUL, (x, UPat(Op.LOGISTIC, (x,))))

* ``op`` is one op or a tuple of ops; None matches any value (a leaf);
* ``name`` binds the matched value; a name bound twice must be the same value (``x`` above);
* ``const`` matches a compile-time scalar (a ``constant``, possibly through broadcasts /
  converts / reshapes of it) equal to the number within a relative 1e-6;
* operands of commutative ops (add, mul, max, min) match in either order;
* ``UPat.any(p, q, ...)`` matches the first alternative that fits.

``match`` yields every binding of the names (``Match``) with the nodes the pattern covered,
so a rewrite can check that nothing outside uses them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from ..graph import Node, Value
from ..ops import Op

COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
_THROUGH = (Op.BROADCAST_IN_DIM, Op.CONVERT, Op.RESHAPE)


@dataclass(frozen=True)
class UPat:
    op: Op | tuple[Op, ...] | None = None
    src: tuple["UPat", ...] | None = None
    name: str | None = None
    const: float | None = None
    attrs: Mapping[str, Any] | None = None
    alternatives: tuple["UPat", ...] = field(default=())

    @staticmethod
    def var(name: str) -> "UPat":
        return UPat(name=name)

    @staticmethod
    def cvar(value: float) -> "UPat":
        return UPat(const=float(value))

    @staticmethod
    def any(*alternatives: "UPat") -> "UPat":
        return UPat(alternatives=tuple(alternatives))


@dataclass
class Match:
    bindings: dict[str, Value]
    nodes: dict[int, Node]          # value id -> node, every non-constant node covered


def scalar_const(v: Value, producers: Mapping[int, Node]) -> float | None:
    """The number a compile-time scalar value holds (through broadcasts), else None."""
    p = producers.get(v.id)
    while p is not None and p.op in _THROUGH:
        p = producers.get(p.inputs[0].id)
    if p is None or p.op is not Op.CONSTANT:
        return None
    return p.scalar


def _close(c: float, want: float) -> bool:
    """``np.isclose(c, want, rtol=1e-6, atol=0)`` on two floats (infinities equal only to
    themselves, NaN to nothing) without numpy's per-call overhead."""
    if c == want:
        return True
    return math.isfinite(c) and math.isfinite(want) and abs(c - want) <= 1e-6 * abs(want)


def _match(pat: UPat, v: Value, producers: Mapping[int, Node], b: dict[str, Value],
           nodes: dict[int, Node]) -> Iterator[tuple[dict[str, Value], dict[int, Node]]]:
    if pat.alternatives:
        for alt in pat.alternatives:
            yield from _match(alt, v, producers, b, nodes)
        return
    if pat.name is not None and pat.name in b:
        if b[pat.name].id == v.id:
            yield b, nodes
        return
    if pat.const is not None:
        c = scalar_const(v, producers)
        if c is None or not _close(c, pat.const):
            return
        yield ({**b, pat.name: v} if pat.name else b), nodes
        return
    if pat.op is None:
        yield ({**b, pat.name: v} if pat.name else b), nodes
        return
    n = producers.get(v.id)
    ops = pat.op if isinstance(pat.op, tuple) else (pat.op,)
    if n is None or n.op not in ops or len(n.outputs) != 1:
        return
    if pat.attrs is not None and any(n.attrs.get(k) != want for k, want in pat.attrs.items()):
        return
    if pat.name is not None:
        b = {**b, pat.name: v}
    nodes = {**nodes, v.id: n}
    if pat.src is None:
        yield b, nodes
        return
    if len(pat.src) != len(n.inputs):
        return
    orders = [pat.src]
    if n.op in COMMUTATIVE and len(pat.src) == 2:
        orders.append(pat.src[::-1])
    for order in orders:
        yield from _match_all(order, n.inputs, producers, b, nodes)


def _match_all(pats, values, producers, b, nodes):
    if not pats:
        yield b, nodes
        return
    for b1, n1 in _match(pats[0], values[0], producers, b, nodes):
        yield from _match_all(pats[1:], values[1:], producers, b1, n1)


def root_ops(pat: UPat) -> frozenset[Op] | None:
    """The ops a value's producer must have for ``pat`` to fit it (a pass tries its patterns
    at every node; most nodes are ruled out by their op alone); None: a variable or a constant
    fits whatever makes it."""
    if pat.alternatives:
        parts = [root_ops(a) for a in pat.alternatives]
        return None if any(p is None for p in parts) else frozenset().union(*parts)
    if pat.op is None or pat.const is not None:
        return None
    return frozenset(pat.op if isinstance(pat.op, tuple) else (pat.op,))


def required_ops(pat: UPat) -> frozenset[Op]:
    """Ops every fit of ``pat`` covers a node of (what all its alternatives need): a graph
    without one of them holds no fit, so a pass skips the pattern there without trying it
    at any node (a graph with gelu has no tanh, one with gelu_tanh no erf)."""
    if pat.alternatives:
        return frozenset.intersection(*(required_ops(a) for a in pat.alternatives))
    if pat.op is None or pat.const is not None or pat.name is not None:
        # a named pattern whose name is already bound fits that value without its op or
        # operands being looked at: it promises nothing
        return frozenset()
    own = frozenset((pat.op,)) if isinstance(pat.op, Op) else frozenset()
    return own.union(*(required_ops(s) for s in pat.src or ()))


def match(pat: UPat, v: Value, producers: Mapping[int, Node]) -> Iterator[Match]:
    """Every way ``pat`` fits the dataflow ending in ``v``."""
    for b, nodes in _match(pat, v, producers, {}, {}):
        yield Match(b, nodes)


def broadcast_source(v: Value, producers: Mapping[int, Node], dims: list[int]
                     ) -> tuple[Value, list[int], int]:
    """Follow the ``broadcast_in_dim`` chain ``v`` is made by back to its source: (source,
    where the source's axes ``dims`` land in ``v``, how many broadcasts); ``v`` itself with
    ``dims`` unchanged and 0 when it is not a broadcast."""
    chain = []
    n = producers.get(v.id)
    while n is not None and n.op is Op.BROADCAST_IN_DIM:
        chain.append(n)
        v = n.inputs[0]
        n = producers.get(v.id)
    return v, compose_broadcast_dims(chain, dims), len(chain)


def compose_broadcast_dims(chain: list[Node], dims: list[int]) -> list[int]:
    """Where axes ``dims`` of the first broadcast's source land after the whole ``chain``
    (the broadcasts in use-to-source order, as walked back from a value)."""
    for b in reversed(chain):
        dims = [b.attrs["broadcast_dimensions"][d] for d in dims]
    return dims
