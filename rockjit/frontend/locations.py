"""Source locations of jaxpr equations: the user's file and line, never a jax-internal frame."""
from __future__ import annotations

import functools
from typing import Any, Callable

from jax._src import source_info_util

from ..ir.graph import Loc


def user_loc(source_info: Any) -> Loc | None:
    """The innermost user frame of an equation's traceback, or None if it has none.

    jax 0.10.2's ``user_frame`` takes the traceback, not the ``SourceInfo`` (older releases took
    the ``SourceInfo``).  Equations inside jax-internal jitted helpers (``jnp.take``'s ``_take``,
    ``jax.nn.relu``) carry no user frame at all; the caller then uses the enclosing call's loc.
    """
    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return None
    frame = source_info_util.user_frame(tb)
    if frame is None:
        return None
    return Loc(frame.file_name, int(frame.start_line))


def _underlying(fn: Any) -> Any:
    """The plain function behind decorators and functools.partial layers."""
    seen = 0
    while seen < 32:
        seen += 1
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is None:
            return fn
        fn = wrapped
    return fn


def function_name(fn: Callable[..., Any]) -> str:
    name = getattr(_underlying(fn), "__name__", "")
    return name if isinstance(name, str) and name.isidentifier() else "main"


def function_loc(fn: Callable[..., Any]) -> Loc | None:
    """Where ``fn`` is defined; the loc of nodes that no equation owns (params, consts)."""
    target = _underlying(fn)
    code = getattr(target, "__code__", None)
    if code is None:  # a callable object: locate its __call__
        code = getattr(getattr(type(target), "__call__", None), "__code__", None)
    if code is None:
        return None
    return Loc(code.co_filename, int(code.co_firstlineno))


def jaxpr_loc(jaxpr: Any) -> Loc | None:
    """Where the traced function is defined, from the jaxpr's debug info
    (``func_src_info`` reads "name at file:line" in jax 0.10.2)."""
    info = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None)
    if not info or " at " not in info:
        return None
    file, sep, line = info.rpartition(" at ")[2].rpartition(":")
    if not sep or not line.isdigit():
        return None
    return Loc(file, int(line))
