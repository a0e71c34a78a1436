"""``rules.infer_type`` answers remembered per question.

The layers of a model ask the shape rules the same questions (op, operand types, attributes,
declared result type), and the verifier after every pass (passes/manager.py) asks them all
again: about a fifth of tracing a 22-layer ModernBERT went to answering them anew. A rule is a
pure function of its question, and its answer (a frozen TensorType) can be shared. Only a
legal question is remembered (an illegal one raises every time it is asked), and only one
whose attributes are plain values (ints, strings, floats by their bits, enums, tuples of
them): a constant's array value is answered without the memo. The memo is bounded, so a
long-lived process that compiles many models does not grow it without end.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

from .ops import Op
from .types import DType, TensorType

_KNOWN: dict[tuple, TensorType] = {}
_KNOWN_MAX = 1 << 14

InferType = Callable[..., TensorType]


def _plain(x: Any) -> Any:
    """``x`` as a key part telling apart every value a rule could treat differently (the type
    is part of it: 1, 1.0 and True are equal in Python; floats go by their bits, -0.0 != 0.0),
    or TypeError for anything else."""
    t = type(x)
    if t is tuple or t is list:
        # the common attribute (axes, shapes): a tuple of exact ints keys as itself under its
        # own tag (no bool or float can be in it, so == tells such tuples apart exactly)
        if all(type(v) is int for v in x):
            return (t.__name__ + " of int", tuple(x))
        return (t.__name__,) + tuple(_plain(v) for v in x)
    if x is None or isinstance(x, (bool, int, str, Op, DType)):
        return (type(x).__name__, x)
    if isinstance(x, float):
        return (type(x).__name__, x.hex())
    if isinstance(x, (tuple, list)):
        return (type(x).__name__,) + tuple(_plain(v) for v in x)
    raise TypeError(type(x).__name__)


def _question(op: Op, in_types: Sequence[TensorType], attrs: Mapping[str, Any],
              hint: TensorType | None) -> tuple | None:
    try:
        key = (op, tuple(in_types), tuple((k, _plain(v)) for k, v in sorted(attrs.items())),
               hint)
        hash(key)
    except TypeError:
        return None
    return key


def remembered(infer_type: InferType) -> InferType:
    """``infer_type`` answered from the memo when asked a plain question again."""
    @functools.wraps(infer_type)
    def wrapper(op: Op, in_types: Sequence[TensorType], attrs: Mapping[str, Any],
                out_type_hint: TensorType | None = None) -> TensorType:
        key = _question(op, in_types, attrs, out_type_hint)
        if key is None:
            return infer_type(op, in_types, attrs, out_type_hint)
        t = _KNOWN.get(key)
        if t is None:
            t = infer_type(op, in_types, attrs, out_type_hint)   # an error is never stored
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[key] = t
        return t
    return wrapper
