"""Every IR node carries the user's file:line; nodes from jax's own helpers (inlined calls)
carry the line of the user's call into them."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.frontend import import_jaxpr
from rockjit.ir.graph import Loc
from rockjit.ir.ops import Op

THIS_FILE = __file__


def line_of(marker: str) -> int:
    """The line of this file that carries the comment ``# <marker>``."""
    with open(THIS_FILE) as fh:
        hits = [i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def _inner(y):
    return jnp.tanh(y)  # L_INNER


def model(x, w):
    h = x @ w  # L_MATMUL
    a = jax.nn.relu(h)  # L_RELU
    b = jax.jit(_inner)(a)  # L_JIT_CALL
    e = jnp.take(w, jnp.array([0, 1]), axis=0)  # L_TAKE
    return b.sum(axis=0) + e[0]  # L_SUM


def _graph():
    x = np.ones((2, 3), np.float32)
    w = np.ones((3, 3), np.float32)
    return import_jaxpr(jax.make_jaxpr(model)(x, w))


def _locs(graph, op: Op) -> set[Loc]:
    return {n.loc for n in graph.nodes if n.op is op}


@pytest.mark.parametrize("op,marker", [
    (Op.DOT_GENERAL, "L_MATMUL"),
    (Op.MAX, "L_RELU"),            # relu's max lives in custom_jvp_call -> jit: no user frame
    (Op.TANH, "L_INNER"),          # a user function under jit keeps its own line
    (Op.TAKE, "L_TAKE"),           # jnp.take's gather is inside jax's _take helper
    (Op.REDUCE_SUM, "L_SUM"),
])
def test_node_loc_is_the_user_line(op: Op, marker: str) -> None:
    assert _locs(_graph(), op) == {Loc(THIS_FILE, line_of(marker))}


def test_every_node_has_a_location_in_this_file() -> None:
    g = _graph()
    assert all(n.loc is not None and n.loc.file == THIS_FILE for n in g.nodes)


def test_locations_survive_compile_lowering_and_folding() -> None:
    lowered = rockjit.compile(model).lower(np.ones((2, 3), np.float32),
                                           np.ones((3, 3), np.float32))
    assert _locs(lowered.graph, Op.TANH) == {Loc(THIS_FILE, line_of("L_INNER"))}
    assert f'loc("{THIS_FILE}":{line_of("L_MATMUL")})' in lowered.as_text()


def test_params_are_located_at_the_function_definition() -> None:
    def weights_user(p, x):  # L_DEF
        return x @ p["w"]

    g = rockjit.compile(weights_user, resident_argnums=0).lower(
        {"w": np.ones((3, 2), np.float32)}, np.ones((1, 3), np.float32)).graph
    assert _locs(g, Op.PARAM) == {Loc(THIS_FILE, line_of("L_DEF"))}
