"""The import-rule registry: one rule per jaxpr primitive name.

A rule receives an ``EqnContext`` (the equation, its params, the user's source location and
helpers that append IR nodes at that location) and the IR values of the equation's operands,
and returns the IR value(s) of the equation's results.  Rules live in one small module per
family (elementwise, reduce, shape, contract, index, control); importing
``rockjit.frontend`` registers them all.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ..ir.graph import Value

if TYPE_CHECKING:
    pass

ImportRule = Callable[..., "Value | Sequence[Value]"]

IMPORT_RULES: dict[str, ImportRule] = {}


def import_rule(*primitive_names: str) -> Callable[[ImportRule], ImportRule]:
    """Register ``fn`` as the import rule of each named jaxpr primitive.

    Several names are allowed because jax renamed some primitives across versions
    (``pjit`` became ``jit``, ``custom_vjp_call_jaxpr`` became ``custom_vjp_call``)."""

    def register(fn: ImportRule) -> ImportRule:
        for name in primitive_names:
            if name in IMPORT_RULES:
                raise ValueError(f"two import rules for jaxpr primitive {name!r}")
            IMPORT_RULES[name] = fn
        return fn

    return register


def supported_primitives() -> list[str]:
    """Sorted names of every jaxpr primitive the frontend can import."""
    return sorted(IMPORT_RULES)
