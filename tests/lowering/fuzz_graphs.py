"""Random graphs for the differential fuzzer of the lowering (issue 13): hypothesis strategies
that draw a *spec* (a plain dict, so a shrunk failure can be pasted back as an ``@example``),
``build`` that turns a spec into a plain JAX function plus its arguments, and ``run_spec`` that
compiles it for the strict simulator and compares with the IR interpreter under
tolerance.graph_bound.

Shared by tests/lowering/test_fuzz_lowering.py (a bounded CI run) and bench/fuzz_lowering.py
(a run as long as asked).

Sizes are drawn mostly small (fast examples) with a tail of large ones; ``MAX_MACS`` bounds the
multiply-accumulates of one example, because a big contraction on the simulator is slow.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from types import MappingProxyType
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

import rockjit
from rockjit.errors import UnsupportedError
from rockjit.oracle import tolerance as T

MAX_MACS = 48_000_000          # per example; ~0.3 s of simulator time for a matmul
MAX_ELEMS = 1 << 20            # per tensor, for the element-wise/data-movement ops
SMALL = "fuzz-small"           # the derived second profile (6 CBUF banks, 2 cores)
PROFILES = ("rk3588", SMALL)


# ---- the second chip profile ------------------------------------------------------------------

def half_rk3588(name: str):
    """The tests' derived chip profile: the RK3588 with half its CBUF and 2 of its 3 cores
    (not registered)."""
    from rockjit.lowering.profile import get_profile

    base = get_profile("rk3588")
    sources = dict(base.sources)
    sources.update(
        name="test-only derived profile (tests/lowering/fuzz_graphs.py half_rk3588), not a real chip",
        cbuf_banks="test: half the RK3588 CBUF ([hw] 'CBUF 12 banks x 32 KB' -> 6 banks), a "
                   "subset the 12-bank simulator can run",
        cores="test: 2 of the RK3588's 3 cores ([hw] 'Three cores')",
    )
    return dataclasses.replace(base, name=name, cbuf_banks=6, cores=2, sources=MappingProxyType(sources))


@contextlib.contextmanager
def profile_registered(name: str):
    """Register ``half_rk3588(name)`` for the duration, then remove it again so the
    process-wide registry is as it was."""
    import rockjit.lowering.profile as profile_module
    from rockjit.lowering.profile import register_profile

    if name == "rk3588":
        yield
        return
    prof = half_rk3588(name)
    fresh = name not in profile_module._PROFILES
    register_profile(prof)
    try:
        yield
    finally:
        if fresh:
            profile_module._PROFILES.pop(name, None)


def backend_for(profile: str) -> str:
    return "sim" if profile == "rk3588" else f"sim:{profile}"


# ---- sizes ------------------------------------------------------------------------------------

def dim(hi: int, small: int = 24) -> st.SearchStrategy[int]:
    """A dimension in [1, hi], weighted to small (80 %), with a tail up to ``hi`` that favours
    values just off the 8/16/32 alignments."""
    small = min(small, hi)
    parts = [st.integers(1, small)] * 4
    if hi > small:
        parts.append(st.integers(small + 1, hi))
        edges = sorted({v for b in (32, 64, 128, 256, 512, 1024, 2048) for v in (b - 1, b, b + 1)
                        if small < v <= hi})
        parts.append(st.sampled_from(edges or [hi]))
    return st.one_of(*parts)


def batch_dims() -> st.SearchStrategy[tuple[int, ...]]:
    """Leading batch dimensions: none, or 1-2 dims each 1-4."""
    return st.one_of(st.just(()), st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple))


def _fit(dims: list[int], cost: Callable[[list[int]], int], cap: int) -> list[int]:
    """Halve the largest dim until cost(dims) <= cap (keeps the draw, bounds the work)."""
    dims = list(dims)
    while cost(dims) > cap:
        i = max(range(len(dims)), key=lambda j: dims[j])
        if dims[i] == 1:
            break
        dims[i] = max(1, dims[i] // 2)
    return dims


# ---- spec strategies --------------------------------------------------------------------------

UNARY = ("tanh", "exp", "sigmoid", "gelu", "gelu_tanh", "relu", "silu", "neg", "abs", "square",
         "sqrt", "rsqrt", "log", "recip", "erf")
BINARY = ("add", "sub", "mul", "max", "min", "div")
BCAST = ("same", "scalar", "row", "col", "inner", "lead", "swap")
REDUCE = ("sum", "mean", "max", "min")


@st.composite
def matmul_spec(draw) -> dict:
    b = draw(batch_dims())
    m, k, n = draw(dim(3000)), draw(dim(3000)), draw(dim(3000))
    nb = math.prod(b)
    m, k, n = _fit([m, k, n], lambda d: nb * d[0] * d[1] * d[2], MAX_MACS)
    return dict(op="matmul", batch=b, m=m, k=k, n=n, bias=draw(st.booleans()),
                weight=draw(st.sampled_from(["resident", "input"])))


@st.composite
def bmm_spec(draw) -> dict:
    b = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple))
    m, k, n = draw(dim(1024)), draw(dim(1024)), draw(dim(1024))
    nb = math.prod(b)
    m, k, n = _fit([m, k, n], lambda d: nb * d[0] * d[1] * d[2], MAX_MACS // 2)
    return dict(op="bmm", batch=b, m=m, k=k, n=n, transpose_b=draw(st.booleans()))


@st.composite
def conv_spec(draw) -> dict:
    nd = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(1, 4))
    depthwise = draw(st.booleans()) if nd == 2 else False
    c = draw(dim(1024, 16))
    o = c if depthwise else draw(dim(1024, 16))
    k = [draw(st.one_of(st.integers(1, 3), st.integers(1, 16))) for _ in range(nd)]
    # strides past CNA_CONV_CON3's 3-bit field (8..16) run an ungrouped conv through im2col +
    # matmul; a depthwise one has no form for them (a clean UnsupportedError), so it draws
    # them rarely and spends its examples on the strides it can run
    big = st.integers(8, 16)
    if not depthwise:
        s = [draw(st.one_of(st.integers(1, 2), st.integers(1, 2), st.integers(1, 7), big))
             for _ in range(nd)]
    else:
        s = [draw(st.one_of(st.integers(1, 2), st.integers(1, 7))) for _ in range(nd)]
        if draw(st.sampled_from(range(16))) == 7:
            s[draw(st.integers(0, nd - 1))] = draw(big)
    d = [draw(st.one_of(st.just(1), st.integers(1, 3))) for _ in range(nd)]
    p = [draw(st.integers(0, 3)) for _ in range(nd)]
    sp = [draw(dim(512, 32)) for _ in range(nd)]
    # the dilated kernel must fit in the padded input
    sp = [max(x, (kk - 1) * dd + 1 - 2 * pp) for x, kk, dd, pp in zip(sp, k, d, p)]
    sp = [max(1, x) for x in sp]

    def macs(v):
        c_, o_, *spd = v
        out = [max(1, (x + 2 * pp - (kk - 1) * dd - 1) // ss + 1)
               for x, kk, dd, pp, ss in zip(spd, k, d, p, s)]
        per = (1 if depthwise else c_) * math.prod(k)
        return n * o_ * math.prod(out) * per + n * c_ * math.prod(spd) // 4

    if depthwise:
        c2, _, *sp = _fit([c, c, *sp], macs, MAX_MACS)
        c, o = c2, c2
    else:
        c, o, *sp = _fit([c, o, *sp], macs, MAX_MACS)
    sp = [max(x, (kk - 1) * dd + 1 - 2 * pp, 1) for x, kk, dd, pp in zip(sp, k, d, p)]
    return dict(op="conv", nd=nd, n=n, c=c, o=o, k=k, stride=s, dil=d, pad=p, size=sp,
                depthwise=depthwise, bias=draw(st.booleans()))


@st.composite
def pool_spec(draw) -> dict:
    n = draw(st.integers(1, 4))
    c = draw(dim(512, 16))
    h, w = draw(dim(256, 32)), draw(dim(256, 32))
    c, h, w = _fit([c, h, w], lambda v: n * v[0] * v[1] * v[2], MAX_ELEMS)
    kh, kw = draw(st.integers(1, min(8, h))), draw(st.integers(1, min(8, w)))
    sh, sw = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return dict(op="pool", kind=draw(st.sampled_from(["max", "avg"])), n=n, c=c, h=h, w=w,
                win=[kh, kw], stride=[sh, sw], pad=draw(st.sampled_from(["VALID", "SAME"])))


def _shape(draw, rank_lo: int = 1, rank_hi: int = 3) -> tuple[int, ...]:
    b = draw(batch_dims())
    core = [draw(dim(2048, 40)) for _ in range(draw(st.integers(rank_lo, rank_hi)))]
    nb = math.prod(b)
    core = _fit(core, lambda v: nb * math.prod(v), MAX_ELEMS)
    return tuple(b) + tuple(core)


@st.composite
def eltwise_spec(draw) -> dict:
    shape = _shape(draw)
    return dict(op="binary", fn=draw(st.sampled_from(BINARY)), shape=shape,
                bcast=draw(st.sampled_from(BCAST)),
                other=draw(st.sampled_from(["input", "resident"])))


@st.composite
def unary_spec(draw) -> dict:
    return dict(op="unary", fn=draw(st.sampled_from(UNARY)), shape=_shape(draw))


@st.composite
def reduce_spec(draw) -> dict:
    shape = _shape(draw, 1, 3)
    axis = draw(st.integers(-len(shape), -1))
    return dict(op="reduce", fn=draw(st.sampled_from(REDUCE)), shape=shape, axis=axis,
                keepdims=draw(st.booleans()))


@st.composite
def movement_spec(draw) -> dict:
    shape = _shape(draw, 2, 3)
    kind = draw(st.sampled_from(["concat", "split", "slice", "transpose", "reshape"]))
    r = len(shape)
    spec = dict(op="move", kind=kind, shape=shape, axis=draw(st.integers(0, r - 1)))
    if kind == "transpose":
        spec["perm"] = draw(st.permutations(range(r)))
    elif kind == "slice":
        a = spec["axis"]
        lo = draw(st.integers(0, shape[a] - 1))
        spec["lo"], spec["hi"] = lo, draw(st.integers(lo + 1, shape[a]))
        spec["step"] = draw(st.integers(1, 3))
    elif kind == "split":
        a = spec["axis"]
        spec["at"] = draw(st.integers(0, shape[a]))
    elif kind == "concat":
        spec["other"] = draw(st.integers(1, 64))
    # a following op on the NPU, so the moved data is consumed by an NPU kernel
    spec["then"] = draw(st.sampled_from(["none", "add1", "tanh"]))
    return spec


@st.composite
def chain_spec(draw) -> dict:
    """A small graph: a run-time input [*batch, rows, d] through 2-5 steps."""
    b = draw(batch_dims())
    rows, d = draw(dim(512, 40)), draw(dim(1024, 48))
    steps = draw(st.lists(st.sampled_from(
        ["linear", "unary", "bias", "residual", "softmax", "layernorm", "scale", "transpose2",
         "sum_keep"]), min_size=2, max_size=5))
    units = [draw(st.sampled_from(["tanh", "gelu", "relu", "sigmoid", "silu", "exp_small"]))
             for _ in steps]
    widths = [draw(dim(1024, 48)) for _ in steps]
    nb = math.prod(b)
    rows, d = _fit([rows, d], lambda v: nb * v[0] * v[1] * max(widths), MAX_MACS // 2)
    return dict(op="chain", batch=b, rows=rows, d=d, steps=steps, units=units, widths=widths)


def specs() -> st.SearchStrategy[dict]:
    """Every op family, single ops and small chains, tagged with a seed for the values and a
    chip profile (a quarter of them on the derived 6-bank, 2-core machine)."""
    body = st.one_of(matmul_spec(), bmm_spec(), conv_spec(), pool_spec(), eltwise_spec(),
                     unary_spec(), reduce_spec(), movement_spec(), chain_spec())
    return st.builds(lambda s, seed, prof: {**s, "seed": seed, "profile": prof}, body,
                     st.integers(0, 2 ** 16),
                     st.sampled_from(["rk3588", "rk3588", "rk3588", SMALL]))


# ---- building the JAX function ----------------------------------------------------------------

def _unary(name: str, x):
    return {
        "tanh": jnp.tanh, "exp": jnp.exp, "sigmoid": jax.nn.sigmoid,
        "gelu": lambda v: jax.nn.gelu(v, approximate=False),
        "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True), "relu": jax.nn.relu,
        "silu": jax.nn.silu, "neg": jnp.negative, "abs": jnp.abs, "square": jnp.square,
        "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "log": jnp.log, "recip": lambda v: 1.0 / v,
        "erf": jax.scipy.special.erf, "exp_small": lambda v: jnp.exp(v * 0.25),
    }[name](x)


POSITIVE = {"sqrt", "rsqrt", "log", "recip"}


def _bshape(shape: tuple[int, ...], form: str) -> tuple[int, ...]:
    """The second operand's shape for a broadcast form."""
    r = len(shape)
    if form == "same":
        return shape
    if form == "scalar":
        return ()
    if form == "row":                      # one vector along the last axis
        return shape[-1:]
    if form == "col":                      # keepdims over the last axis
        return shape[:-1] + (1,)
    if form == "inner":                    # the trailing two (or one) axes, no batch
        return shape[-2:] if r >= 2 else shape
    if form == "lead":                     # per leading index, broadcast over the rest
        return shape[:1] + (1,) * (r - 1)
    if form == "swap":                     # [.., 1, d] against [.., r, 1] style mix
        return shape[:-2] + (1, shape[-1]) if r >= 2 else shape
    raise ValueError(form)


def build(spec: dict) -> tuple[Callable[..., Any], dict | None, list[np.ndarray]]:
    """(fn, resident params or None, run-time inputs) for a spec. Values come from the spec's
    seed; operands of sqrt/log/div are kept away from 0."""
    rng = np.random.default_rng(spec["seed"])

    def rnd(*shape, scale=1.0, positive=False):
        a = rng.standard_normal(shape) * scale
        if positive:
            a = np.abs(a) + 0.25
        return a.astype(np.float32)

    op = spec["op"]
    if op == "matmul":
        b, m, k, n = spec["batch"], spec["m"], spec["k"], spec["n"]
        w, x = rnd(k, n, scale=1 / math.sqrt(k)), rnd(*b, m, k)
        bias = rnd(n, scale=0.1)
        if spec["weight"] == "resident":
            p = {"w": w, "b": bias}
            fn = (lambda p, x: x @ p["w"] + p["b"]) if spec["bias"] else (lambda p, x: x @ p["w"])
            return fn, p, [x]
        if spec["bias"]:
            return (lambda x, w, c: x @ w + c), None, [x, w, bias]
        return (lambda x, w: x @ w), None, [x, w]
    if op == "bmm":
        b, m, k, n = spec["batch"], spec["m"], spec["k"], spec["n"]
        x = rnd(*b, m, k)
        if spec["transpose_b"]:
            y = rnd(*b, n, k, scale=1 / math.sqrt(k))
            return (lambda x, y: jnp.einsum("...mk,...nk->...mn", x, y)), None, [x, y]
        y = rnd(*b, k, n, scale=1 / math.sqrt(k))
        return (lambda x, y: x @ y), None, [x, y]
    if op == "conv":
        nd, n, c, o = spec["nd"], spec["n"], spec["c"], spec["o"]
        k, groups = spec["k"], (c if spec["depthwise"] else 1)
        cin = c // groups
        w = rnd(o, cin, *k, scale=1 / math.sqrt(cin * math.prod(k)))
        x = rnd(n, c, *spec["size"])
        dn = ("NCH", "OIH", "NCH") if nd == 1 else ("NCHW", "OIHW", "NCHW")
        stride, dil, pad = tuple(spec["stride"]), tuple(spec["dil"]), spec["pad"]
        bias = spec["bias"]

        def fn(p, x):
            y = lax.conv_general_dilated(x, p["w"], stride, [(q, q) for q in pad],
                                         rhs_dilation=dil, dimension_numbers=dn,
                                         feature_group_count=groups)
            if bias:
                y = y + p["b"].reshape((1, o) + (1,) * nd)
            return y
        return fn, {"w": w, "b": rnd(o, scale=0.1)}, [x]
    if op == "pool":
        x = rnd(spec["n"], spec["c"], spec["h"], spec["w"])
        win, strides = (1, 1, *spec["win"]), (1, 1, *spec["stride"])
        pad = spec["pad"]
        if spec["kind"] == "max":
            fn = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, win, strides, pad)
        else:
            fn = lambda x: lax.reduce_window(x, 0.0, lax.add, win, strides, pad) / (
                win[2] * win[3])
        return fn, None, [x]
    if op == "binary":
        shape, name = spec["shape"], spec["fn"]
        f = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
             "min": jnp.minimum, "div": jnp.divide}[name]
        x = rnd(*shape)
        if spec["bcast"] == "scalar":
            c = float(rng.uniform(0.5, 2.0))
            return (lambda x: f(x, c)), None, [x]
        y = rnd(*_bshape(shape, spec["bcast"]), positive=(name == "div"))
        if spec["other"] == "resident":
            return (lambda p, x: f(x, p["y"])), {"y": y}, [x]
        return (lambda x, y: f(x, y)), None, [x, y]
    if op == "unary":
        name = spec["fn"]
        x = rnd(*spec["shape"], scale=2.0, positive=name in POSITIVE)
        if name == "exp":
            # exp(11.09) is fp16's largest finite value and the compiler's table covers the
            # data's range widened by calibrate.MARGIN (25 %) each side: past +-7 the lowering
            # refuses with a clear LoweringError ("exceed what an fp16 output can hold")
            x = np.clip(x, -7.0, 7.0)
        return (lambda x: _unary(name, x)), None, [x]
    if op == "reduce":
        f = {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max, "min": jnp.min}[spec["fn"]]
        axis, keep = spec["axis"], spec["keepdims"]
        return (lambda x: f(x, axis=axis, keepdims=keep)), None, [rnd(*spec["shape"])]
    if op == "move":
        return _build_move(spec, rnd)
    if op == "chain":
        return _build_chain(spec, rnd)
    raise ValueError(f"unknown fuzz op {op!r}")


def _then(spec: dict, y):
    t = spec.get("then", "none")
    return y + 1.0 if t == "add1" else jnp.tanh(y) if t == "tanh" else y


def _build_move(spec: dict, rnd):
    shape, axis, kind = spec["shape"], spec["axis"], spec["kind"]
    x = rnd(*shape)
    if kind == "concat":
        oshape = list(shape)
        oshape[axis] = spec["other"]
        return (lambda x, y: _then(spec, jnp.concatenate([x, y], axis))), None, [x, rnd(*oshape)]
    if kind == "split":
        at = spec["at"]
        return (lambda x: tuple(_then(spec, h) for h in jnp.split(x, [at], axis))), None, [x]
    if kind == "slice":
        sl = [slice(None)] * len(shape)
        sl[axis] = slice(spec["lo"], spec["hi"], spec["step"])
        return (lambda x: _then(spec, x[tuple(sl)])), None, [x]
    if kind == "transpose":
        perm = tuple(spec["perm"])
        return (lambda x: _then(spec, jnp.transpose(x, perm))), None, [x]
    # reshape: merge the axis with its neighbour (or split the last axis if it is even)
    r = len(shape)
    if axis < r - 1:
        new = shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:]
    elif shape[-1] % 2 == 0:
        new = shape[:-1] + (2, shape[-1] // 2)
    else:
        new = (math.prod(shape),)
    return (lambda x: _then(spec, x.reshape(new))), None, [x]


def _build_chain(spec: dict, rnd):
    b, rows, d = spec["batch"], spec["rows"], spec["d"]
    x = rnd(*b, rows, d)
    params: dict[str, np.ndarray] = {}
    width = d
    plan = []
    for i, (step, unit, wd) in enumerate(zip(spec["steps"], spec["units"], spec["widths"])):
        if step == "linear":
            params[f"w{i}"] = rnd(width, wd, scale=1 / math.sqrt(width))
            width = wd
        elif step in ("bias", "layernorm"):
            params[f"b{i}"] = rnd(width, scale=0.1)
            params[f"g{i}"] = (1.0 + rnd(width, scale=0.1)).astype(np.float32)
        plan.append((i, step, unit, width))

    def fn(p, x):
        h = x
        for i, step, unit, _ in plan:
            if step == "linear":
                h = h @ p[f"w{i}"]
            elif step == "unary":
                h = _unary(unit, h)
            elif step == "bias":
                h = h + p[f"b{i}"]
            elif step == "residual":
                h = h + _unary(unit, h)
            elif step == "softmax":
                h = jax.nn.softmax(h, axis=-1)
            elif step == "layernorm":
                m = h.mean(-1, keepdims=True)
                v = ((h - m) ** 2).mean(-1, keepdims=True)
                h = (h - m) / jnp.sqrt(v + 1e-5) * p[f"g{i}"] + p[f"b{i}"]
            elif step == "scale":
                h = h * 0.5
            elif step == "transpose2":
                h = jnp.swapaxes(jnp.swapaxes(h, -1, -2) * 1.0, -1, -2)
            elif step == "sum_keep":
                h = h - h.sum(-1, keepdims=True) / h.shape[-1]
        return h
    return fn, params, [x]


# ---- one differential run ---------------------------------------------------------------------

def describe(spec: dict) -> str:
    """A short shape summary for tables."""
    keys = [k for k in spec if k not in ("seed", "profile", "op")]
    return f"{spec['op']}(" + ", ".join(f"{k}={spec[k]}" for k in keys) + ")"


def run_spec(spec: dict) -> str:
    """Compile ``spec`` for the strict simulator of its profile and for the IR interpreter, and
    compare every output under graph_bound. Returns "ok", or "refused: <message>" when the
    lowering refuses the graph with UnsupportedError; anything else (a crash, a wrong value, a
    NaN, a strict-mode refusal of our own program) propagates."""
    fn, params, xs = build(spec)
    resident = () if params is None else 0
    args = list(xs) if params is None else [params, *xs]
    # the frontend itself: the interpreter's result must agree with JAX on CPU (fp32)
    with profile_registered(spec["profile"]):
        try:
            f = rockjit.compile(fn, resident_argnums=resident, backend=backend_for(spec["profile"]))
            got = f(*args)
            c = f.compiled(*args)
        except UnsupportedError as e:
            return f"refused: {str(e).splitlines()[0][:400]}"
    ref = rockjit.compile(fn, resident_argnums=resident, backend="interpreter")(*args)
    jx = fn(*args)
    got_l = list(got) if isinstance(got, (tuple, list)) else [got]
    ref_l = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    jx_l = list(jx) if isinstance(jx, (tuple, list)) else [jx]
    bounds = T.graph_bound(c.graph, c.params, xs)
    assert len(got_l) == len(ref_l) == len(bounds), (len(got_l), len(ref_l), len(bounds))
    for i, (g, r, j, bnd) in enumerate(zip(got_l, ref_l, jx_l, bounds)):
        r64, j64 = np.asarray(r, np.float64), np.asarray(j, np.float64)
        assert r64.shape == j64.shape, f"output {i}: interpreter {r64.shape} != JAX {j64.shape}"
        np.testing.assert_allclose(r64, j64, rtol=1e-4, atol=1e-5 * (1 + np.abs(j64).max(initial=0.0)),
                                   err_msg=f"output {i}: interpreter vs JAX on CPU")
        T.check(np.asarray(g), r64, bnd + 2.0 ** -23 * np.abs(r64), f"{describe(spec)} out {i}")
    return "ok"
