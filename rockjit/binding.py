"""The resident values a Compiled object runs with (api.py), and which user objects they were
copied from, so a call that passes the same objects again copies nothing."""
from __future__ import annotations

import weakref
from typing import Any, Callable

import jax
import numpy as np

from .errors import TraceError
from .signature import LeafSpec


def _as_param_value(leaf: Any, spec: LeafSpec) -> np.ndarray:
    if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) \
            and leaf.is_fully_addressable and np.dtype(leaf.dtype) == np.dtype(spec.dtype):
        # a jax array is immutable, so its host view can stand in for a copy: on the CPU it
        # is the array's own buffer, read-only, and it outlives the array's delete() and a
        # donation of it (a numpy array, by contrast, may be written in place after binding).
        # A sharded array's host view is a fresh copy, ours to mark read-only.
        arr = np.asarray(leaf)
        arr.setflags(write=False)
        return arr
    arr = np.array(leaf, dtype=spec.dtype, copy=True)
    arr.setflags(write=False)
    return arr


class ResidentBinding:
    """The resident values a Compiled object runs with, and which user objects they came from.

    A call that passes the same objects reuses the copies; other objects (of the same
    signature) are copied again without re-tracing.  In-place writes into a numpy array that
    was already bound are not seen: the copy was taken when it was bound."""

    def __init__(self) -> None:
        self.values: dict[str, np.ndarray] = {}
        self._sources: dict[str, Any] = {}

    @staticmethod
    def _ref(obj: Any) -> Callable[[], Any]:
        try:
            return weakref.ref(obj)
        except TypeError:
            return lambda: obj

    def update(self, items: list[tuple[str, Any, LeafSpec]]) -> bool:
        """Bind (name, leaf, spec) triples; True if any value changed."""
        changed = False
        for name, leaf, spec in items:
            ref = self._sources.get(name)
            if ref is not None and ref() is leaf:
                continue
            if isinstance(leaf, jax.ShapeDtypeStruct):
                raise TraceError(f"resident param {name!r} ({spec}) has no value: it was lowered "
                                 f"from a ShapeDtypeStruct; pass the array when calling")
            self.values[name] = _as_param_value(leaf, spec)
            self._sources[name] = self._ref(leaf)
            changed = True
        return changed
