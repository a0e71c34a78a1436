"""Key biases dropped from attention scores: softmax cannot see them.

Attention's scores are ``s[b, h, i, j] = q[b, h, i, :] . k[b, h, j, :]``, and the keys of most
encoders carry a projection bias, ``k = x W_k^T + b_k``. The bias adds ``q[b, h, i, :] .
b_k[h, :]`` to every score of row ``i``, the same for every key ``j``; the softmax over ``j``
subtracts its row maximum, so that term cancels exactly: ``softmax(s + t) = softmax(s)`` for
any ``t`` constant along the softmax axes. Dropping the bias removes the key projection's bias
epilogue -- a dense broadcast bias cube as large as the projection's output, read through the
EW stage of every task (fp32 when K is split, emitters/matmul.py ``_epilogue``) -- and it makes
the scores smaller, not larger, in fp16.

The match is structural and strict, on the softmax as the graph computes it by then,
``exp(z - max(z))``: the scores ``z`` read only by the row max (over the last axes) and by the
subtraction of that max (broadcast back, at most raised to a floor below every fp16 score:
jax.nn.softmax's ``initial=-inf``); ``z`` a scores ``dot_general``, at most times a scalar
constant (the 1/sqrt(d) scale keeps the term constant along the row), whose rhs comes from
``add(y, b)`` (b a resident vector over the last axis) through reshapes that split the last
axis and transposes, each value read once; the axes the bias varies along must all be
contracted or batch axes of the scores dot, and the row max's axes must be its rhs free axes
(the keys). Anything else is left alone.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from .const_views import uniform_value
from .gain_fold import feature_vector


def _scalar_const(v: Value, consts: Mapping[int, np.ndarray]) -> bool:
    c = consts.get(v.id)
    # every element the same (not NaN); a broadcast scalar is compared once, not once per
    # element of its [heads, S, S] view (const_views.py)
    return c is not None and uniform_value(c) is not None


def _feature_axes(chain: list[Node], start: Value) -> set[int] | None:
    """The axes of the chain's last value that ``start``'s last axis (the bias's) maps to, or
    None where a reshape does more than split the last axis."""
    shape = tuple(start.type.shape)
    axes = {len(shape) - 1}
    for n in chain:
        out = tuple(n.out.type.shape)
        if n.op is Op.RESHAPE:
            lead = shape[:-1]
            if axes != {len(shape) - 1} or out[:len(lead)] != lead or \
                    int(np.prod(out[len(lead):], dtype=np.int64)) != shape[-1]:
                return None
            axes = set(range(len(lead), len(out)))
        else:
            perm = tuple(n.attrs["permutation"])
            axes = {k for k, p in enumerate(perm) if p in axes}
        shape = out
    return axes


def _row_max_of(m: Value, r: Node, producers: Mapping[int, Node],
                consts: Mapping[int, np.ndarray]) -> bool:
    """``m`` is the row max ``r`` computes, broadcast back, and at most raised to a floor no
    finite score reaches (jax.nn.softmax's ``initial=-inf``, saturated to the fp16 range by
    the range plan): a value that moves with the scores' shift."""
    while m.id != r.out.id:
        n = producers.get(m.id)
        if n is None:
            return False
        if n.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE):
            m = n.inputs[0]
        elif n.op is Op.MAX:
            a, b = n.inputs
            floor, m = (a, b) if a.id in consts else (b, a)
            c = consts.get(floor.id)
            if c is None or not np.all(np.asarray(c, np.float64) <= -FLOOR):
                return False
        else:
            return False
    return True


# the least floor of the row max that no fp16 score reaches in practice: -inf saturated to
# -2^15 by the range plan (fp16_range.saturate_consts)
FLOOR = 2.0 ** 15


def _site(r: Node, producers: Mapping[int, Node], users: Mapping[int, list[Node]],
          consts: Mapping[int, np.ndarray], outputs: set[int]) -> tuple[Node, Value] | None:
    """For the row max ``r`` of a softmax (``exp(z - max z)``), the key bias ``add`` the
    softmax cannot see and the value to read instead, or None."""
    once = lambda v: len(users.get(v.id, [])) == 1 and v.id not in outputs   # noqa: E731
    z = r.inputs[0]
    zu = users.get(z.id, [])
    subs = [u for u in zu if u.op is Op.SUB and u.inputs[0].id == z.id]
    if z.id in outputs or len(zu) != 2 or len(subs) != 1 or r not in zu or \
            not _row_max_of(subs[0].inputs[1], r, producers, consts):
        return None
    p = producers.get(z.id)
    if p is not None and p.op is Op.MUL:
        a, b = p.inputs
        y = a if _scalar_const(b, consts) else b if _scalar_const(a, consts) else None
        if y is None or not once(y):
            return None
        p = producers.get(y.id)
    if p is None or p.op is not Op.DOT_GENERAL:
        return None
    dot, rank = p, len(z.type.shape)
    rc, rb = tuple(dot.attrs["rhs_contract"]), tuple(dot.attrs["rhs_batch"])
    rhs = dot.inputs[1]
    free = [ax for ax in range(len(rhs.type.shape)) if ax not in rc and ax not in rb]
    if not free or tuple(sorted(r.attrs["axes"])) != tuple(range(rank - len(free), rank)):
        return None
    chain: list[Node] = []
    v = rhs
    while True:
        n = producers.get(v.id)
        if n is None or not once(v):
            return None
        if n.op in (Op.RESHAPE, Op.TRANSPOSE):
            chain.append(n)
            v = n.inputs[0]
            continue
        break
    if n.op is not Op.ADD or dot.inputs[0].id == rhs.id:
        return None
    for y, b in (n.inputs, n.inputs[::-1]):
        if y.id not in consts and y.type == n.out.type and \
                feature_vector(b, consts) is not None:
            axes = _feature_axes(chain[::-1], n.out)
            if axes is not None and not axes & set(free):
                return n, y
    return None


def drop_key_biases(graph: Graph, consts: Mapping[int, np.ndarray]) -> tuple[Graph, int]:
    """``graph`` without the key biases its softmaxes cannot see (module docstring), and how
    many it dropped."""
    producers = {v.id: n for n in graph.nodes for v in n.outputs}
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    subst: dict[int, Value] = {}
    drop: set[int] = set()
    for n in graph.nodes:
        if n.op is Op.REDUCE_MAX:
            site = _site(n, producers, users, consts, outputs)
            if site is not None:
                drop.add(id(site[0]))
                subst[site[0].out.id] = site[1]
    if not drop:
        return graph, 0
    nodes = []
    for n in graph.nodes:
        if id(n) in drop:
            continue
        if any(v.id in subst for v in n.inputs):
            n = Node(n.op, tuple(subst.get(v.id, v) for v in n.inputs), n.outputs, n.attrs,
                     n.loc)
        nodes.append(n)
    return Graph(graph.name, graph.inputs, nodes, graph.outputs), len(drop)
