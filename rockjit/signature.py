"""Signatures and tracing: what a call's arguments look like to the tracer (per argument its
pytree structure and leaves' shapes and dtypes, or a static argument's value), and tracing a
function at a signature into the rockjit IR (api.py's module docstring)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from .errors import TraceError
from .gc_pause import gc_paused
from .ir.graph import Graph
from .ir.types import DType, TensorType

# ------------------------------------------------------------------ signatures

@dataclass(frozen=True)
class LeafSpec:
    """One array leaf as the tracer sees it: its path inside its argument, shape and dtype."""

    path: str          # jax keystr, e.g. "['layers'][0]['w']"; "" for a bare array
    shape: tuple[int, ...]
    dtype: np.dtype

    def __str__(self) -> str:
        return str(TensorType(DType.from_numpy(self.dtype), self.shape))


@dataclass(frozen=True)
class ArgSpec:
    """One positional argument: static (by value) or a pytree of array leaves."""

    kind: str                       # "static" | "input" | "resident"
    static_value: Any = None
    treedef: Any = None
    leaves: tuple[LeafSpec, ...] = ()

    def key(self) -> tuple:
        if self.kind == "static":
            return ("static", type(self.static_value), self.static_value)
        return (self.kind, self.treedef, tuple((l.shape, l.dtype.str) for l in self.leaves))


def arg_name(fn: Callable[..., Any], i: int) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if i < len(params) and params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                              inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return params[i].name
    return None


def arg_location(fn: Callable[..., Any], i: int, path: str = "") -> str:
    name = arg_name(fn, i)
    s = f"argument {i}" + (f" ({name!r})" if name else "")
    return s + (f" at pytree path {path}" if path else "")


def _python_scalar(leaf: Any) -> tuple[tuple[()], np.dtype] | None:
    """((), dtype) of a Python scalar leaf as jax.jit types it (x64 disabled), else None."""
    if isinstance(leaf, (bool, np.bool_)):
        return (), np.dtype(bool)
    if isinstance(leaf, int):
        return (), np.dtype(np.int32)
    if isinstance(leaf, float):
        return (), np.dtype(np.float32)
    return None


def leaf_dtype(leaf: Any, fn: Callable[..., Any], i: int, path: str) -> tuple[tuple[int, ...],
                                                                                 np.dtype]:
    """Shape and canonical dtype of one leaf, as jax.jit would see it (x64 disabled)."""
    scalar = _python_scalar(leaf)
    if scalar is not None:
        shape, dt = scalar
    elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        shape = tuple(int(d) for d in leaf.shape)
        dt = np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype))
    else:
        raise TraceError(f"{arg_location(fn, i, path)}: expected an array, got {type(leaf).__name__} "
                         f"({leaf!r:.60}); pass arrays, or mark the argument static with "
                         f"static_argnums={i}")
    try:
        DType.from_numpy(dt)
    except TypeError:
        names = ", ".join(d.value for d in DType)
        from .frontend.context import dtype_advice
        raise TraceError(f"{arg_location(fn, i, path)}: dtype {dt.name} has no rockjit IR element type "
                         f"(supported: {names}); {dtype_advice(dt, 'before the call')}") from None
    return shape, dt


def resident_dtype(dt: np.dtype) -> np.dtype:
    # Resident weights are kept as float32 copies whatever they are stored as (bf16, f16, f64):
    # the lowering decides the on-device precision, the IR holds the exact values.
    return np.dtype(np.float32) if np.issubdtype(dt, np.floating) or dt.name == "bfloat16" else dt


def _param_name(path: tuple[Any, ...], fallback: str) -> str:
    """A resident leaf's name: its pytree keys joined with '.' (a flat dict of HF tensor names
    gives the key itself)."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts) if parts else fallback


@dataclass
class Signature:
    """The abstract form of a call's positional arguments."""

    fn: Callable[..., Any]
    args: tuple[ArgSpec, ...]
    static_argnums: tuple[int, ...]
    resident_argnums: tuple[int, ...]
    param_names: dict[tuple[int, int], str] = field(default_factory=dict)

    def key(self) -> tuple:
        return tuple(a.key() for a in self.args)

    @property
    def n_static(self) -> int:
        return len(self.static_argnums)

    def describe(self) -> str:
        parts = []
        for i, a in enumerate(self.args):
            if a.kind == "static":
                parts.append(f"{i}: static {a.static_value!r}")
            else:
                leaves = ", ".join(f"{l.path or 'array'}: {l}" for l in a.leaves)
                parts.append(f"{i}: {a.kind} {{{leaves}}}")
        return "; ".join(parts)


def normalize_argnums(argnums: int | Iterable[int], n: int | None) -> tuple[int, ...]:
    if isinstance(argnums, int):
        argnums = (argnums,)
    out = []
    for a in argnums:
        a = int(a)
        if n is not None and a < 0:
            a += n
        out.append(a)
    return tuple(sorted(set(out)))


def bind_kwargs(fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    """Keyword arguments become positional ones, as jax.jit treats them as dynamic inputs."""
    if not kwargs:
        return args
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise TraceError(f"arguments do not fit {getattr(fn, '__name__', fn)}: {e}") from None
    if bound.kwargs:
        raise TraceError(f"keyword-only arguments {sorted(bound.kwargs)} are not supported by "
                         f"rockjit.compile; make them positional parameters")
    return tuple(bound.args)


def make_signature(fn: Callable[..., Any], args: Sequence[Any], static_argnums: Sequence[int],
                   resident_argnums: Sequence[int]) -> Signature:
    n = len(args)
    static = normalize_argnums(static_argnums, n)
    resident = normalize_argnums(resident_argnums, n)
    for a in static + resident:
        if not 0 <= a < n:
            raise TraceError(f"{'static' if a in static else 'resident'}_argnums names argument "
                             f"{a}, but the call passes {n} positional argument(s)")
    specs: list[ArgSpec] = []
    param_names: dict[tuple[int, int], str] = {}
    seen: dict[str, tuple[int, str]] = {}     # param name -> (argument, path) of its leaf
    for i, arg in enumerate(args):
        if i in static:
            try:
                hash(arg)
            except TypeError:
                raise TraceError(f"static {arg_location(fn, i)} must be hashable, got "
                                 f"{type(arg).__name__}; pass a tuple instead of a list, or make "
                                 f"the argument dynamic") from None
            specs.append(ArgSpec("static", static_value=arg))
            continue
        with_path, treedef = tree_flatten_with_path(arg)
        leaves = []
        # the argument's name once (inspect.signature is slow), not per leaf
        fallback = (arg_name(fn, i) or f"arg{i}") if i in resident else ""
        for j, (path, leaf) in enumerate(with_path):
            p = keystr(path)
            shape, dt = leaf_dtype(leaf, fn, i, p)
            if i in resident:
                dt = resident_dtype(dt)
                name = _param_name(path, fallback)
                if name in seen:
                    raise TraceError(f"resident {arg_location(fn, i, p)} and "
                                     f"{arg_location(fn, *seen[name])} both map to the param "
                                     f"name {name!r}; give them distinct pytree keys")
                seen[name] = (i, p)
                param_names[(i, j)] = name
            leaves.append(LeafSpec(p, shape, dt))
        specs.append(ArgSpec("resident" if i in resident else "input", treedef=treedef,
                             leaves=tuple(leaves)))
    return Signature(fn, tuple(specs), static, resident, param_names)


# ------------------------------------------------------------------ the per-call key

# (leaf dtype, resident?) -> the dtype the signature records, or None for one with no IR type
_DTYPE_MEMO: dict[tuple[Any, bool], np.dtype | None] = {}


def _fast_leaf(leaf: Any, resident: bool) -> tuple[tuple[int, ...], str] | None:
    """(shape, dtype.str) of a leaf as ``make_signature`` records it, or None when only the
    full path can say (an unsupported dtype or leaf type: it raises the error)."""
    if type(leaf) is np.ndarray:       # the common leaf first: no scalar tests
        shape, dt = leaf.shape, leaf.dtype
    elif (scalar := _python_scalar(leaf)) is not None:
        shape, dt = scalar
    else:
        try:
            shape, dt = leaf.shape, leaf.dtype
        except AttributeError:
            return None
        if type(shape) is not tuple:
            shape = tuple(int(d) for d in shape)
    memo = (dt, resident)
    got = _DTYPE_MEMO.get(memo, False)
    if got is False:
        got = np.dtype(jax.dtypes.canonicalize_dtype(dt))
        try:
            DType.from_numpy(got)
        except TypeError:
            got = None
        else:
            got = resident_dtype(got) if resident else got
        _DTYPE_MEMO[memo] = got
    return None if got is None else (shape, got.str)


def call_key(args: Sequence[Any], static_argnums: Sequence[int], resident_argnums: Sequence[int]
             ) -> tuple[tuple, list[list[Any] | None]] | None:
    """``make_signature(...).key()`` of a call, and each dynamic argument's leaves (None for a
    static one), from ``tree_flatten`` alone: no pytree paths, param names or argument names,
    which only a first call (a trace) or an error needs. None when the call needs the full
    path (it then raises what is wrong)."""
    n = len(args)
    static = normalize_argnums(static_argnums, n)
    resident = normalize_argnums(resident_argnums, n)
    key: list[tuple] = []
    leaves_by_arg: list[list[Any] | None] = []
    for i, arg in enumerate(args):
        if i in static:
            key.append(("static", type(arg), arg))
            leaves_by_arg.append(None)
            continue
        res = i in resident
        leaves, treedef = tree_flatten(arg)
        specs = []
        for leaf in leaves:
            spec = _fast_leaf(leaf, res)
            if spec is None:
                return None
            specs.append(spec)
        key.append(("resident" if res else "input", treedef, tuple(specs)))
        leaves_by_arg.append(leaves)
    out = tuple(key)
    try:
        hash(out)
    except TypeError:       # an unhashable static argument: make_signature says so
        return None
    return out, leaves_by_arg


# ------------------------------------------------------------------ tracing

@gc_paused
def trace(sig: Signature, name: str) -> tuple[Graph, Any]:
    """The IR graph of ``sig.fn`` at the signature, and its output pytree structure. JAX traces
    it (``jax.jit(...).trace``: static arguments by value, the others as abstract arrays); the
    jaxpr's inputs are the dynamic arguments' leaves in order, so resident leaves become
    ``param`` nodes by position."""
    from .frontend import import_jaxpr
    from .frontend.locations import function_loc

    args = [a.static_value if a.kind == "static" else
            tree_unflatten(a.treedef, [jax.ShapeDtypeStruct(l.shape, l.dtype) for l in a.leaves])
            for a in sig.args]
    traced = jax.jit(sig.fn, static_argnums=sig.static_argnums).trace(*args)
    param_names = [sig.param_names.get((i, j)) for i, a in enumerate(sig.args)
                   if a.kind != "static" for j in range(len(a.leaves))]
    graph = import_jaxpr(traced.jaxpr, param_names, name=name, default_loc=function_loc(sig.fn))
    return _simplify(graph), traced.out_tree


def _simplify(graph: Graph) -> Graph:
    """canonicalize + constfold, so RoPE tables, masks and iota arrive as constants."""
    from .frontend.simplify import simplify_after_import

    return simplify_after_import(graph)


def graph_name(fn: Callable[..., Any]) -> str:
    from .frontend.locations import function_name

    return function_name(fn)
