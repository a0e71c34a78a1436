"""What the lowering driver produces: buffers, placed calls and graph boundaries (the input
of the memory plan and the image builder, image_builder.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.graph import Graph, Value
from .partition import Decision
from .profile import ChipProfile
from .rules.base import NoNpuForm, OpCall, Tensor


@dataclass
class Buf:
    """A logical buffer: arena (placed by liveness), weights (uploaded once) or io."""

    id: int
    size: int
    kind: str                      # "arena" | "weights"
    name: str = ""
    data: np.ndarray | None = None
    pinned: bool = False
    zero: bool = False             # upload zeros once (a must-stay-zero tail lives here)
    align: int = 64
    first: int = 1 << 60
    last: int = -1


@dataclass
class PlacedCall:
    call: OpCall
    binding: dict[str, tuple[int, int]]   # buffer name -> (Buf id, offset); regcmd excluded
    group: int                            # parallel group (calls that may merge their steps)
    node: str


@dataclass
class Boundary:
    """A graph input or output and the row-major tensor that holds it."""

    index: int
    value: Value
    tensor: Tensor


@dataclass
class LoweredGraph:
    graph: Graph
    profile: ChipProfile
    bufs: list[Buf]
    calls: list[PlacedCall]
    inputs: list[Boundary]
    outputs: list[Boundary]
    decisions: list[Decision]
    retiles: int = 0
    groups: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    range_plan: Any = None         # range_plan.RangePlan of ``graph`` (the rewritten graph)


class ConversionError(NoNpuForm):
    pass

