"""Run a pipeline of passes, verifying the graph before the first and after every pass."""
from __future__ import annotations

from typing import Callable, Sequence, Union

from ...errors import VerifyError
from ..graph import Graph, Node
from ..verifier import verify as verify_graph

Pass = Callable[[Graph], Graph]


class PassManager:
    def __init__(self, passes: Sequence[Union[str, Pass]], verify: bool = True) -> None:
        from . import get_pass

        self.passes: list[tuple[str, Pass]] = [
            (p, get_pass(p)) if isinstance(p, str) else (getattr(p, "__name__", repr(p)), p)
            for p in passes]
        self.verify = verify

    def _check(self, graph: Graph, where: str, typed: dict[int, Node]) -> None:
        if self.verify:
            try:
                verify_graph(graph, typed)
            except VerifyError as e:
                raise VerifyError(f"{where}: {e}") from None

    def run(self, graph: Graph) -> Graph:
        typed: dict[int, Node] = {}     # nodes whose type rule passed (verifier.verify)
        self._check(graph, "the graph given to the pass pipeline is invalid", typed)
        for name, p in self.passes:
            graph = p(graph)
            if not isinstance(graph, Graph):
                raise TypeError(f"pass {name!r} returned {type(graph).__name__}, not a Graph")
            self._check(graph, f"after pass {name!r}", typed)
        return graph

    __call__ = run
