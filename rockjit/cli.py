"""The ``rockjit`` command line.

    rockjit trace package.module:make_spec [name=value ...] [--stats]

``make_spec`` is a callable returning a ``rockjit.api.TraceSpec``; the command traces it and
prints the IR (after import and constant folding).  ``name=value`` pairs are passed to it as
keyword arguments (a config field, a sequence length), so one spec function serves every size:

    rockjit trace models.whisper:trace_spec preset=tiny
    rockjit trace models.siglip:trace_spec image_size=512 num_hidden_layers=2

A value is read as a Python literal (``3``, ``0.5``, ``True``, ``(1, 2)``) and otherwise kept as
a string (``preset=tiny``).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from typing import Any, Callable, Mapping, Sequence

EXIT_OK = 0
EXIT_COMPILE_ERROR = 1   # the target traced but rockjit cannot compile it (message says why)
EXIT_USAGE = 2           # bad target string, import failure, target of the wrong kind


class _UsageError(ValueError):
    """A one-line message for the user; the command exits with EXIT_USAGE."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _load_target(target: str) -> Callable[[], Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise _UsageError(f"target {target!r} must look like 'package.module:function'")
    # Like `python -m`, resolve modules relative to the current directory first.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any failure while importing the user's module is a usage error
        raise _UsageError(f"cannot import module {module_name!r}: {_one_line(e)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise _UsageError(f"{target} is a {type(obj).__name__}, not a callable returning a "
                          f"TraceSpec")
    return obj


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    """``["layers=2", "preset=tiny"]`` -> ``{"layers": 2, "preset": "tiny"}``: values are Python
    literals where they parse as one, else strings.  Bad pairs raise a one-line usage error."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise _UsageError(f"argument {pair!r} must look like name=value (e.g. "
                              f"num_hidden_layers=2)")
        if name in out:
            raise _UsageError(f"argument {name!r} is given twice")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text  # a bare word such as preset=tiny
    return out


def _trace_spec(target: str, kwargs: Mapping[str, Any]) -> Any:
    from .api import TraceSpec

    make = _load_target(target)
    try:
        spec = make(**kwargs)
    except (TypeError, ValueError) as e:
        # A wrong keyword or a value the spec function refuses: the user's command line is
        # at fault, and the function's own message says which part.
        given = " ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
        raise _UsageError(f"{target} cannot be called with {given}: {_one_line(e)}") from None
    if not isinstance(spec, TraceSpec):
        raise _UsageError(f"{target}() returned {type(spec).__name__}, expected "
                          f"rockjit.api.TraceSpec(fn, args, ...)")
    return spec


def _format_stats(counts: dict[str, int]) -> str:
    width = max((len(k) for k in counts), default=0)
    lines = [f"{op:<{width}}  {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                         kv[0]))]
    lines.append(f"{'total':<{width}}  {sum(counts.values())}")
    return "\n".join(lines)


def _cmd_trace(args: argparse.Namespace) -> int:
    from .errors import RockjitError

    spec = _trace_spec(args.target, parse_assignments(args.kwargs))
    try:
        lowered = spec.lower()
    except RockjitError as e:
        print(f"rockjit trace: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_COMPILE_ERROR
    sys.stdout.write(lowered.as_text())
    if args.stats:
        print("\n# op counts")
        print(_format_stats(lowered.graph.op_counts()))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rockjit", description="rockjit: compile JAX functions for "
                                "the RK3588 NPU")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="trace a function and print its rockjit IR")
    t.add_argument("target", help="module:function, a callable returning a "
                                  "rockjit.api.TraceSpec")
    t.add_argument("kwargs", nargs="*", metavar="name=value",
                   help="keyword arguments for the target (Python literals, else strings)")
    t.add_argument("--stats", action="store_true", help="also print the count of each IR op")
    t.set_defaults(run=_cmd_trace)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except _UsageError as e:
        print(f"rockjit {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
