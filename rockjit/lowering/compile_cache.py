"""Per-compile memo: structurally identical layers are planned and emitted once.

The layers of an encoder are structurally identical: the same matmul shapes, the same
element-wise geometries, so a pure function of shapes (``tiling.plan_conv``, the constant-free
emitters) is asked the same question twelve or twenty-two times, and a matmul with resident
weights differs from the previous layer's only in the weight and bias bytes
(``emitters/matmul.build_matmul`` reuses the program and packs its own constants).
``compile_scope()`` opens a memo for one compile (``pipeline.lower_graph``); outside a scope
nothing is cached, and the memo dies with the scope, so memory never grows across compiles.
``ROCKJIT_NO_COMPILE_CACHE=1`` turns it off (the program must be identical either way:
tests/lowering/test_compile_cache.py).

Only functions whose result depends on their key alone may use ``memo``/``memoized``; a
result is shared by every hit, so it must be immutable (frozen dataclasses, tuples).
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
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


def compile_scope_memo() -> dict | None:
    """The open compile's memo (None: no scope, or ROCKJIT_NO_COMPILE_CACHE), for an emitter
    that keeps its own kind of entry (emitters/matmul.py: a program reused with new constants)."""
    return _scope.get()


def memo(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, or its earlier result for ``key`` in the open compile scope. An error it
    raised is raised again (a fresh instance of the same type, arguments and attributes)."""
    cache = _scope.get()
    if cache is None:
        return compute()
    hit = cache.get(key)
    if hit is None:
        try:
            hit = (True, compute())
        except Exception as e:          # noqa: BLE001 -- re-raised below, and on every hit
            # kept without its traceback and chain: only its type, arguments and attributes
            # are raised again, and a kept traceback's frames (this one's ``cache`` and every
            # caller's locals up the stack: the Lowerer, its folded fp32 constants) would form
            # a cycle with this memo that outlives the compile until a full collection
            e.__traceback__ = e.__context__ = e.__cause__ = None
            hit = (False, e)
        cache[key] = hit
    ok, value = hit
    if ok:
        return value
    err: Any = value
    try:
        fresh = type(err)(*err.args)
        fresh.__dict__.update(vars(err))      # attributes set after construction
    except Exception:                         # noqa: BLE001 -- a type that cannot be remade
        raise err from None
    try:
        raise fresh
    finally:
        # the raised exception's traceback holds this frame: a local naming it would be a
        # cycle (frame -> exception -> traceback -> frame) holding every caller's locals
        fresh = err = value = hit = None


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


class _Unkeyable(Exception):
    pass


def _key_of(x: Any) -> Hashable:
    """A key that tells apart every argument value an emitter could treat differently: the
    type is part of it (1, 1.0 and True are equal in Python) and floats go by their bits
    (-0.0 == 0.0). Only plain values, enums, tuples of them and the frozen descriptions named
    in ``_PLAIN`` qualify; anything else (an array, a mutable object) is refused."""
    if x is None or isinstance(x, (bool, int, str, enum.Enum)):
        return (type(x).__name__, x)
    if isinstance(x, float):
        return ("float", x.hex())
    if isinstance(x, tuple):
        return ("tuple",) + tuple(_key_of(v) for v in x)
    if type(x).__name__ in _PLAIN and getattr(type(x), "__dataclass_params__", None) is not None \
            and type(x).__dataclass_params__.frozen:
        return (type(x).__module__, type(x).__qualname__, x)
    raise _Unkeyable(type(x).__name__)


def plain_key(x: Any) -> Hashable | None:
    """``x`` as a memo key (see ``_key_of``), or None when it holds something unkeyable."""
    try:
        key = _key_of(x)
        hash(key)
    except (_Unkeyable, TypeError):
        return None
    return key


# frozen descriptions made of ints, strings and enums only (no float field whose sign could
# hide behind ==): a layout, a chip profile, an address
_PLAIN = frozenset({"CubeLayout", "ChipProfile", "Reloc"})


def memoized(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (a pure emitter: its result depends on its arguments alone and is immutable)
    answered from the compile's memo when called again with the same arguments. Calls with an
    argument ``_key_of`` refuses (an array of constants, say) are computed as usual."""
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        if _scope.get() is None:
            return fn(*args, **kwargs)
        try:
            key = (name, _key_of(args), _key_of(tuple(sorted(kwargs.items()))))
            hash(key)
        except (_Unkeyable, TypeError):
            return fn(*args, **kwargs)
        return memo(key, lambda: fn(*args, **kwargs))
    return wrapper
