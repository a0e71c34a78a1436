"""Spec factories for the ``rockjit check`` CLI tests (``check_targets:name``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rockjit.api import TraceSpec


def three_lines(p, x):
    h = jnp.tanh(x @ p["w1"])
    g = jax.nn.sigmoid(4.0 * (h @ p["w2"]))
    return g @ p["w3"]


def params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, 64)) / 8).astype(np.float32),
            "w2": (rng.standard_normal((64, 64)) / 8).astype(np.float32),
            "w3": (rng.standard_normal((64, 32)) / 8).astype(np.float32)}


def three_lines_spec(rows: int = 16) -> TraceSpec:
    """Weights as arrays, the input abstract (the CLI fills it with N(0, 1))."""
    return TraceSpec(three_lines, (params(), jax.ShapeDtypeStruct((rows, 64), jnp.float32)),
                     resident_argnums=(0,))
