"""JAX frontend: import a traced jaxpr into the rockjit IR.

Importing this package registers every import rule (one module per primitive family)."""
from __future__ import annotations

from . import contract, control, elementwise, index, reduce, shape  # noqa: F401  (registration)
from .jaxpr_import import import_jaxpr
from .registry import IMPORT_RULES, import_rule, supported_primitives

__all__ = ["import_jaxpr", "import_rule", "supported_primitives", "IMPORT_RULES"]
