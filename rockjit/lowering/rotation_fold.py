"""A signed permutation of a projection's features folded into its weights (RoPE's rotate_half).

Rotary embedding computes ``q * cos + rotate_half(q) * sin`` with ``rotate_half(q) =
concat([-q2, q1])`` over the head dim. Where q is a projection with resident weights
(``x @ W (+ b)``) carried to the rotation by slices, reshapes and transposes only (ModernBERT's
fused Wqkv: a slice of one wide matmul, split into heads), every element of ``rotate_half(q)``
is plus or minus one element of the projection's output, at the same row: a fixed signed
permutation P of W's output features (any row-preserving signed selection of its columns folds
the same way). So

    rotate_half(q) = carry(x @ (W P) + b P)

is a second projection with weights known at compile time. The rewrite builds it once: the
neg, the slices and the concatenate leave the run-time graph (on the NPU they had no form: a
neg of a strided slice, a concat at half a head), and the ``* sin`` that reads the result
becomes an ordinary element-wise product of a cube and a constant cube.

Exact: a column permutation and a negation change no rounding (fp16 and fp32 round
symmetrically), so ``x @ (W P)`` is bit for bit the permuted and negated ``x @ W``.

Cost: ``W P`` is resident beside W (ModernBERT-base: q's and k's columns, 2.4 MB fp16 per
layer), and a second matmul reads x again. The ``* cos`` / ``* sin`` products reach the NPU
only where q's cubes form one dense run (eltwise rules: the constant cube); a batch of several
sequences splits each head's rows, and those products stay on the host.

The rotation is recognised by its effect, not by its op sequence: the movement ops (slice,
reshape, transpose, concatenate, neg) between the projection and the rotated value are run on
an array of signed element indices of the projection's output, and the fold is made only when
the result is a row-preserving signed permutation of the columns q reads. All rotations of
one projection (q's and k's) share one new matmul, its columns side by side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..ir.types import TensorType
from ..weight_timing import timed
from .gain_fold import feature_vector
from .range_rewrites import GraphEditor

# ops that move a projection's elements without changing them
_CARRY = (Op.SLICE, Op.RESHAPE, Op.TRANSPOSE)
# and those a rotation adds: a sign and a reassembly
_SIGNED = (*_CARRY, Op.NEG, Op.CONCATENATE)
# a projection output's signed element indices fit int32; its size is what one map costs
_MAX_ELEMENTS = 1 << 25


@dataclass
class RotationSite:
    """One rotated projection folded into resident weights."""

    rotated: Value         # the value now computed by the folded projection
    projection: Value      # the projection output the rotation read
    loc: str


def _move(op: Op, ins: list[np.ndarray], attrs: Mapping, shape: tuple[int, ...]) -> np.ndarray:
    if op is Op.SLICE:
        return ins[0][tuple(slice(s, e, st) for s, e, st in
                            zip(attrs["start"], attrs["limit"], attrs["strides"]))]
    if op is Op.RESHAPE:
        return ins[0].reshape(shape)
    if op is Op.TRANSPOSE:
        return np.transpose(ins[0], attrs["permutation"])
    if op is Op.NEG:
        return -ins[0]
    return np.concatenate(ins, axis=attrs["dimension"])


def _chain_to(v: Value, producers) -> tuple[Value, list[Node]]:
    """(the value ``v`` is carried from by slices/reshapes/transposes, those ops in order)."""
    chain: list[Node] = []
    while (n := producers.get(v.id)) is not None and n.op in _CARRY:
        chain.append(n)
        v = n.inputs[0]
    return v, chain[::-1]


def _projection(d: Value, producers, consts) -> tuple[Node, Node | None, np.ndarray | None] | None:
    """(dot, bias add, bias vector) when ``d`` is ``x @ W (+ b)``: W resident and 2-D, x a
    run-time value contracted over its last axis, b a per-feature constant."""
    n = producers.get(d.id)
    add, vec = None, None
    if n is not None and n.op is Op.ADD:
        for a, b in (n.inputs, n.inputs[::-1]):
            p = producers.get(a.id)
            vec = feature_vector(b, consts)
            if p is not None and p.op is Op.DOT_GENERAL and vec is not None \
                    and a.id not in consts:
                add, n = n, p
                break
        else:
            return None
    if n is None or n.op is not Op.DOT_GENERAL:
        return None
    x, w = n.inputs
    at = n.attrs
    if x.id in consts or w.id not in consts or len(w.type.shape) != 2 \
            or not w.type.dtype.is_float or tuple(at.get("lhs_batch", ())) \
            or tuple(at.get("lhs_contract", ())) != (len(x.type.shape) - 1,):
        return None
    return n, add, vec


def _signed_sources(r: Value, producers, leaf: Value, index: np.ndarray,
                    memo: dict[int, np.ndarray]) -> np.ndarray | None:
    """``r``'s elements as signed (1-based) indices into ``leaf``'s, or None when ``r`` reads
    anything but ``leaf`` through movement ops and negations."""
    if r.id == leaf.id:
        return index
    if r.id in memo:
        return memo[r.id]
    n = producers.get(r.id)
    if n is None or n.op not in _SIGNED:
        return None
    ins = []
    for v in n.inputs:
        a = _signed_sources(v, producers, leaf, index, memo)
        if a is None:
            return None
        ins.append(a)
    memo[r.id] = _move(n.op, ins, n.attrs, r.type.shape)
    return memo[r.id]


def _frozen(a):
    if isinstance(a, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in a.items()))
    if isinstance(a, (list, tuple)):
        return tuple(_frozen(v) for v in a)
    return a


def _structure(r: Value, q: Value, producers) -> tuple | None:
    """The movement ops from ``q`` to ``r`` as a hashable tree (q a leaf), None past them."""
    if r.id == q.id:
        return ("q",)
    n = producers.get(r.id)
    if n is None or n.op not in _SIGNED:
        return None
    return (n.op, _frozen(n.attrs), r.type.shape, tuple(_structure(v, q, producers)
                                                          for v in n.inputs))


def _column_map(d: Value, chain: list[Node], rot: Value, q: Value, producers
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """(source column, sign) of each column of ``d`` that ``q = chain(d)`` reads, such that
    ``rot`` is ``chain`` applied to the signed selected columns; None where ``rot`` is no
    row-preserving signed column selection of ``q`` or no reassembly (a plain carry or a
    negation is cheaper as it is)."""
    cols = d.type.shape[-1]
    # signed 1-based element indices of d through the carry and the rotation; int32 suffices
    # (_MAX_ELEMENTS) and halves the bytes moved
    t = np.arange(1, d.type.size + 1, dtype=np.int32).reshape(d.type.shape)
    for c in chain:
        t = _move(c.op, [t], c.attrs, c.out.type.shape)
    memo: dict[int, np.ndarray] = {}
    r = _signed_sources(rot, producers, q, t, memo)
    if r is None or r.shape != t.shape or not any(
            producers[i].op is Op.CONCATENATE for i in memo):
        return None
    t_row, t_col = np.divmod(t - 1, cols)
    r_row, r_col = np.divmod(np.abs(r) - 1, cols)
    if not np.array_equal(t_row, r_row):
        return None
    # each column q reads must become one signed column of the projection
    src = np.full(cols, -1, np.int64)
    sign = np.zeros(cols, np.int64)
    r_sign = np.sign(r)
    src[t_col.ravel()] = r_col.ravel()
    sign[t_col.ravel()] = r_sign.ravel()
    if not (np.array_equal(src[t_col], r_col) and np.array_equal(sign[t_col], r_sign)):
        return None
    return src, sign


def _find(graph: Graph, consts) -> list[tuple[Value, Value, list[Node], np.ndarray, np.ndarray]]:
    """(rotated value, projection output, carry chain, source column and sign of each column
    the chain reads) for every rotation of a carried projection."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    found = []
    maps: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}
    for n in graph.nodes:
        # the rotation's last op, read by something other than more movement
        if n.op not in _SIGNED or not n.out.type.dtype.is_float:
            continue
        if n.out.id not in outputs and all(u.op in _SIGNED for u in users.get(n.out.id, [])):
            continue
        # q: the value rotated, of the rotation's shape, found through its first operand
        q = n.inputs[0]
        while q.type.shape != n.out.type.shape and (p := producers.get(q.id)) is not None \
                and p.op in _SIGNED:
            q = p.inputs[0]
        if q.type.shape != n.out.type.shape:
            continue
        d, chain = _chain_to(q, producers)
        proj = _projection(d, producers, consts)
        if proj is None or d.type.size >= _MAX_ELEMENTS:
            continue
        # the layers repeat one structure: its column map is worked out once
        key = (tuple(d.type.shape), tuple((c.op, _frozen(c.attrs), c.out.type.shape)
                                          for c in chain), _structure(n.out, q, producers))
        if key not in maps:
            maps[key] = _column_map(d, chain, n.out, q, producers)
        if maps[key] is None:
            continue
        src, sign = maps[key]
        found.append((n.out, d, chain, src, sign))
    return found


def fold_rotations(graph: Graph, consts: Mapping[int, np.ndarray]
                   ) -> tuple[Graph, list[RotationSite]]:
    """Every rotation of a carried resident-weight projection computed by a second projection
    with rotated weights, as the module docstring says."""
    found = _find(graph, consts)
    if not found:
        return graph, []
    producers = graph.producers()
    # per projection: its sites, each reading the columns [lo, hi) of the rotated projection
    by_proj: dict[int, list] = {}
    for rot, d, chain, src, sign in found:
        first = chain[0] if chain else None
        last = len(d.type.shape) - 1
        # a chain that starts with a last-axis slice (a fused QKV's q columns) reads only
        # those columns; any other first op (a separate q projection's head split) reads all
        if first is not None and first.op is Op.SLICE and all(
                (s, e, st) == (0, dim, 1) for i, (s, e, st, dim) in enumerate(zip(
                    first.attrs["start"], first.attrs["limit"], first.attrs["strides"],
                    d.type.shape)) if i != last) and first.attrs["strides"][last] == 1:
            lo, hi = first.attrs["start"][last], first.attrs["limit"][last]
            chain = chain[1:]
        else:
            lo, hi = 0, d.type.shape[-1]
        by_proj.setdefault(d.id, []).append((rot, d, chain, src[lo:hi], sign[lo:hi]))
    ed = GraphEditor(graph)
    replaced = {s[0].id for sites in by_proj.values() for s in sites}
    new: dict[int, list[Node]] = {}     # node index after which to insert a projection's nodes
    sites_out: list[RotationSite] = []
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    for d_id, sites in by_proj.items():
        dot, add, vec = _projection(sites[0][1], producers, consts)
        x, w = dot.inputs
        w_axis = 1 - dot.attrs["rhs_contract"][0]
        src = np.concatenate([s[3] for s in sites])
        sign = np.concatenate([s[4] for s in sites])
        wv = np.asarray(consts[w.id])
        shape = [1, 1]
        shape[w_axis] = len(src)
        with timed("fold") as folded:       # the weight's columns permuted: weight work
            # the signs applied in place: one copy of the weight, not two
            w_rot = np.take(wv, src, axis=w_axis)
            np.multiply(w_rot, sign.reshape(shape).astype(wv.dtype), out=w_rot)
            folded[0] = w_rot.nbytes
        w_rot.setflags(write=False)
        nodes: list[Node] = []
        wc = ed.node(nodes, Op.CONSTANT, (), {"value": w_rot},
                     TensorType(w.type.dtype, w_rot.shape), dot.loc)
        out_t = TensorType(dot.out.type.dtype, (*dot.out.type.shape[:-1], len(src)))
        p = ed.node(nodes, Op.DOT_GENERAL, (x, wc), dict(dot.attrs), out_t, dot.loc)
        if add is not None:
            b = np.asarray(vec[src] * sign.astype(vec.dtype))
            b.setflags(write=False)
            bc = ed.node(nodes, Op.CONSTANT, (), {"value": b}, TensorType(out_t.dtype, b.shape),
                         add.loc)
            bb = ed.node(nodes, Op.BROADCAST_IN_DIM, (bc,),
                         {"broadcast_dimensions": (len(out_t.shape) - 1,)}, out_t, add.loc)
            p = ed.node(nodes, Op.ADD, (p, bb), loc=add.loc)
        off = 0
        for rot, d, chain, s, _ in sites:
            v = p
            if len(sites) > 1:
                r = len(out_t.shape)
                v = ed.node(nodes, Op.SLICE, (p,),
                            {"start": (0,) * (r - 1) + (off,),
                             "limit": (*out_t.shape[:-1], off + len(s)),
                             "strides": (1,) * r},
                            TensorType(out_t.dtype, (*out_t.shape[:-1], len(s))), dot.loc)
            off += len(s)
            for k, c in enumerate(chain):
                v = ed.node(nodes, c.op, (v,), dict(c.attrs), c.out.type, c.loc,
                            result=rot if k == len(chain) - 1 else None)
            if not chain:
                nodes.append(Node(Op.RESHAPE, (v,), (rot,), {}, dot.loc))
            sites_out.append(RotationSite(rot, d, str(producers[rot.id].loc or "")))
        # after the projection's output (x and W are defined by then)
        new.setdefault(index[id(producers[d_id])], []).extend(nodes)
    out_nodes: list[Node] = []
    for i, n in enumerate(graph.nodes):
        if n.out.id not in replaced:
            out_nodes.append(n)
        out_nodes.extend(new.get(i, []))
    g = Graph(graph.name, graph.inputs, out_nodes, graph.outputs)
    return _drop_dead(g), sites_out


def _drop_dead(graph: Graph) -> Graph:
    """Without what nothing reads any more: the old rotation, and the original projection
    where the rotation was its only reader (a plain permutation of its columns). Params stay:
    the program's resident arguments do not change."""
    live = {v.id for v in graph.outputs}
    kept: list[Node] = []
    for n in reversed(graph.nodes):
        if n.op is Op.PARAM or any(v.id in live for v in n.outputs):
            kept.append(n)
            live.update(v.id for v in n.inputs)
    return Graph(graph.name, graph.inputs, kept[::-1], graph.outputs)
