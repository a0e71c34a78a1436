"""Targets for `rockjit trace` in test_cli.py (imported by the CLI in a subprocess)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rockjit.api import TraceSpec


def mlp(params: dict, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["fc1.weight"] + params["fc1.bias"])
    return jax.nn.softmax(h @ params["fc2.weight"], axis=-1)


def small_mlp() -> TraceSpec:
    params = {"fc1.weight": jax.ShapeDtypeStruct((8, 16), jnp.float32),
              "fc1.bias": jax.ShapeDtypeStruct((16,), jnp.float32),
              "fc2.weight": jax.ShapeDtypeStruct((16, 4), jnp.float32)}
    return TraceSpec(mlp, (params, jax.ShapeDtypeStruct((2, 8), jnp.float32)),
                     resident_argnums=(0,))


def with_values() -> TraceSpec:
    return TraceSpec(lambda x, n: x * n, (np.ones((3,), np.float32), 4), static_argnums=(1,))


def not_a_spec() -> str:
    return "a string"


def unsupported() -> TraceSpec:
    return TraceSpec(jnp.cumsum, (jax.ShapeDtypeStruct((4,), jnp.float32),))


NOT_CALLABLE = 3
