"""Graph -> Graph passes over the rockjit IR, registered by name in ``PASSES``."""
from __future__ import annotations

from typing import Callable

from ..graph import Graph
from .canonicalize import canonicalize, cse, dce, simplify
from .constfold import constfold
from .epilogue import fuse_matmul_epilogue
from .fuse import fuse
from .manager import PassManager

PASSES: dict[str, Callable[[Graph], Graph]] = {
    "canonicalize": canonicalize,
    "simplify": simplify,
    "dce": dce,
    "cse": cse,
    "constfold": constfold,
    "fuse": fuse,
    "fuse_epilogue": fuse_matmul_epilogue,
}


def get_pass(name: str) -> Callable[[Graph], Graph]:
    try:
        return PASSES[name]
    except KeyError:
        raise KeyError(f"no pass named {name!r}; known passes: {', '.join(sorted(PASSES))}"
                       ) from None


__all__ = ["PASSES", "PassManager", "get_pass", "canonicalize", "constfold", "dce", "cse",
           "fuse", "fuse_matmul_epilogue", "simplify"]
