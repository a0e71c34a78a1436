"""Fusion analysis: recognise composite activations written as element-wise op chains.

JAX spells GELU as ``0.5 x (1 - erf(-x / sqrt 2))`` (exact) or ``0.5 x (1 + tanh(sqrt(2/pi)
(x + 0.044715 x^3)))`` (tanh form), SiLU as ``x * logistic(x)``, and a user may write any
algebraically equal arrangement. Matching one spelling is brittle, so this analysis matches by
*meaning*: it finds each maximal single-input element-wise region (a chain of unary/binary ops
whose only run-time leaf is one value ``x`` and whose other leaves are compile-time
constants), evaluates it with the IR's numpy reference on probe points, and compares it with
the known activations. A region that matches becomes one ``Activation`` annotation; the graph
itself is not rewritten (no new IR op is needed: the lowering reads the annotation and emits
the composite as one LUT activation, skipping the absorbed nodes).

The result is an annotation keyed by the region's root value id. A region is only fused when
every interior value is used inside the region (otherwise the interior value is needed anyway
and fusing would compute it twice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from scipy import special

from ..graph import Graph, Node, Value
from ..ops import Group, Op
from ..reference import evaluate
from ..types import TensorType

MAX_REGION = 24           # ops in one composite; JAX's tanh-GELU is 8 (+ constants)
PROBE = np.concatenate([np.linspace(-12.0, 12.0, 961), [-1e-3, 0.0, 1e-3]])
# float32 evaluation of a chain of ~8 ops: a few ulps of f32 relative to |f| + a tiny floor;
# the two GELU forms differ by up to ~5e-4, far above this
RTOL, ATOL = 2e-5, 1e-6
MIN_ROUNDS = 4            # probe evaluations per candidate region at least (_probe_rounds)
MAX_PROBED = 1 << 14      # positions of a large x the probe visits (_positions)


def _phi(x: np.ndarray) -> np.ndarray:
    # scipy's vectorised erf: tolerance.graph_bound evaluates these references on whole
    # activations (millions of elements), where a per-element Python erf took minutes
    return 0.5 * (1.0 + special.erf(np.asarray(x, np.float64) / math.sqrt(2.0)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


KNOWN: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": lambda x: x * _phi(x),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                    * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x * _sigmoid(x),
}

_ELEMENTWISE = {Group.UNARY, Group.BINARY}


@dataclass(frozen=True)
class Activation:
    """``root`` = kind(``x``); ``absorbed`` = ids of the region's other values."""

    kind: str
    x: Value
    root: Value
    absorbed: frozenset[int]
    ops: int


def _region(root: Node, producers: Mapping[int, Node], consts: Mapping[int, np.ndarray],
            pos: Mapping[int, int]) -> tuple[list[Node], set[int]] | None:
    """The element-wise nodes feeding ``root`` back to non-element-wise or run-time leaves,
    and the ids of its run-time leaves."""
    nodes: dict[int, Node] = {}
    leaves: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n.out.id in nodes:
            continue
        nodes[n.out.id] = n
        if len(nodes) > MAX_REGION:
            return None
        for v in n.inputs:
            if v.id in consts:
                continue
            p = producers.get(v.id)
            if p is not None and p.op.group in _ELEMENTWISE and v.type == root.out.type:
                stack.append(p)
            else:
                leaves.add(v.id)
    # graph order, as a scan of ``producers`` would give it, but from the region's own values
    # (``pos``: each value's index in ``producers``): a scan per region is quadratic in depth
    vids = sorted((v.id for n in nodes.values() for v in n.outputs), key=pos.__getitem__)
    return [producers[i] for i in vids], leaves


def find_activations(graph: Graph, consts: Mapping[int, np.ndarray]) -> dict[int, Activation]:
    """Composite activations in ``graph`` by root value id (see the module docstring).
    ``consts``: compile-time values by value id (params, constants, their broadcasts)."""
    producers = {v.id: n for n in graph.nodes for v in n.outputs}
    pos = {vid: i for i, vid in enumerate(producers)}
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            users.setdefault(v.id, []).append(n)
    outputs = {v.id for v in graph.outputs}
    found: dict[int, Activation] = {}
    taken: set[int] = set()
    # later nodes first: the largest region containing a node is found from its root
    for node in reversed(graph.nodes):
        if node.op.group not in _ELEMENTWISE or node.out.id in taken or node.out.id in consts:
            continue
        if not node.out.type.dtype.is_float:
            continue
        reg = _region(node, producers, consts, pos)
        if reg is None:
            continue
        full, leaves = reg
        # the activation's input may sit inside the region (a bias add before the GELU is
        # element-wise too): try every value of the region as x, earliest (largest) first
        values = {v.id: v for n in full for v in n.inputs if v.id not in consts}
        cands = [values[i] for i in leaves] + [n.out for n in full if n is not node]
        for x in cands:
            if x.type != node.out.type:
                continue
            sub: list[Node] = []
            ids: set[int] = set()
            for n in full:
                if any(v.id == x.id or v.id in ids for v in n.inputs):
                    sub.append(n)
                    ids.add(n.out.id)
            if node.out.id not in ids or len(sub) < 2:
                continue
            if any(v.id not in consts and v.id != x.id and v.id not in ids
                   for n in sub for v in n.inputs):
                continue
            interior = ids - {node.out.id}
            if any(i in outputs or any(u.out.id not in ids for u in users.get(i, []))
                   for i in interior):
                continue
            kind = _classify(sub, x, node, consts)
            if kind is None:
                continue
            found[node.out.id] = Activation(kind, x, node.out, frozenset(interior), len(sub))
            taken |= ids
            break
    return found


def _probe_rounds(size: int) -> list[np.ndarray]:
    """Probe arrays (flat, ``size`` long) whose union puts the whole PROBE range through
    every element position. A region's constants may differ per element (a bias added before
    the activation is one per channel), so one position seeing one probe point is not enough:
    with a small x (a 1-row matrix, M = 1) the first ``size`` points alone are all in the flat
    tail near -12, where gelu(x + b) and gelu(x) agree, and a bias would be silently dropped.
    Fewer positions than points: consecutive windows cover every point, each position seeing
    every size-th one. More: at least MIN_ROUNDS shifted copies, each position seeing points a
    quarter of the range apart."""
    n = PROBE.size
    rounds = max(-(-n // size), MIN_ROUNDS)
    step = size if size < n else n // rounds + 1
    i = np.arange(size)
    return [PROBE[(i + k * step) % n] for k in range(rounds)]


def _positions(size: int) -> np.ndarray | None:
    """Flat positions of x the probe visits: all of a small x; of a large one MAX_PROBED, the
    first half dense (every channel of the leading rows) and the rest spread evenly (the
    later rows and channels). A region is element-wise, so a consistent subset of every
    operand's elements is a smaller instance of the same region."""
    if size <= MAX_PROBED:
        return None
    half = MAX_PROBED // 2
    return np.unique(np.concatenate([np.arange(half),
                                     np.linspace(half, size - 1, MAX_PROBED - half).astype(np.int64)]))


def _classify(order: list[Node], x: Value, root: Node,
              consts: Mapping[int, np.ndarray]) -> str | None:
    """Evaluate the region on the probe points (over x's positions) and name it."""
    shape = x.type.shape
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        return None
    dt = x.type.dtype.to_numpy()
    sel = _positions(size)
    k = size if sel is None else int(sel.size)
    sub: dict[int, np.ndarray] = {}
    try:
        for n in order:
            for v in n.inputs:
                if v.id in consts and v.id not in sub:
                    a = np.broadcast_to(np.asarray(consts[v.id]), shape).reshape(-1)
                    sub[v.id] = a if sel is None else a[sel]
    except ValueError:
        return None
    # every round in one evaluation: the region is element-wise, so the concatenated probe
    # (and each constant repeated per round) gives each round's values; one pass per node
    # instead of one per round matters for a 1-element x, which takes PROBE.size rounds
    rounds = _probe_rounds(k)
    probe = np.concatenate(rounds).astype(dt)
    kk = int(probe.size)
    subs = {i: np.tile(a, len(rounds)) for i, a in sub.items()}
    env: dict[int, np.ndarray] = {x.id: probe}
    try:
        with np.errstate(all="ignore"):
            for n in order:
                args = [env[v.id] if v.id in env else subs[v.id] for v in n.inputs]
                env[n.out.id] = evaluate(n.op, args, n.attrs,
                                         TensorType(n.out.type.dtype, (kk,)))
    except Exception:
        return None
    got = np.asarray(env[root.out.id], np.float64)
    p64 = probe.astype(np.float64)
    for kind, f in KNOWN.items():
        want = f(p64)
        if np.all(np.abs(got - want) <= RTOL * np.abs(want) + ATOL):
            return kind
    return None
