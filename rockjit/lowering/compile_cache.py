"""Per-compile memo for the lowering's pure planning functions (tile plans and the like).

The layers of an encoder are structurally identical: the same matmul shapes, the same
element-wise geometries, so a pure function of shapes (``tiling.plan_conv``) is asked the
same question twelve or twenty-two times. ``compile_scope()`` opens a memo for one compile
(``pipeline.lower_graph``); outside a scope nothing is cached, and the memo dies with the
scope, so memory never grows across compiles. ``ROCKJIT_NO_COMPILE_CACHE=1`` turns it off
(the program must be identical either way: tests/lowering/test_compile_cache.py).

Only functions whose result depends on their (hashable) key alone may use ``memo``; a
result is shared by every hit, so it must be immutable (frozen dataclasses, tuples).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Hashable, Iterator, TypeVar

import numpy as np

from .. import debugflags

T = TypeVar("T")

_scope: contextvars.ContextVar[dict | None] = contextvars.ContextVar("rockjit_compile_cache",
                                                                      default=None)


@contextlib.contextmanager
def compile_scope() -> Iterator[dict]:
    """A memo for the compile run inside the ``with`` block (nested scopes share the outer)."""
    outer = _scope.get()
    if outer is not None:
        yield outer
        return
    memo_dict: dict = {}
    token = _scope.set(None if debugflags.enabled(debugflags.NO_COMPILE_CACHE) else memo_dict)
    try:
        yield memo_dict
    finally:
        _scope.reset(token)


def memo(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, or its earlier result for ``key`` in the open compile scope. An error it
    raised is raised again (a fresh instance of the same type and arguments)."""
    cache = _scope.get()
    if cache is None:
        return compute()
    hit = cache.get(key)
    if hit is None:
        try:
            hit = (True, compute())
        except Exception as e:          # noqa: BLE001 -- re-raised below, and on every hit
            hit = (False, e)
        cache[key] = hit
    ok, value = hit
    if ok:
        return value
    err: Any = value
    raise type(err)(*err.args)


def memo_of_array(tag: str, a: Any, compute: Callable[[], T], *extra: Hashable) -> T:
    """``compute()`` (a function of the contents of array ``a`` and ``extra``), memoized per
    compile by ``a``'s identity: the range plan and the weight checks scan the same resident
    weights several times. Only a read-only ndarray qualifies (its contents cannot change
    under the memo); the memo holds a reference to it, so its id is not reused meanwhile."""
    cache = _scope.get()
    if cache is None or not isinstance(a, np.ndarray) or a.flags.writeable:
        return compute()
    key = (tag, id(a), extra)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = (a, compute())
    return hit[1]
