"""The runs core placement (resident_placement.place) finds and the image's residency walk
(context_copies.ResidencyWalk) needs again: handed over rather than asked of the builder twice."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .residency_copies import Run

JobRuns = dict[int, tuple[Sequence[Run], Sequence[Run]]]


@dataclass
class WalkRuns:
    """Each job's (reads, writes) in the unplaced space by ``id`` of its JobRef, each host
    step's operand runs by (call, ``id`` of its HostStep), and each buffer's cell size over all
    of them (residency_copies.grains_by_buffer). The walk's steps are the same jobs and host
    steps, reordered (coalesce.py)."""

    jobs: JobRuns = field(default_factory=dict)
    host: dict[tuple[int, int], list[tuple[str, Run]]] = field(default_factory=dict)
    grains: dict[int, int] = field(default_factory=dict)
