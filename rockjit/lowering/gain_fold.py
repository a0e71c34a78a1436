"""Per-channel gains folded into the weights of the matmuls that read them.

A norm without a bias ends in ``y = n * g`` (g a resident vector over the feature axis; RMSNorm
and ModernBERT's LayerNorm) and ``y`` is often read only by projections with resident weights.
On the NPU ``n * g`` is one more fp16 rounding of every element and ``g`` itself is rounded to
fp16, a per-channel error that every row repeats; with gains of 10-50 (real checkpoints;
tests/models/test_modernbert_sim.py plants them) those channels dominate the projection and the
two roundings do not average out. ``(n * g) @ W^T = n @ (W * g)^T`` exactly, and ``W * g`` is
computed here in float64 and rounded once when the weights are packed, so the projection reads
``n`` and the gain costs no rounding of its own (measured on ModernBERT-base with planted gains,
fp16-rounding JAX forwards: mean per-layer cosine 0.9999926 -> 0.9999961).

A norm with a bias ends in ``y = m + b`` (``m = n * g``). Where ``y`` is read only by such
projections, ``y @ W^T = m @ W^T + b @ W^T``: ``b @ W^T`` (float64, one vector per projection)
goes into the projection's own bias -- added to the resident bias vector the projection already
adds, or added by a new one -- so the bias's pass over the normed cube does not run (SigLIP's
and Whisper's LayerNorms) and ``m + b`` is not rounded to fp16 before the projection reads
it. The gain ``g`` of such a norm stays a pass: folded into the weights as well it moved real
Whisper-base's figures the wrong way (tests/models/test_real_whisper.py: mean per-layer cosine
0.9999942 -> 0.9999933, final max rel err 2.760e-2 -> 2.777e-2), where the bias alone moves
them the right way (0.9999950, 1.789e-2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..ir.types import TensorType
from ..weight_timing import timed
from .const_views import distinct_view
from .fp16_range import FP16_MAX
from .range_rewrites import GraphEditor


@dataclass
class GainFoldSite:
    """One ``n * g`` whose gain went into the weights of ``matmuls`` projections."""

    product: Value
    matmuls: int
    loc: str
    bias: bool = False       # the norm's bias went into the projections' biases (not the gain)


def feature_vector(v: Value, consts: Mapping[int, np.ndarray]) -> np.ndarray | None:
    """The per-feature vector of a resident value constant along every axis but the last."""
    c = consts.get(v.id)
    if c is None or not v.type.dtype.is_float or len(v.type.shape) < 1:
        return None
    c = np.asarray(c)
    vec = c.reshape(-1, c.shape[-1])[0]
    if not np.isfinite(vec).all():
        return None
    # a 12-head broadcast of a table is compared once, not twelve times (const_views.py)
    seen = distinct_view(c, keep_last=True)
    if not np.array_equal(seen, np.broadcast_to(vec, seen.shape)):
        return None
    return vec


def _folds_into(u: Node, prod: Value, consts: Mapping[int, np.ndarray]) -> int | None:
    """The rhs axis of ``u`` that ``prod``'s feature axis contracts with, when ``u`` is a
    matmul of ``prod`` (lhs) by resident weights over ``prod``'s last axis only."""
    if u.op is not Op.DOT_GENERAL or u.inputs[0].id != prod.id or u.inputs[1].id == prod.id:
        return None
    if u.inputs[1].id not in consts or not u.inputs[1].type.dtype.is_float:
        return None
    a = u.attrs
    last = len(prod.type.shape) - 1
    if tuple(a.get("lhs_contract", ())) != (last,) or tuple(a.get("lhs_batch", ())) or \
            tuple(a.get("rhs_batch", ())):
        return None
    return int(a["rhs_contract"][0])


@dataclass
class _Plan:
    """One fold: the value ``x`` the projections read instead, the sites' dot nodes each
    with its scaled weights (gain path; None on the bias path) and its ``b @ W^T`` (bias path),
    and the nodes the fold removes."""

    x: Value
    folds: list[tuple[Node, np.ndarray, np.ndarray | None]]
    removed: list[Node]
    bias: bool


def _vector_add(n: Node, users: Mapping[int, list[Node]], consts: Mapping[int, np.ndarray]
                ) -> tuple[Node, Value, np.ndarray] | None:
    """``n``'s only user when it is ``n.out + v`` (v a resident feature vector: a norm's or a
    projection's bias), its operand v and v's vector, or None."""
    us = users.get(n.out.id, [])
    if len(us) != 1 or us[0].op is not Op.ADD or us[0].out.type != n.out.type:
        return None
    a = us[0]
    other = a.inputs[1] if a.inputs[0].id == n.out.id else a.inputs[0]
    vec = None if other.id == n.out.id else feature_vector(other, consts)
    return None if vec is None else (a, other, vec)


def _projections(prod: Value, users: Mapping[int, list[Node]],
                 consts: Mapping[int, np.ndarray], vec: np.ndarray | None,
                 bias: np.ndarray | None, scratch: list[np.ndarray]
                 ) -> list[tuple[Node, np.ndarray, np.ndarray | None]] | None:
    """Each user of ``prod`` (all projections by resident weights) with its weights scaled
    by the gain ``vec`` (None: kept) and, given the norm's ``bias``, ``bias @ W^T`` -- or
    None."""
    us = users.get(prod.id, [])
    axes = [_folds_into(u, prod, consts) for u in us]
    if not us or any(ax is None for ax in axes):
        return None
    if bias is not None and any(consts[u.inputs[1].id].ndim != 2 for u in us):
        return None
    if vec is None:
        scaled = [(None, True) for _ in us]
    else:
        with timed("fold") as folded:
            scaled = [_scaled(consts[u.inputs[1].id], vec, ax,
                              u.inputs[1].type.dtype.to_numpy()) for u, ax in zip(us, axes)]
            folded[0] = sum(w.nbytes for w, _ in scaled)
    if not all(fits for _, fits in scaled):
        return None      # the folded weights would not fit fp16: keep the gain apart
    if bias is None:
        return [(u, w, None) for u, (w, _) in zip(us, scaled)]
    # b @ W^T reads every weight of the projection once: weight work, in the "fold" bucket
    with timed("fold") as read:
        out = [(u, w, bias_through(consts[u.inputs[1].id], bias, ax, scratch))
               for u, ax, (w, _) in zip(us, axes, scaled)]
        read[0] = sum(consts[u.inputs[1].id].nbytes for u in us)
    return out


def bias_through(w: np.ndarray, bias: np.ndarray, ax: int, scratch: list[np.ndarray]
                 ) -> np.ndarray:
    """``bias`` contracted with the 2-D ``w`` over axis ``ax``, in float64, with the bits of
    numpy's tensordot of the float64 copy of ``w`` and of ``bias`` (which is ``dot`` of the
    (rows, K) matrix and the (K, 1) bias).

    Over the last axis each output row is its own dot product, so the rows go through in
    blocks of ``_BIAS_ROWS`` multiples (each block's float64 copy in ``scratch[0]``, sized
    to stay in cache): the same BLAS call on fewer rows, whose per-row sums OpenBLAS
    groups by 4 or 8 rows -- a block of a multiple of 64 rows keeps the grouping, a block
    of 5 rows does not (tests/lowering/test_gain_fold.py checks the bits on real-sized
    weights). The whole float64 copy (19 MB for 3072 x 768) fell out of cache and was most
    of the range plan's time on SigLIP-224 x12 (0.39 s -> 0.03 s for its 49 weights)."""
    b64 = bias.astype(np.float64)
    k = w.shape[ax]
    if ax != w.ndim - 1:
        # over the first axis tensordot hands BLAS the transposed view: the column kernel,
        # whose bits a row block would not keep; one whole copy (no model needs it yet)
        w64 = _scratch(scratch, w.size).reshape(w.shape)
        np.copyto(w64, w)
        return np.tensordot(w64, b64, axes=([ax], [0]))
    rows = _BIAS_ROWS * max(1, _BIAS_BLOCK_BYTES // (8 * k * _BIAS_ROWS))
    out = np.empty(w.shape[0], np.float64)
    blk = _scratch(scratch, min(rows, w.shape[0]) * k)
    col = b64.reshape(k, 1)
    for s in range(0, w.shape[0], rows):
        e = min(w.shape[0], s + rows)
        w64 = blk[:(e - s) * k].reshape(e - s, k)
        np.copyto(w64, w[s:e])
        out[s:e] = np.dot(w64, col)[:, 0]
    return out


_BIAS_ROWS = 64                   # rows per block of bias_through: a multiple of BLAS's grouping
_BIAS_BLOCK_BYTES = 1 << 20       # float64 block bytes bias_through aims at (an L2 cache)


def _scratch(scratch: list[np.ndarray], size: int) -> np.ndarray:
    """At least ``size`` float64s of the reused buffer ``scratch[0]``, grown when short."""
    if scratch[0].size < size:
        scratch[0] = np.empty(size, np.float64)
    return scratch[0][:size]


def fold_norm_gains(graph: Graph, consts: Mapping[int, np.ndarray]
                    ) -> tuple[Graph, list[GainFoldSite]]:
    """``graph`` with each foldable ``n * g`` removed and its projections' weights scaled, and
    each foldable norm bias ``m + b`` removed and its projections' biases adjusted (module
    docstring); the sites folded."""
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, _Plan] = {}
    scratch = [np.empty(0, np.float64)]      # bias_through
    for n in graph.nodes:
        if n.op is not Op.MUL or n.out.id in outputs or not n.out.type.dtype.is_float:
            continue
        for x, g in (n.inputs, n.inputs[::-1]):
            vec = feature_vector(g, consts)
            if vec is None or x.id in consts or x.type != n.out.type:
                continue
            folds = _projections(n.out, users, consts, vec, None, scratch)
            if folds is not None:
                plans[id(n)] = _Plan(x, folds, [n], False)
                break
            ba = _vector_add(n, users, consts)
            if ba is None or ba[0].out.id in outputs:
                continue
            a, _, b = ba
            # the gain stays a pass (n * g); only the bias moves into the projections
            folds = _projections(a.out, users, consts, None, b, scratch)
            if folds is not None and _biases_fit(folds, users, consts):
                plans[id(a)] = _Plan(n.out, folds, [a], True)
                break
    if not plans:
        return graph, []
    return _rewrite(graph, plans, users, consts)


def _biases_fit(folds, users, consts) -> bool:
    for u, _, c in folds:
        db = _vector_add(u, users, consts)
        total = c + (db[2].astype(np.float64) if db is not None else 0.0)
        if not np.isfinite(total).all() or np.abs(total).max(initial=0.0) > FP16_MAX:
            return False
    return True


def _rewrite(graph: Graph, plans: Mapping[int, _Plan], users: Mapping[int, list[Node]],
             consts: Mapping[int, np.ndarray]) -> tuple[Graph, list[GainFoldSite]]:
    ed = GraphEditor(graph)
    removed = {id(r) for pl in plans.values() for r in pl.removed}
    redo: dict[int, tuple[Value, np.ndarray, np.ndarray | None]] = {}
    rebias: dict[int, tuple[Value, np.ndarray]] = {}     # id(bias add) -> (its dot's value, new bias)
    sites: list[GainFoldSite] = []
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in plans:
            pl = plans[id(n)]
            for u, w, c in pl.folds:
                db = _vector_add(u, users, consts) if c is not None else None
                if db is not None:
                    a, _, vec = db
                    rebias[id(a)] = (u.out, vec.astype(np.float64) + c)
                    c = None
                redo[id(u)] = (pl.x, w, c)
            sites.append(GainFoldSite(n.out, len(pl.folds), str(n.loc) if n.loc else "",
                                      pl.bias))
            continue
        if id(n) in removed:
            continue
        if id(n) in redo:
            x, w, c = redo[id(n)]
            w2 = n.inputs[1] if w is None else \
                ed.node(out_nodes, Op.CONSTANT, (), {"value": w}, n.inputs[1].type, n.loc)
            if c is None:
                ed.node(out_nodes, n.op, (x, w2), dict(n.attrs), loc=n.loc, result=n.out)
            else:
                # no bias of its own: the projection adds b @ W^T after it
                d = ed.node(out_nodes, n.op, (x, w2), dict(n.attrs), loc=n.loc)
                cv = _vector(ed, out_nodes, c, n.out.type, n.loc)
                ed.node(out_nodes, Op.ADD, (d, cv), loc=n.loc, result=n.out)
            continue
        if id(n) in rebias:
            dot_out, vec = rebias[id(n)]
            cv = _vector(ed, out_nodes, vec, n.out.type, n.loc)
            ed.node(out_nodes, Op.ADD, (dot_out, cv), loc=n.loc, result=n.out)
            continue
        out_nodes.append(n)
    return Graph(graph.name, graph.inputs, out_nodes, graph.outputs), sites


def _vector(ed: GraphEditor, out: list[Node], vec: np.ndarray, t: TensorType, loc) -> Value:
    """A constant feature vector (rounded once to ``t``'s dtype) broadcast to ``t``."""
    v = np.asarray(vec, np.float64).astype(t.dtype.to_numpy())
    v.setflags(write=False)
    c = ed.node(out, Op.CONSTANT, (), {"value": v}, TensorType(t.dtype, (v.shape[0],)), loc)
    return ed.node(out, Op.BROADCAST_IN_DIM, (c,), {"broadcast_dimensions": (len(t.shape) - 1,)},
                   t, loc)


def _scaled(w: np.ndarray, vec: np.ndarray, axis: int, dtype: np.dtype
            ) -> tuple[np.ndarray, bool]:
    """``w * g`` along ``axis`` rounded once to ``dtype``, and whether it fits fp16."""
    w, vec = np.asarray(w), np.asarray(vec)
    shape = [1] * w.ndim
    shape[axis] = vec.shape[0]
    f32 = np.dtype(np.float32)
    if w.dtype == vec.dtype == np.dtype(dtype) == f32:
        # the float64 product of two float32 is exact, so rounding it to float32 once is the
        # correctly rounded float32 product: computed directly, without the float64 copy
        # (most of the compile's gain-fold time at ModernBERT-base)
        out = w * vec.reshape(shape)
        out.setflags(write=False)        # a constant from here on (fold.py keeps it as is)
        # the larger magnitude of the extremes, without np.abs's temporary of the weight
        top = float(max(out.max(initial=0.0), -out.min(initial=0.0)))
        if top != FP16_MAX:
            # rounding is monotonic and FP16_MAX is a float32: the comparison is the exact one
            return out, not top > FP16_MAX
        # exactly FP16_MAX after rounding: the exact product may lie just above it
        exact = np.asarray(w, np.float64) * vec.astype(np.float64).reshape(shape)
        return out, not np.abs(exact).max(initial=0.0) > FP16_MAX
    exact = np.asarray(w, np.float64) * vec.astype(np.float64).reshape(shape)
    out = exact.astype(dtype)
    out.setflags(write=False)
    return out, not np.abs(exact).max(initial=0.0) > FP16_MAX
