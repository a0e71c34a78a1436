"""The rockjit IR graph: immutable typed nodes in SSA order.

A ``Graph`` is a function: typed inputs, a list of nodes in definition order, and outputs.
Resident weights are ``param`` nodes that name a constant bound outside the graph, so the IR
text never carries weight bytes. Every node keeps the user's source location.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..errors import VerifyError
from .ops import Op
from .rules import infer_type
from .types import TensorType


@dataclass(frozen=True)
class Loc:
    """Where the user wrote the op: file and line of the traced Python code."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, eq=True)
class Value:
    """An SSA value. ``id`` is unique within its graph; the text form spells it ``%id``."""

    id: int
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.id}"


def _freeze(v: Any) -> Any:
    """Attribute values are stored hashable: lists become tuples, arrays stay arrays."""
    t = type(v)
    if t is int or t is str or t is bool or t is float:    # most attributes: as they are
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def attrs_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(attrs_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class cached_attr:
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first
    read, a tenth of building a graph's nodes): a value of an immutable node, computed on
    first read into the instance dict, which later reads find first."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        v = self.fn(obj)
        obj.__dict__[self.name] = v
        return v


class _ArrayKey:
    """An array attribute as a key: equal to another exactly when ``attrs_equal`` says so, its
    hash from the bytes once. It holds the array, not a copy of its bytes: a node keeps its
    key as long as itself."""

    __slots__ = ("array", "_hash")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self._hash = hash((array.dtype.str, array.shape, array.tobytes()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _ArrayKey) and self._hash == other._hash
                and attrs_equal(self.array, other.array))


def _attr_key(v: Any) -> Any:
    t = type(v)
    if t is tuple and all(type(x) is int for x in v):
        # the common attribute (axes, shapes): exact ints, told apart by == (no bool or float
        # among them); a tag no recursive key (a tuple of tuples) can equal
        return ("ints", v)
    if isinstance(v, np.ndarray):
        return _ArrayKey(v)
    if t is int or t is str or t is bool or t is float:
        return (t.__name__, v)
    if isinstance(v, tuple):
        return tuple(_attr_key(x) for x in v)
    return (t.__name__, v)


@dataclass(frozen=True, eq=False)
class Node:
    op: Op
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    loc: Loc | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if type(self.inputs) is not tuple:
            set_(self, "inputs", tuple(self.inputs))
        if type(self.outputs) is not tuple:
            set_(self, "outputs", tuple(self.outputs))
        set_(self, "attrs", {k: _freeze(v) for k, v in sorted(self.attrs.items())}
             if self.attrs else {})
        if len(self.outputs) == 1:
            # ``out`` read per node by every pass: in the instance dict from the start
            set_(self, "out", self.outputs[0])

    @cached_attr
    def out(self) -> Value:
        # a node without exactly one result raises on every read (one with is set above)
        (v,) = self.outputs
        return v

    @cached_attr
    def attr_key(self) -> tuple:
        """The attributes as a hashable key that tells apart every pair ``attrs_equal`` does
        (an array by dtype, shape and bytes). Cached like ``out``: CSE keys every node by it
        in every round of every canonicalize, and a constant's key hashes all its bytes."""
        return tuple((k, _attr_key(v)) for k, v in self.attrs.items())

    @cached_attr
    def scalar(self) -> float | None:
        """The number a constant holds in every element, else None (a node that is not a
        constant, an empty or a non-uniform one). Patterns ask it of the same constants
        at every candidate node (passes/pattern.py)."""
        if self.op is not Op.CONSTANT:
            return None
        a = np.asarray(self.attrs["value"]).reshape(-1)
        if a.size == 0 or not np.all(a == a[0]):
            return None
        return float(a[0])

    @cached_attr
    def cse_key(self) -> tuple:
        """What the node computes: op, operand ids, attributes and result types (not its
        results' ids or loc); CSE merges nodes with equal keys, asking each node every round."""
        return (self.op, tuple(v.id for v in self.inputs), self.attr_key,
                tuple(v.type for v in self.outputs))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Node) and self.op is other.op and self.inputs == other.inputs
                and self.outputs == other.outputs and self.loc == other.loc
                and self.attrs.keys() == other.attrs.keys()
                and all(attrs_equal(self.attrs[k], other.attrs[k]) for k in self.attrs))

    def __hash__(self) -> int:
        return hash((self.op, self.inputs, self.outputs))


@dataclass(eq=False)
class Graph:
    name: str
    inputs: tuple[Value, ...]
    nodes: list[Node]
    outputs: tuple[Value, ...]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Graph) and self.name == other.name
                and self.inputs == other.inputs and self.outputs == other.outputs
                and len(self.nodes) == len(other.nodes)
                and all(a is b or a == b for a, b in zip(self.nodes, other.nodes)))

    def params(self) -> dict[str, TensorType]:
        """Resident constants the graph expects to be bound, by name."""
        return {n.attrs["name"]: n.out.type for n in self.nodes if n.op is Op.PARAM}

    def producers(self) -> dict[int, Node]:
        """Value id -> the node defining it. Shared with every other caller while the node list
        holds the same nodes (``_index``): read it, never change it."""
        return self._index()[1]

    def users(self) -> dict[int, list[Node]]:
        """Value id -> the nodes reading it, in order. Shared like ``producers``."""
        return self._index()[2]

    def _index(self) -> tuple[tuple[Node, ...], dict[int, Node], dict[int, list[Node]]]:
        """Both maps, made once per node list: the passes and the lowering ask the same graph
        for them up to a dozen times (two thirds of the calls in a ModernBERT-base x22 compile
        hit). Nodes are immutable, so the maps are valid while the list holds the very same
        node objects in the same order, which a walk of identities checks."""
        nodes = tuple(self.nodes)
        memo = self.__dict__.get("_index_memo")
        if memo is not None and len(memo[0]) == len(nodes) and \
                all(map(operator.is_, memo[0], nodes)):
            return memo
        producers = {v.id: n for n in nodes for v in n.outputs}
        users: dict[int, list[Node]] = {}
        for n in nodes:
            for v in n.inputs:
                us = users.get(v.id)
                if us is None:
                    users[v.id] = [n]
                else:
                    us.append(n)
        memo = self.__dict__["_index_memo"] = (nodes, producers, users)
        return memo

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op.text] = counts.get(n.op.text, 0) + 1
        return counts

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)


class Builder:
    """Appends nodes to a graph under construction, handing out fresh value ids."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self._next = 0
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []

    def _fresh(self, t: TensorType) -> Value:
        v = Value(self._next, t)
        self._next += 1
        return v

    def input(self, t: TensorType) -> Value:
        v = self._fresh(t)
        self.inputs.append(v)
        return v

    def add(self, op: Op, inputs: Iterable[Value], out_type: TensorType | None = None,
            attrs: Mapping[str, Any] | None = None, loc: Loc | None = None) -> Value:
        """Append one single-result node.  Without ``out_type`` the op's shape rule infers it;
        with it, the shape rule must agree.  Ops whose result is not derivable (param, iota,
        reshape, convert, broadcast_in_dim) require ``out_type``.  Any violation raises
        ``VerifyError`` naming the value being built and ``loc``."""
        inputs = tuple(inputs)
        attrs = dict(attrs or {})
        try:
            inferred = infer_type(op, [v.type for v in inputs], attrs, out_type)
        except VerifyError as e:
            # Name the value about to be defined and the user's line, so the report points
            # at the traced source rather than at the builder.
            where = f" at {loc}" if loc else ""
            raise VerifyError(f"building %{self._next}{where}: {e}") from None
        v = self._fresh(inferred)
        self.nodes.append(Node(op, inputs, (v,), attrs, loc))
        return v

    def finish(self, outputs: Iterable[Value]) -> Graph:
        return Graph(self.name, tuple(self.inputs), list(self.nodes), tuple(outputs))
