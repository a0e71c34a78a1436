"""Fusion: rewrite composite activations spelled as element-wise op chains into one
``activation{kind}`` op (ir/activations.py holds what each kind means).

Softmax (exp(x - max) / sum over the same axes, the max as jax writes it through max(-inf,
.)) becomes ``softmax{axes}``: a structural match whose reduce axes agree and whose broadcasts
put each row statistic back on its row; the lowering expands it again (ir/composites.py).
LayerNorm's normalisation ((x - mean) * rsqrt(var + eps)) likewise becomes
``layer_norm{axes, eps}``.

JAX spells GELU as ``0.5 x (1 - erf(-x / sqrt 2))`` (exact, through erfc) or ``0.5 x (1 +
tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (tanh form), SiLU as ``x * logistic(x)``, softplus as
``logaddexp(x, 0)`` and Mish as ``x * tanh(softplus(x))``. Each spelling is a structural
pattern (``PATTERNS``, pattern.UPat); a match is then *validated* numerically: the matched
nodes are evaluated with the IR's numpy reference on probe points and compared with the
kind's reference, so a pattern that is too loose can never change a result. A match is only
rewritten when every interior value is used inside it (otherwise that value is needed anyway
and fusing would compute it twice).

The rewritten op keeps the root's result value, so nothing downstream changes; the interior
nodes become dead and ``dce`` removes them.
"""
from __future__ import annotations

import math

import numpy as np

from ..activations import ACTIVATIONS
from ..graph import Graph, Node, Value
from ..ops import Op
from ..reference import evaluate
from ..types import TensorType
from .canonicalize import dce
from .pattern import (Match, UPat, broadcast_source, compose_broadcast_dims, match,
                      required_ops, root_ops, scalar_const)

PROBE = np.concatenate([np.linspace(-12.0, 12.0, 961), [-1e-3, 0.0, 1e-3]])
# float32 evaluation of a chain of ~8-20 ops: a few ulps of f32 relative to |f| + a tiny floor;
# the two GELU forms differ by up to ~5e-4, far above this
RTOL, ATOL = 2e-5, 1e-6

x = UPat.var("x")
ZERO, HALF, ONE = UPat.cvar(0.0), UPat.cvar(0.5), UPat.cvar(1.0)
R2 = 1.0 / math.sqrt(2.0)


def _mul(a: UPat, b: UPat, name: str | None = None) -> UPat:
    return UPat(Op.MUL, (a, b), name)


def _half_x_times(f: UPat) -> UPat:
    """0.5 * x * f in the association orders people write (mul is matched both ways round)."""
    return UPat.any(_mul(_mul(HALF, x), f), _mul(x, _mul(HALF, f)), _mul(_mul(x, f), HALF))


# 1 + erf(x / sqrt 2): by hand, or as jax writes it (1 - erf(-x / sqrt 2), from erfc)
_ERF_ARG = UPat.any(_mul(x, UPat.cvar(R2)), UPat(Op.DIV, (x, UPat.cvar(math.sqrt(2.0)))))
_NEG_ERF_ARG = UPat.any(_mul(UPat(Op.NEG, (x,)), UPat.cvar(R2)), _mul(x, UPat.cvar(-R2)))
GELU = _half_x_times(UPat.any(UPat(Op.ADD, (ONE, UPat(Op.ERF, (_ERF_ARG,)))),
                              UPat(Op.SUB, (ONE, UPat(Op.ERF, (_NEG_ERF_ARG,))))))

_CUBE = UPat.any(UPat(Op.INTEGER_POW, (x,), attrs={"y": 3}), UPat(Op.POW, (x, UPat.cvar(3.0))),
                 _mul(x, _mul(x, x)))
_GT_INNER = _mul(UPat.cvar(math.sqrt(2.0 / math.pi)),
                 UPat(Op.ADD, (x, _mul(UPat.cvar(0.044715), _CUBE))))
GELU_TANH = _half_x_times(UPat(Op.ADD, (ONE, UPat(Op.TANH, (_GT_INNER,)))))

SILU = UPat.any(_mul(x, UPat(Op.LOGISTIC, (x,))),
                UPat(Op.DIV, (x, UPat(Op.ADD, (ONE, UPat(Op.EXP, (UPat(Op.NEG, (x,)),)))))))


def _log1p(e: UPat) -> UPat:
    """log1p(e) as the frontend writes it (frontend/elementwise.py) or plainly log(1 + e)."""
    u = UPat(Op.ADD, (ONE, e), name="u")
    dm = UPat(Op.SUB, (u, ONE), name="dm")
    eb = UPat.var("e")
    exact = UPat(Op.SELECT_N, (UPat(Op.EQ, (dm, ZERO)),
                               _mul(UPat(Op.LOG, (UPat.var("u"),)),
                                    UPat(Op.DIV, (eb, UPat.var("dm")))), eb))
    return UPat.any(exact, UPat(Op.LOG, (UPat(Op.ADD, (ONE, e)),)))


# jnp.logaddexp(x, 0): max(x, 0) + log1p(exp(-|x - 0|)), with a NaN guard on x - 0
_D = UPat(Op.SUB, (x, ZERO), name="d")
_LOGADDEXP = UPat(Op.SELECT_N, (
    UPat(Op.NE, (_D, UPat.var("d"))),
    UPat(Op.ADD, (UPat(Op.MAX, (x, ZERO)),
                  _log1p(UPat(Op.EXP, (UPat(Op.NEG, (UPat(Op.ABS, (UPat.var("d"),)),)),),
                              name="e")))),
    UPat(Op.ADD, (x, ZERO))))
SOFTPLUS = UPat.any(_LOGADDEXP, UPat(Op.LOG, (UPat(Op.ADD, (ONE, UPat(Op.EXP, (x,)))),)))
MISH = _mul(x, UPat(Op.TANH, (SOFTPLUS,)))

# Tried in this order at each root, roots latest first: a Mish is found before the softplus
# inside it.
PATTERNS: tuple[tuple[UPat, str], ...] = (
    (MISH, "mish"), (GELU, "gelu"), (GELU_TANH, "gelu_tanh"), (SILU, "silu"),
    (SOFTPLUS, "softplus"),
)


Maps = tuple[dict[int, Node], dict[int, list[Node]], set[int]]


def _maps(graph: Graph) -> Maps:
    """(producers, users, output ids) of ``graph``: what each finder reads; ``fuse`` makes
    them once for its three finders."""
    return graph.producers(), graph.users(), {v.id for v in graph.outputs}


def _rows(p: UPat) -> UPat:
    """A per-row statistic broadcast back over the row (one or two broadcast_in_dim)."""
    b = UPat(Op.BROADCAST_IN_DIM, (p,))
    return UPat.any(UPat(Op.BROADCAST_IN_DIM, (b,)), b)


# softmax over the reduced axes: exp(x - max) / sum, the max through jax's max(-inf, .)
_ROW_MAX = UPat(Op.REDUCE_MAX, (x,), name="m")
_E = UPat(Op.EXP, (UPat(Op.SUB, (x, _rows(UPat.any(UPat(Op.MAX, (UPat.cvar(-np.inf), _ROW_MAX)),
                                                    _ROW_MAX)))),), name="e")
SOFTMAX = UPat(Op.DIV, (_E, _rows(UPat(Op.REDUCE_SUM, (UPat.var("e"),), name="s"))))


# each pattern with the ops its root can have and the ops any fit of it covers
_PATTERN_OPS = [(pat, kind, root_ops(pat), required_ops(pat)) for pat, kind in PATTERNS]


def _restores(v: Value, producers, axes, rank: int) -> Value | None:
    """The row statistic ``v`` broadcasts from, when the broadcasts put each row value back on
    the row it came from (the composed broadcast dimensions are the kept axes, in order)."""
    kept = [i for i in range(rank) if i not in set(axes)]
    src, dims, _ = broadcast_source(v, producers, list(range(len(kept))))
    return src if dims == kept else None


def find_softmax(graph: Graph, maps: Maps | None = None
                 ) -> dict[int, tuple[Value, tuple[int, ...], frozenset[int]]]:
    """root value id -> (x, axes, interior ids) of each softmax (structural: the max and the
    sum reduce the same axes and both broadcasts put the row statistic back on its row)."""
    producers, users, outputs = maps or _maps(graph)
    found = {}
    for node in graph.nodes:
        if node.op is not Op.DIV:
            continue
        for m in match(SOFTMAX, node.out, producers):
            b = m.bindings
            mx, sm = producers[b["m"].id], producers[b["s"].id]
            if mx.attrs["axes"] != sm.attrs["axes"] or not b["x"].type.dtype.is_float:
                continue
            axes, rank = tuple(mx.attrs["axes"]), b["x"].type.rank
            sub = producers[producers[b["e"].id].inputs[0].id]
            row_max = _restores(sub.inputs[1], producers, axes, rank)
            if row_max is None or (row_max.id != b["m"].id
                                   and b["m"] not in producers[row_max.id].inputs):
                continue
            row_sum = _restores(node.inputs[1], producers, axes, rank)
            if row_sum is None or row_sum.id != b["s"].id:
                continue
            interior = set(m.nodes) - {node.out.id}
            if any(i in outputs or any(u.out.id not in m.nodes for u in users.get(i, []))
                   for i in interior):
                continue
            found[node.out.id] = (b["x"], axes, frozenset(interior))
            break
    return found


def _validates(m: Match, root: Node, kind: str, producers, pos) -> bool:
    """The matched nodes compute ``kind`` on the probe points (in x's dtype)."""
    xv = m.bindings["x"]
    if xv.type != root.out.type or not xv.type.dtype.is_float:
        return False
    dt = xv.type.dtype.to_numpy()
    probe = PROBE.astype(dt)
    k = int(probe.size)
    env: dict[int, np.ndarray] = {xv.id: probe}
    order = sorted(m.nodes.values(), key=lambda n: pos[n.out.id])
    try:
        with np.errstate(all="ignore"):
            for n in order:
                args = []
                for v in n.inputs:
                    if v.id not in env:
                        c = scalar_const(v, producers)
                        if c is None:
                            return False
                        env[v.id] = np.full(k, c, v.type.dtype.to_numpy())
                    args.append(env[v.id])
                env[n.out.id] = evaluate(n.op, args, n.attrs, TensorType(n.out.type.dtype, (k,)))
    except Exception:
        return False
    got = np.asarray(env[root.out.id], np.float64)
    want = ACTIVATIONS[kind].reference(probe.astype(np.float64))
    return bool(np.all(np.abs(got - want) <= RTOL * np.abs(want) + ATOL))


def find_matches(graph: Graph, maps: Maps | None = None
                 ) -> dict[int, tuple[str, Value, frozenset[int]]]:
    """root value id -> (kind, x, ids of the interior values), for every validated match."""
    producers, users, outputs = maps or _maps(graph)
    pos = {vid: i for i, vid in enumerate(producers)}
    found: dict[int, tuple[str, Value, frozenset[int]]] = {}
    taken: set[int] = set()
    present = {n.op for n in graph.nodes}
    patterns = [(pat, kind, ops) for pat, kind, ops, needs in _PATTERN_OPS if needs <= present]
    for node in reversed(graph.nodes):
        if len(node.outputs) != 1 or node.out.id in taken:
            continue
        for pat, kind, ops in patterns:
            if ops is not None and node.op not in ops:
                continue
            hit = None
            for m in match(pat, node.out, producers):
                interior = set(m.nodes) - {node.out.id}
                if interior & taken or any(
                        i in outputs or any(u.out.id not in m.nodes for u in users.get(i, []))
                        for i in interior):
                    continue
                if _validates(m, node, kind, producers, pos):
                    hit = m
                    break
            if hit is not None:
                found[node.out.id] = (kind, hit.bindings["x"], frozenset(set(hit.nodes)
                                                                         - {node.out.id}))
                taken |= set(hit.nodes)
                break
    return found


def _bc(p: UPat) -> UPat:
    return UPat(Op.BROADCAST_IN_DIM, (p,))


# (x - mean) * rsqrt(mean(c c) + eps), the means as sum / n kept as rows (models/layers.py,
# torch.nn.LayerNorm's arithmetic); the square as c * c or c ** 2
_C = UPat(Op.SUB, (x, _bc(UPat(Op.DIV, (_bc(UPat(Op.REDUCE_SUM, (x,), name="s1")),
                                        UPat.var("n1"))))), name="c")
_SQ = UPat.any(UPat(Op.MUL, (UPat.var("c"), UPat.var("c"))),
               UPat(Op.INTEGER_POW, (UPat.var("c"),), attrs={"y": 2}))
_VAR = UPat(Op.DIV, (_bc(UPat(Op.REDUCE_SUM, (_SQ,), name="s2")), UPat.var("n2")))
LAYER_NORM = UPat(Op.MUL, (_C, _bc(UPat(Op.RSQRT, (UPat(Op.ADD, (_VAR, UPat.var("eps"))),)))))
_ROW_OPS = (Op.BROADCAST_IN_DIM, Op.DIV, Op.ADD, Op.RSQRT)


def _row_dims(v: Value, producers, stop: int) -> list[int] | None:
    """The composed broadcast dimensions from the row statistic ``stop`` to ``v``, through
    row-wise arithmetic on it (a divide by the count, the add of eps, the rsqrt)."""
    chain = []
    while v.id != stop:
        n = producers.get(v.id)
        if n is None or n.op not in _ROW_OPS:
            return None
        if n.op is Op.BROADCAST_IN_DIM:
            chain.append(n)
        v = n.inputs[0]
    if not chain:
        return None
    return compose_broadcast_dims(chain, list(range(chain[-1].inputs[0].type.rank)))


def find_layer_norm(graph: Graph, maps: Maps | None = None
                    ) -> dict[int, tuple[Value, dict, frozenset[int]]]:
    """root value id -> (x, attrs, interior ids) of each LayerNorm normalisation (structural:
    both sums reduce the same axes, both divide by the count of reduced elements, and every
    row statistic is broadcast back onto its own row)."""
    producers, users, outputs = maps or _maps(graph)
    found = {}
    for node in graph.nodes:
        if node.op is not Op.MUL:
            continue
        for m in match(LAYER_NORM, node.out, producers):
            b = m.bindings
            xv = b["x"]
            s1, s2 = producers[b["s1"].id], producers[b["s2"].id]
            axes = tuple(s1.attrs["axes"])
            if tuple(s2.attrs["axes"]) != axes or not xv.type.dtype.is_float:
                continue
            count = float(np.prod([xv.type.shape[a] for a in axes]))
            n1, n2, eps = (scalar_const(b[k], producers) for k in ("n1", "n2", "eps"))
            if n1 != count or n2 != count or eps is None or not eps >= 0:
                continue
            kept = [i for i in range(xv.type.rank) if i not in axes]
            sub = producers[b["c"].id]
            rs = node.inputs[1] if node.inputs[0].id == b["c"].id else node.inputs[0]
            if _row_dims(sub.inputs[1], producers, b["s1"].id) != kept or \
                    _row_dims(rs, producers, b["s2"].id) != kept:
                continue
            interior = set(m.nodes) - {node.out.id}
            if any(i in outputs or any(u.out.id not in m.nodes for u in users.get(i, []))
                   for i in interior):
                continue
            found[node.out.id] = (xv, {"axes": list(axes), "eps": float(eps)},
                                  frozenset(interior))
            break
    return found


def fuse(graph: Graph) -> Graph:
    """Each validated composite activation becomes one ``activation{kind}`` node, each
    softmax one ``softmax{axes}`` node, each LayerNorm normalisation one
    ``layer_norm{axes, eps}`` node."""
    rewrite: dict[int, tuple[Op, Value, dict]] = {}
    dead: set[int] = set()
    maps = _maps(graph)
    for root, (kind, xv, interior) in find_matches(graph, maps).items():
        rewrite[root] = (Op.ACTIVATION, xv, {"kind": kind})
        dead |= interior
    for root, (xv, axes, interior) in find_softmax(graph, maps).items():
        if root in dead or interior & (dead | set(rewrite)):
            continue
        rewrite[root] = (Op.SOFTMAX, xv, {"axes": list(axes)})
        dead |= interior
    for root, (xv, attrs, interior) in find_layer_norm(graph, maps).items():
        if root in dead or interior & (dead | set(rewrite)):
            continue
        rewrite[root] = (Op.LAYER_NORM, xv, attrs)
        dead |= interior
    if not rewrite:
        return graph
    nodes = []
    for n in graph.nodes:
        if len(n.outputs) == 1 and n.out.id in dead:
            continue
        hit = rewrite.get(n.out.id) if len(n.outputs) == 1 else None
        if hit is not None:
            n = Node(hit[0], (hit[1],), n.outputs, hit[2], n.loc)
        nodes.append(n)
    return dce(Graph(graph.name, graph.inputs, nodes, graph.outputs))
