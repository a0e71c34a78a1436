"""``rockjit check package.module:make_spec [name=value ...] [--backend sim] [--html out.html]``

Compiles the function of a ``TraceSpec`` (what ``rockjit trace`` takes: the encoders'
``models.whisper:trace_spec`` and friends, or your own) for a backend, runs it on the spec's
example arguments, and prints the per-group accuracy report against the fp32 interpreter
(``rockjit/check.py``): cosine and max relative error per layer group, value ranges, the range
plan's action, and the first group under the threshold.

Arguments the spec leaves abstract (``jax.ShapeDtypeStruct``) are filled with seeded data, so a
model preset runs without a checkpoint: float weights N(0, 1/fan_in) (norm scales 1 + N(0,
0.05^2)), float inputs N(0, 1), integer inputs 1 (a valid token id and an all-ones mask).

    rockjit check models.whisper:trace_spec preset=tiny encoder_layers=2
    rockjit check mypkg.specs:mlp --backend sim --html report.html

Exit status: 0 when every group is at or above the threshold, 3 when one is under it, 1 when
the function cannot be compiled or run, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .common import EXIT_COMPILE_ERROR, EXIT_OK, UsageError, add_verb, parse_assignments
from .trace import trace_spec

EXIT_UNDER_THRESHOLD = 3


def fill_abstract(spec: Any, seed: int = 0) -> tuple:
    """The spec's arguments with every jax.ShapeDtypeStruct leaf replaced by seeded data
    (module docstring)."""
    import jax
    from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

    from models.weights import seeded_tensor

    rng = np.random.default_rng(seed)
    out = []
    for i, arg in enumerate(spec.args):
        if i in spec.static_argnums:
            out.append(arg)
            continue
        resident = i in spec.resident_argnums
        leaves, tree = tree_flatten_with_path(arg)
        filled = []
        for path, leaf in leaves:
            if not isinstance(leaf, jax.ShapeDtypeStruct):
                filled.append(leaf)
                continue
            shape, dt = tuple(leaf.shape), np.dtype(leaf.dtype)
            if not np.issubdtype(dt, np.floating):
                filled.append(np.ones(shape, dt))
            elif resident:
                filled.append(seeded_tensor(keystr(path).rstrip("']"), shape, rng, dt))
            else:
                filled.append(rng.standard_normal(shape).astype(dt))
        out.append(tree_unflatten(tree, filled))
    return tuple(out)


def _abstract_resident(spec: Any, call_args: tuple) -> tuple:
    import jax

    return tuple(jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), a)
                 if i in spec.resident_argnums else a for i, a in enumerate(call_args))


def _run(args: argparse.Namespace) -> int:
    from .. import compile as rj_compile
    from ..errors import RockjitError

    spec = trace_spec(args.target, parse_assignments(args.kwargs))
    if not 0.0 < args.threshold <= 1.0:
        raise UsageError(f"--threshold {args.threshold} must be a cosine in (0, 1]")
    call_args = fill_abstract(spec, args.seed)
    try:
        f = rj_compile(spec.fn, static_argnums=spec.static_argnums,
                       resident_argnums=spec.resident_argnums, backend=args.backend)
        # lowered with the resident weights abstract, so compile() defers the program: the
        # check builds (and runs) only its probe program, the same graph with extra outputs
        compiled = f.lower(*_abstract_resident(spec, call_args)).compile()
        report = compiled.check(*call_args, threshold=args.threshold, by=args.by)
    except (RockjitError, ValueError) as e:
        print(f"rockjit check: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_COMPILE_ERROR
    print(report)
    if args.html is not None:
        args.html.write_text(report.html(), encoding="utf-8")
        print(f"wrote {args.html}")
    return EXIT_OK if report.first_under is None else EXIT_UNDER_THRESHOLD


def register(sub: Any) -> None:
    from ..check import DEFAULT_THRESHOLD

    c = add_verb(sub, "check", "per-layer accuracy of a compiled function against the fp32 "
                               "interpreter")
    c.add_argument("target", help="module:function, a callable returning a "
                                  "rockjit.api.TraceSpec")
    c.add_argument("kwargs", nargs="*", metavar="name=value",
                   help="keyword arguments for the target (Python literals, else strings)")
    c.add_argument("--backend", default="sim", help="backend to check (default: sim)")
    c.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"cosine a group must reach (default {DEFAULT_THRESHOLD})")
    c.add_argument("--by", choices=("auto", "norm", "line"), default="auto",
                   help="grouping: residual stream at each LayerNorm input, or source line")
    c.add_argument("--html", type=Path, metavar="OUT.html",
                   help="also write a self-contained HTML page with an error plot")
    c.add_argument("--seed", type=int, default=0, help="seed for the filled-in arguments")
    c.set_defaults(run=_run)
