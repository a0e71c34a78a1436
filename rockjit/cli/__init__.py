"""The ``rockjit`` command line (also ``python -m rockjit``): one module per verb family, each
with ``register(subparsers)`` that adds its verbs and sets ``run`` on them."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import bundle, check, convert, trace
from .common import EXIT_USAGE, UsageError, parse_assignments

__all__ = ["main", "parse_assignments"]

VERB_MODULES = (trace, bundle, convert, check)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rockjit", description="rockjit: compile JAX functions for "
                                "the RK3588 NPU")
    sub = p.add_subparsers(dest="command", required=True, metavar="VERB")
    for module in VERB_MODULES:
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as e:
        print(f"rockjit {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
