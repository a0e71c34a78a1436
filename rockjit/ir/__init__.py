"""The rockjit IR: typed SSA graphs with a text form, a verifier and a numpy reference.

Meaning of each op = its shape rule (``rules.SHAPE_RULES``) + its numpy reference
(``reference.REFERENCE``).  Text form: ``printer.print_graph`` / ``parser.parse``.
"""
from __future__ import annotations

from .graph import Builder, Graph, Loc, Node, Value
from .ops import Group, Op
from .rules import SHAPE_RULES, infer_type
from .types import DType, TensorType

__all__ = ["Builder", "Graph", "Loc", "Node", "Value", "Group", "Op", "DType", "TensorType",
           "SHAPE_RULES", "infer_type"]
