"""``rockjit trace package.module:make_spec [name=value ...] [--stats]``

``make_spec`` is a callable returning a ``rockjit.api.TraceSpec``; the verb traces it and
prints the IR (after import and constant folding).  ``name=value`` pairs are passed to it as
keyword arguments (a config field, a sequence length), so one spec function serves every size:

    rockjit trace models.whisper:trace_spec preset=tiny
    rockjit trace models.siglip:trace_spec image_size=512 num_hidden_layers=2

A value is read as a Python literal (``3``, ``0.5``, ``True``, ``(1, 2)``) and otherwise kept as
a string (``preset=tiny``).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping

from .common import (EXIT_COMPILE_ERROR, EXIT_OK, UsageError, add_verb, load_target, one_line,
                     parse_assignments)


def trace_spec(target: str, kwargs: Mapping[str, Any]) -> Any:
    """Call the ``module:function`` spec factory with ``kwargs``; a usage error if it refuses
    them or returns something other than a TraceSpec."""
    from ..api import TraceSpec

    make = load_target(target, "a callable returning a TraceSpec")
    try:
        spec = make(**kwargs)
    except (TypeError, ValueError) as e:
        # A wrong keyword or a value the spec function refuses: the user's command line is
        # at fault, and the function's own message says which part.
        given = " ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
        raise UsageError(f"{target} cannot be called with {given}: {one_line(e)}") from None
    if not isinstance(spec, TraceSpec):
        raise UsageError(f"{target}() returned {type(spec).__name__}, expected "
                         f"rockjit.api.TraceSpec(fn, args, ...)")
    return spec


def _format_stats(counts: dict[str, int]) -> str:
    width = max((len(k) for k in counts), default=0)
    lines = [f"{op:<{width}}  {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                         kv[0]))]
    lines.append(f"{'total':<{width}}  {sum(counts.values())}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from ..errors import RockjitError

    spec = trace_spec(args.target, parse_assignments(args.kwargs))
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


def register(sub: Any) -> None:
    t = add_verb(sub, "trace", "trace a function and print its rockjit IR")
    t.add_argument("target", help="module:function, a callable returning a "
                                  "rockjit.api.TraceSpec")
    t.add_argument("kwargs", nargs="*", metavar="name=value",
                   help="keyword arguments for the target (Python literals, else strings)")
    t.add_argument("--stats", action="store_true", help="also print the count of each IR op")
    t.set_defaults(run=_run)
