"""Pytrees without JAX: the structure of a compiled function's arguments and results as plain
JSON data, so a bundle runs without importing JAX."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


from .errors import BundleError

def tree_spec_of(tree: Any, where: str) -> Any:
    """A JSON form of a pytree whose leaves are leaf indices (ints): dicts with str keys,
    lists, tuples and None; anything else is refused (it could not be rebuilt without the
    user's classes)."""
    if isinstance(tree, bool) or tree is None:
        if tree is None:
            return {"none": None}
    elif isinstance(tree, int):
        return {"leaf": tree}
    elif isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise BundleError(f"{where}: a dict with non-string keys cannot be stored in a bundle")
        return {"dict": [[k, tree_spec_of(v, where)] for k, v in tree.items()]}
    elif type(tree) in (list, tuple):
        return {type(tree).__name__: [tree_spec_of(v, where) for v in tree]}
    raise BundleError(f"{where}: a {type(tree).__name__} node cannot be stored in a bundle "
                      f"(dicts with string keys, lists, tuples and None can); return or take "
                      f"plain containers")


def _spec_kind(spec: Any) -> tuple[str, Any]:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise BundleError(f"the bundle's pytree description {spec!r:.60} is malformed")
    return next(iter(spec.items()))


def tree_leaf_count(spec: Any) -> int:
    kind, body = _spec_kind(spec)
    if kind == "leaf":
        return 1
    if kind == "none":
        return 0
    if kind == "dict":
        return sum(tree_leaf_count(v) for _, v in body)
    if kind in ("list", "tuple"):
        return sum(tree_leaf_count(v) for v in body)
    raise BundleError(f"unknown pytree node {kind!r} in the bundle")


def tree_leaf_indices(spec: Any, out: list[int]) -> list[int]:
    kind, body = _spec_kind(spec)
    if kind == "leaf":
        if not isinstance(body, int) or isinstance(body, bool):
            raise BundleError(f"a pytree leaf index is {body!r:.30}, not an integer")
        out.append(body)
    elif kind == "dict":
        if not isinstance(body, list) or not all(isinstance(kv, list) and len(kv) == 2
                                                 and isinstance(kv[0], str) for kv in body):
            raise BundleError("a pytree dict node is malformed")
        for _, v in body:
            tree_leaf_indices(v, out)
    elif kind in ("list", "tuple"):
        if not isinstance(body, list):
            raise BundleError(f"a pytree {kind} node is malformed")
        for v in body:
            tree_leaf_indices(v, out)
    elif kind != "none":
        raise BundleError(f"unknown pytree node {kind!r} in the bundle")
    return out


def tree_paths(spec: Any) -> list[str]:
    """Each leaf's path in the pytree (keys and positions joined with '.'; a bare leaf is
    'out'), by leaf index."""
    names: dict[int, str] = {}

    def walk(sp: Any, path: list[str]) -> None:
        kind, body = _spec_kind(sp)
        if kind == "leaf":
            names[body] = ".".join(path) or "out"
        elif kind == "dict":
            for k, v in body:
                walk(v, path + [str(k)])
        elif kind in ("list", "tuple"):
            for i, v in enumerate(body):
                walk(v, path + [str(i)])

    walk(spec, [])
    return [names[i] for i in sorted(names)]


def tree_build(spec: Any, leaves: Sequence[Any]) -> Any:
    """The pytree ``spec`` with leaf k = ``leaves[k]``."""
    kind, body = _spec_kind(spec)
    if kind == "leaf":
        return leaves[body]
    if kind == "none":
        return None
    if kind == "dict":
        return {k: tree_build(v, leaves) for k, v in body}
    if kind == "list":
        return [tree_build(v, leaves) for v in body]
    if kind == "tuple":
        return tuple(tree_build(v, leaves) for v in body)
    raise BundleError(f"unknown pytree node {kind!r} in the bundle")


def tree_flatten_into(spec: Any, obj: Any, out: dict[int, Any], path: str) -> None:
    """Put each leaf of ``obj`` at its index; the structure must be ``spec``'s."""
    kind, body = _spec_kind(spec)
    if kind == "leaf":
        out[body] = (path, obj)
    elif kind == "none":
        if obj is not None:
            raise BundleError(f"input {path or 'argument'}: expected None, got "
                              f"{type(obj).__name__}")
    elif kind == "dict":
        if not isinstance(obj, Mapping) or set(obj) != {k for k, _ in body}:
            got = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
            raise BundleError(f"input {path or 'argument'}: expected a dict with keys "
                              f"{sorted(k for k, _ in body)}, got {got}")
        for k, v in body:
            tree_flatten_into(v, obj[k], out, f"{path}[{k!r}]")
    else:
        if not isinstance(obj, (list, tuple)) or len(obj) != len(body):
            raise BundleError(f"input {path or 'argument'}: expected a {kind} of {len(body)}, "
                              f"got {type(obj).__name__}"
                              + (f" of {len(obj)}" if isinstance(obj, (list, tuple)) else ""))
        for i, v in enumerate(body):
            tree_flatten_into(v, obj[i], out, f"{path}[{i}]")


# JAX runs with x64 off: a float64/int64 argument is taken as float32/int32 (jax.jit does the
# same), so a bundle accepts what the compiled function accepted.
CANONICAL_DTYPE = {"float64": "float32", "int64": "int32", "uint64": "uint32"}
