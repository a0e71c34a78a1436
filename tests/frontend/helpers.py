"""Shared helpers of the frontend tests: trace with JAX, import, run the IR interpreter."""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from rockjit.frontend import import_jaxpr
from rockjit.ir.graph import Graph
from rockjit.ir.interpreter import run


def jaxpr_primitives(closed: Any) -> set[str]:
    """Every primitive name in a jaxpr, including those of nested (call) jaxprs."""
    names: set[str] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(closed.jaxpr)
    return names


def import_fn(fn: Callable[..., Any], *args: Any) -> tuple[Graph, Any]:
    closed = jax.make_jaxpr(fn)(*args)
    return import_jaxpr(closed), closed


def verify_if_available(graph: Graph) -> None:
    """The IR verifier, always on in tests (it lives in rockjit.ir, written alongside)."""
    from rockjit.ir.verifier import verify

    verify(graph)


def run_both(fn: Callable[..., Any], *args: Any) -> tuple[list[np.ndarray], list[np.ndarray],
                                                           Graph, Any]:
    """(IR interpreter outputs, JAX CPU outputs, graph, closed jaxpr) of ``fn`` on ``args``."""
    graph, closed = import_fn(fn, *args)
    verify_if_available(graph)
    got = run(graph, [np.asarray(a) for a in args], {})
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(fn(*args))]
    return got, want, graph, closed


def assert_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-5,
                 atol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if w.dtype == bool or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True)

