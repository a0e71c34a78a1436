"""The lowering registry: ``LOWER_RULES[Op] -> rule(ctx) -> RuleResult``.

One module per op family; a rule maps an IR node to emitter calls (or a view) and raises
``NoNpuForm`` when the node, at its shapes and dtypes, has no legal NPU form; the partitioner
then takes the host rule (``rockjit.lowering.host_rules.HOST_RULES``) or raises
``UnsupportedError`` naming the op and its source line.
"""
from __future__ import annotations

from ...ir.ops import Op
from .base import (CubeForm, NoNpuForm, OpCall, RowForm, LowerRule, RuleContext,
                   RuleResult, Tensor, Use, ViewResult)
from . import contract, conv, eltwise, pool, reduce, shape

LOWER_RULES: dict[Op, LowerRule] = {}
for _m in (contract, conv, eltwise, pool, reduce, shape):
    for _op, _rule in _m.RULES.items():
        assert _op not in LOWER_RULES, f"two lowering rules for {_op}"
        LOWER_RULES[_op] = _rule

__all__ = ["LOWER_RULES", "CubeForm", "NoNpuForm", "OpCall", "RowForm", "LowerRule",
           "RuleContext", "RuleResult", "Tensor", "Use", "ViewResult"]
