"""`rockjit trace` specs of the encoders: a config from the published defaults plus the
overrides typed on the command line, and shape-only weights under their HF tensor names.

    rockjit trace models.siglip:trace_spec image_size=512
    rockjit trace models.whisper:trace_spec preset=tiny encoder_layers=1
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, Mapping, TypeVar

import jax
import jax.numpy as jnp

C = TypeVar("C")


def require_divisible(config: Any, field: str, by_field: str, verb: str = "divisible by") -> None:
    """Config check shared by the encoders: ``config.field`` must split evenly by
    ``config.by_field`` (the hidden width over the heads, the image over the patches)."""
    n, by = getattr(config, field), getattr(config, by_field)
    if n % by:
        raise ValueError(f"{type(config).__name__}: {field} {n} is not {verb} {by_field} {by}")


def configure(default: C, overrides: Mapping[str, Any]) -> C:
    """``default`` with the named fields replaced; an unknown field is a ValueError listing the
    known ones (the CLI shows it as a usage error)."""
    fields = {f.name: f for f in dataclasses.fields(default)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"{type(default).__name__} has no field(s) {unknown}; its fields are "
                         f"{', '.join(fields)}")
    for name, value in overrides.items():
        # Literal values from the command line: 512 for an int field, 1e-5 for a float field.
        want = type(getattr(default, name))
        ok = isinstance(value, want) or (want is float and isinstance(value, int))
        if not ok or (isinstance(value, bool) and want is not bool):
            raise ValueError(f"{type(default).__name__}.{name} takes {want.__name__} values, "
                             f"got {value!r}")
    return dataclasses.replace(default, **overrides)  # type: ignore[type-var]


def abstract_params(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, jax.ShapeDtypeStruct]:
    """The weights as fp32 shapes only: enough to trace, nothing to load."""
    return {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}


def encoder_spec(forward: Callable[..., Any], config: Any,
                 shapes: Mapping[str, tuple[int, ...]], *inputs: jax.ShapeDtypeStruct) -> Any:
    """``forward(params, *inputs, config=config)`` with the params resident (argument 0)."""
    from rockjit.api import TraceSpec  # lazy: the frontend is optional for plain JAX use

    return TraceSpec(partial(forward, config=config), (abstract_params(shapes), *inputs),
                     static_argnums=(), resident_argnums=(0,))
