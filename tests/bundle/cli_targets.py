"""``module:function`` targets for the CLI tests: TraceSpecs of the test block."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rockjit.api import TraceSpec

from .bundle_testutil import block, weights


def block_spec(rows: int = 16) -> TraceSpec:
    """The test block with its weights, on ``rows`` rows of input (shape only)."""
    return TraceSpec(block, (weights(), jax.ShapeDtypeStruct((rows, 64), jnp.float32)),
                     resident_argnums=(0,))


def abstract_block_spec(rows: int = 16) -> TraceSpec:
    """The same with the weights as shapes only (the CLI's --weights fills them)."""
    w = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32) for k, v in weights().items()}
    return TraceSpec(block, (w, jax.ShapeDtypeStruct((rows, 64), jnp.float32)),
                     resident_argnums=(0,))
