"""The checks shape rules share (ir/rules.py): attribute parsing, arity, result-type hints.
A rule raises ``RuleError``; ``rules.infer_type`` prefixes the op and the operand types."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .types import TensorType

Rule = Callable[[Sequence[TensorType], Mapping[str, Any], "TensorType | None"], TensorType]


class RuleError(Exception):
    """Raised inside a rule; ``infer_type`` prefixes the op and the operand types."""


def fail(msg: str) -> None:
    raise RuleError(msg)


# ---------------------------------------------------------------- attribute checks

def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def int_attr(attrs: Mapping[str, Any], key: str) -> int:
    v = attrs[key]
    if not is_int(v):
        fail(f"attribute {key} must be an integer, got {v!r}")
    return int(v)


def ints_attr(attrs: Mapping[str, Any], key: str, length: int | None = None) -> tuple[int, ...]:
    v = attrs[key]
    if not isinstance(v, (tuple, list)) or not all(is_int(x) for x in v):
        fail(f"attribute {key} must be a list of integers, got {v!r}")
    if length is not None and len(v) != length:
        fail(f"attribute {key} must have {length} entries (one per dimension), got {len(v)}: "
              f"{list(v)}")
    return tuple(int(x) for x in v)


def axes_attr(attrs: Mapping[str, Any], key: str, rank: int) -> tuple[int, ...]:
    axes = ints_attr(attrs, key)
    for a in axes:
        if not 0 <= a < rank:
            fail(f"attribute {key}={list(axes)}: axis {a} is out of range for rank {rank}")
    if len(set(axes)) != len(axes):
        fail(f"attribute {key}={list(axes)} repeats an axis")
    return axes


def need_hint(hint: TensorType | None, what: str) -> TensorType:
    if hint is None:
        fail(f"the result type is not derivable from the operands ({what}); "
              "pass out_type explicitly")
    assert hint is not None
    return hint


def arity(ins: Sequence[TensorType], n: int) -> None:
    if len(ins) != n:
        fail(f"takes {n} operand(s), got {len(ins)}")


