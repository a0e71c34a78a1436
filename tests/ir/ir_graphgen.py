"""Hypothesis strategy for random well-typed IR graphs (every op, attrs, constants, locs).

Each op has a generator in ``GEN`` that picks or creates operands of a legal type and builds
the node through ``Builder.add``, so the shape rules vet every generated node.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from hypothesis import strategies as st

from rockjit.ir.activations import FUSABLE
from rockjit.ir import Builder, DType, Graph, Loc, Op, TensorType, Value

ALL_DTYPES = list(DType)
NUMERIC = [d for d in DType if d is not DType.BOOL]
FLOATS = [d for d in DType if d.is_float]
INTS = [d for d in DType if d.is_int]

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
names = st.text(min_size=1, max_size=12)
locs = st.one_of(st.none(), st.builds(Loc, st.text(max_size=10), st.integers(0, 10**6)))


def types(dtypes: list[DType], shp: st.SearchStrategy = shapes) -> st.SearchStrategy:
    return st.builds(TensorType, st.sampled_from(dtypes), shp)


@st.composite
def arrays(draw: st.DrawFn, t: TensorType) -> np.ndarray:
    """Arrays of type t: raw bytes (any NaN payload, -0, subnormals) or small 'nice' values."""
    dt = t.dtype.to_numpy()
    if t.dtype is DType.BOOL:
        return np.array(draw(st.lists(st.booleans(), min_size=t.size, max_size=t.size)),
                        dtype=bool).reshape(t.shape)
    if draw(st.booleans()):
        raw = draw(st.binary(min_size=t.size * dt.itemsize, max_size=t.size * dt.itemsize))
        return np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt).reshape(t.shape)
    vals = draw(st.lists(st.integers(-100, 100), min_size=t.size, max_size=t.size))
    a = np.array(vals, dtype=np.float64)
    if t.dtype.is_float:
        a = a / 8
    elif t.dtype.name.startswith("U"):
        a = np.abs(a)
    return a.astype(np.float32 if t.dtype is DType.BF16 else dt).astype(dt).reshape(t.shape)


class Ctx:
    def __init__(self, draw: st.DrawFn, b: Builder) -> None:
        self.draw, self.b, self.pool = draw, b, list(b.inputs)
        self.params: dict[str, TensorType] = {}

    def pick(self, ok: Callable[[TensorType], bool], fallback: st.SearchStrategy) -> Value:
        cands = [v for v in self.pool if ok(v.type)]
        if cands and self.draw(st.booleans()):
            return self.draw(st.sampled_from(cands))
        return self.new_input(self.draw(fallback))

    def new_input(self, t: TensorType) -> Value:
        v = self.b.input(t)
        self.pool.append(v)
        return v

    def add(self, op: Op, ins: list[Value], out: TensorType | None = None,
            attrs: dict | None = None) -> Value:
        v = self.b.add(op, ins, out, attrs or {}, self.draw(locs))
        self.pool.append(v)
        return v


def _constant(c: Ctx) -> None:
    t = c.draw(types(ALL_DTYPES, st.lists(st.integers(0, 5), max_size=2).map(tuple)))
    c.add(Op.CONSTANT, [], None, {"value": c.draw(arrays(t))})


def _param(c: Ctx) -> None:
    # A name already used keeps its type: one name binds one weight (the verifier checks it).
    name = c.draw(names)
    t = c.params.get(name) or c.draw(types(ALL_DTYPES))
    c.params[name] = t
    c.add(Op.PARAM, [], t, {"name": name})


def _iota(c: Ctx) -> None:
    t = c.draw(types(NUMERIC, nonempty_shapes))
    c.add(Op.IOTA, [], t, {"dimension": c.draw(st.integers(0, t.rank - 1))})


def _unary(op: Op) -> Callable[[Ctx], None]:
    allowed = FLOATS if op not in (Op.NEG, Op.ABS, Op.INTEGER_POW) else NUMERIC

    def gen(c: Ctx) -> None:
        x = c.pick(lambda t: t.dtype in allowed, types(allowed))
        attrs = {}
        if op is Op.INTEGER_POW:
            attrs["y"] = c.draw(st.integers(-3 if x.type.dtype.is_float else 0, 4))
        if op is Op.ACTIVATION:
            attrs["kind"] = c.draw(st.sampled_from(FUSABLE))
        c.add(op, [x], None, attrs)
    return gen


def _binary(op: Op) -> Callable[[Ctx], None]:
    if op is Op.POW:
        allowed = FLOATS
    elif op in (Op.MAX, Op.MIN) or op.group.value == "compare":
        allowed = ALL_DTYPES
    else:
        allowed = NUMERIC

    def gen(c: Ctx) -> None:
        x = c.pick(lambda t: t.dtype in allowed, types(allowed))
        y = c.pick(lambda t: t == x.type, st.just(x.type))
        c.add(op, [x, y])
    return gen


def _select_n(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    if c.draw(st.booleans()):
        which = c.new_input(TensorType(DType.BOOL, c.draw(st.sampled_from([(), x.type.shape]))))
        n = c.draw(st.integers(1, 2))
    else:
        which = c.new_input(TensorType(DType.I32, x.type.shape))
        n = c.draw(st.integers(1, 4))
    c.add(Op.SELECT_N, [which] + [x] * n)


def _reduce(op: Op) -> Callable[[Ctx], None]:
    allowed = NUMERIC if op is Op.REDUCE_SUM else ALL_DTYPES

    def gen(c: Ctx) -> None:
        x = c.pick(lambda t: t.dtype in allowed, types(allowed))
        axes = c.draw(st.permutations(range(x.type.rank)))[:c.draw(st.integers(0, x.type.rank))]
        c.add(op, [x], None, {"axes": sorted(axes)})
    return gen


def _reduce_window(op: Op) -> Callable[[Ctx], None]:
    allowed = NUMERIC if op is Op.REDUCE_WINDOW_SUM else ALL_DTYPES

    def gen(c: Ctx) -> None:
        x = c.pick(lambda t: t.dtype in allowed, types(allowed))
        r = x.type.rank
        c.add(op, [x], None, {
            "window_dimensions": [c.draw(st.integers(1, 3)) for _ in range(r)],
            "window_strides": [c.draw(st.integers(1, 2)) for _ in range(r)],
            "padding": [(c.draw(st.integers(0, 2)), c.draw(st.integers(0, 2)))
                        for _ in range(r)]})
    return gen


def _broadcast(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    out_rank = x.type.rank + c.draw(st.integers(0, 2))
    dims = sorted(c.draw(st.permutations(range(out_rank)))[:x.type.rank])
    shape = [c.draw(st.integers(0, 3)) for _ in range(out_rank)]
    for src, d in enumerate(dims):
        if x.type.shape[src] != 1:
            shape[d] = x.type.shape[src]
    c.add(Op.BROADCAST_IN_DIM, [x], TensorType(x.type.dtype, tuple(shape)),
          {"broadcast_dimensions": dims})


def _reshape(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    s = x.type.shape
    shape = c.draw(st.sampled_from([(x.type.size,), s + (1,), (1,) + s, s[::-1]]))
    c.add(Op.RESHAPE, [x], TensorType(x.type.dtype, shape))


def _transpose(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    c.add(Op.TRANSPOSE, [x], None, {"permutation": c.draw(st.permutations(range(x.type.rank)))})


def _slice(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    start, limit, strides = [], [], []
    for d in x.type.shape:
        lo = c.draw(st.integers(0, d))
        start.append(lo)
        limit.append(c.draw(st.integers(lo, d)))
        strides.append(c.draw(st.integers(1, 3)))
    c.add(Op.SLICE, [x], None, {"start": start, "limit": limit, "strides": strides})


def _concatenate(c: Ctx) -> None:
    x = c.pick(lambda t: t.rank >= 1, types(ALL_DTYPES, nonempty_shapes))
    n = c.draw(st.integers(1, 3))
    c.add(Op.CONCATENATE, [x] * n, None, {"dimension": c.draw(st.integers(0, x.type.rank - 1))})


def _pad(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    pv = c.add(Op.CONSTANT, [], None,
               {"value": c.draw(arrays(TensorType(x.type.dtype, ())))})
    low, high, interior = [], [], []
    for d in x.type.shape:
        it = c.draw(st.integers(0, 2))
        n = d + max(d - 1, 0) * it
        lo = c.draw(st.integers(-n, 2))
        hi = c.draw(st.integers(-(n + lo), 2))
        low.append(lo), high.append(hi), interior.append(it)
    c.add(Op.PAD, [x, pv], None, {"low": low, "high": high, "interior": interior})


def _convert(c: Ctx) -> None:
    x = c.pick(lambda t: True, types(ALL_DTYPES))
    c.add(Op.CONVERT, [x], TensorType(c.draw(st.sampled_from(ALL_DTYPES)), x.type.shape))


def _dot_general(c: Ctx) -> None:
    dt = c.draw(st.sampled_from(NUMERIC))
    nb, nc = c.draw(st.integers(0, 1)), c.draw(st.integers(0, 2))
    bsz = [c.draw(st.integers(1, 3)) for _ in range(nb)]
    csz = [c.draw(st.integers(0, 3)) for _ in range(nc)]
    lfree = c.draw(st.lists(st.integers(1, 3), max_size=1))
    rfree = c.draw(st.lists(st.integers(1, 3), max_size=1))
    # lhs in order [free, batch, contract], rhs in order [batch, contract, free]
    lhs = c.new_input(TensorType(dt, tuple(lfree + bsz + csz)))
    rhs = c.new_input(TensorType(dt, tuple(bsz + csz + rfree)))
    nf = len(lfree)
    c.add(Op.DOT_GENERAL, [lhs, rhs], None, {
        "lhs_batch": list(range(nf, nf + nb)), "rhs_batch": list(range(nb)),
        "lhs_contract": list(range(nf + nb, nf + nb + nc)),
        "rhs_contract": list(range(nb, nb + nc))})


def _matmul_epilogue(c: Ctx) -> None:
    from rockjit.ir.activations import FUSABLE

    dt = c.draw(st.sampled_from(FLOATS))
    nb = c.draw(st.integers(0, 1))
    bsz = [c.draw(st.integers(1, 3)) for _ in range(nb)]
    k, n = c.draw(st.integers(0, 3)), c.draw(st.integers(1, 3))
    lfree = c.draw(st.lists(st.integers(1, 3), max_size=1))
    lhs = c.new_input(TensorType(dt, tuple(bsz + lfree + [k])))
    rhs = c.new_input(TensorType(dt, tuple(bsz + [n, k])))
    out = TensorType(dt, tuple(bsz + lfree + [n]))
    flags = {f: c.draw(st.booleans()) for f in ("bias", "scale", "residual")}
    extra = [c.new_input(TensorType(dt, (n,))) for f in ("bias", "scale") if flags[f]]
    extra += [c.new_input(out)] if flags["residual"] else []
    c.add(Op.MATMUL_EPILOGUE, [lhs, rhs, *extra], None, {
        "lhs_batch": list(range(nb)), "rhs_batch": list(range(nb)),
        "lhs_contract": [nb + len(lfree)], "rhs_contract": [nb + 1], **flags,
        "act": c.draw(st.sampled_from(("none",) + tuple(FUSABLE)))})


def _conv(c: Ctx) -> None:
    dt = c.draw(st.sampled_from(FLOATS))
    ns = c.draw(st.integers(1, 2))
    g = c.draw(st.integers(1, 2))
    cin, cout = g * c.draw(st.integers(1, 2)), g * c.draw(st.integers(1, 2))
    spatial = tuple(c.draw(st.integers(1, 6)) for _ in range(ns))
    kernel = tuple(c.draw(st.integers(1, 3)) for _ in range(ns))
    lhs = c.new_input(TensorType(dt, (c.draw(st.integers(1, 2)), cin) + spatial))
    rhs = c.new_input(TensorType(dt, (cout, cin // g) + kernel))
    c.add(Op.CONV, [lhs, rhs], None, {
        "window_strides": [c.draw(st.integers(1, 2)) for _ in range(ns)],
        "padding": [(c.draw(st.integers(0, 2)), c.draw(st.integers(0, 2))) for _ in range(ns)],
        "lhs_dilation": [c.draw(st.integers(1, 2)) for _ in range(ns)],
        "rhs_dilation": [c.draw(st.integers(1, 2)) for _ in range(ns)],
        "feature_group_count": g})


def _take(c: Ctx) -> None:
    x = c.pick(lambda t: t.rank >= 1 and all(t.shape), types(ALL_DTYPES, nonempty_shapes))
    idx = c.new_input(TensorType(c.draw(st.sampled_from([DType.I32, DType.I64])),
                                 c.draw(shapes)))
    c.add(Op.TAKE, [x, idx], None, {"axis": c.draw(st.integers(0, x.type.rank - 1))})


def _softmax(c: Ctx) -> None:
    x = c.pick(lambda t: t.dtype in FLOATS and t.rank >= 1, types(FLOATS, nonempty_shapes))
    axes = sorted(set(c.draw(st.lists(st.integers(0, x.type.rank - 1), min_size=1,
                                       max_size=x.type.rank))))
    c.add(Op.SOFTMAX, [x], None, {"axes": axes})


def _layer_norm(c: Ctx) -> None:
    x = c.pick(lambda t: t.dtype in FLOATS and t.rank >= 1, types(FLOATS, nonempty_shapes))
    axes = sorted(set(c.draw(st.lists(st.integers(0, x.type.rank - 1), min_size=1,
                                       max_size=x.type.rank))))
    c.add(Op.LAYER_NORM, [x], None, {"axes": axes, "eps": c.draw(st.sampled_from([0.0, 1e-5]))})


GEN: dict[Op, Callable[[Ctx], None]] = {
    Op.CONSTANT: _constant, Op.PARAM: _param, Op.IOTA: _iota, Op.SELECT_N: _select_n,
    Op.BROADCAST_IN_DIM: _broadcast, Op.RESHAPE: _reshape, Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice, Op.CONCATENATE: _concatenate, Op.PAD: _pad, Op.CONVERT: _convert,
    Op.DOT_GENERAL: _dot_general, Op.CONV: _conv, Op.TAKE: _take, Op.SOFTMAX: _softmax,
    Op.LAYER_NORM: _layer_norm, Op.MATMUL_EPILOGUE: _matmul_epilogue,
}
for _op in Op:
    if _op.group.value == "unary":
        GEN[_op] = _unary(_op)
    elif _op.group.value in ("binary", "compare"):
        GEN[_op] = _binary(_op)
    elif _op.group.value == "reduce":
        GEN[_op] = _reduce(_op)
    elif _op.group.value == "window":
        GEN[_op] = _reduce_window(_op)
assert set(GEN) == set(Op)


@st.composite
def graphs(draw: st.DrawFn, max_nodes: int = 12) -> Graph:
    b = Builder(draw(st.one_of(st.just("main"), names)))
    for t in draw(st.lists(types(ALL_DTYPES), max_size=2)):
        b.input(t)
    c = Ctx(draw, b)
    for op in draw(st.lists(st.sampled_from(list(Op)), min_size=1, max_size=max_nodes)):
        GEN[op](c)
    outs = draw(st.lists(st.sampled_from(c.pool), min_size=1, max_size=3))
    return b.finish(outs)
