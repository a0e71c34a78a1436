"""What every ``rockjit`` verb shares: exit codes, the one-line usage error, target loading and
``name=value`` arguments."""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from typing import Any, Callable, Sequence

EXIT_OK = 0
EXIT_COMPILE_ERROR = 1   # the input was understood but rockjit cannot do it (message says why)
EXIT_USAGE = 2           # bad target string, import failure, bad file, target of the wrong kind


class UsageError(ValueError):
    """A one-line message for the user; the command exits with EXIT_USAGE."""





def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_target(target: str, what: str = "a callable") -> Callable[..., Any]:
    """``package.module:attr.path`` -> the object, resolving modules from the current directory
    first, as ``python -m`` does."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"target {target!r} must look like 'package.module:function'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any failure while importing the user's module is a usage error
        raise UsageError(f"cannot import module {module_name!r}: {one_line(e)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{target} is a {type(obj).__name__}, not {what}")
    return obj


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    """``["layers=2", "preset=tiny"]`` -> ``{"layers": 2, "preset": "tiny"}``: values are Python
    literals where they parse as one, else strings.  Bad pairs raise a one-line usage error."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"argument {pair!r} must look like name=value (e.g. "
                             f"num_hidden_layers=2)")
        if name in out:
            raise UsageError(f"argument {name!r} is given twice")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text  # a bare word such as preset=tiny
    return out


def add_verb(sub: Any, name: str, help: str, description: str | None = None
             ) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description or help)
