"""The IR passes run right after import: canonicalize + constfold, then fusion of composite
activations into ``activation{kind}`` ops (ir/passes/fuse.py).

Position tables (RoPE sin/cos), attention masks and iota-derived values depend only on
shapes, so they fold into constants here and never reach the lowering as computations."""
from __future__ import annotations

from ..ir.graph import Graph


def simplify_after_import(graph: Graph) -> Graph:
    from ..ir.passes import PassManager  # the IR engineer's pass pipeline

    return PassManager(["canonicalize", "constfold", "canonicalize", "fuse"]).run(graph)
