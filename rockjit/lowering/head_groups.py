"""Which groups of heads a host re-tile of attention's K or V into the weight layout runs as
(strided_conversion._strided_weight): one host step per core's block of heads, each read on
the core that made its heads and written where they are multiplied
(context_copies.next_readers), or one step for all of them, as the cost model prices it."""
from __future__ import annotations

import math


def head_groups(shape: list[int], keep: list[int], batch_axes: int, esize: int, cores: int
                ) -> list[tuple[int, int]]:
    """Index ranges of the first kept axis, one per core, where that axis is a batch axis
    (attention's heads) and the cost model prices the groups below one step
    (``groups_pay``); else the whole axis. One range on a single core. The ranges are core
    placement's blocks (item i on core i * cores // n: 8 heads as 3, 3, 2), the cores a
    producing matmul with one job per head's columns leaves them on."""
    n = shape[0] if shape else 1
    if not shape or keep[0] >= batch_axes or cores <= 1 or n < 2:
        return [(0, n)]
    g = min(cores, n)
    cuts = [-(-i * n // g) for i in range(g + 1)]
    groups = list(zip(cuts[:-1], cuts[1:]))
    per_head = math.prod(shape[1:]) * esize
    return groups if groups_pay([(h1 - h0) * per_head for h0, h1 in groups]) else [(0, n)]


def leading_range(shape: list[int], lo: int, hi: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(box, first index) of items [lo, hi) of ``shape``'s first axis and all of the others;
    an empty shape is its own whole box."""
    if not shape:
        return (), ()
    return (hi - lo, *shape[1:]), (lo, *[0] * (len(shape) - 1))


def groups_pay(group_bytes: list[int]) -> bool:
    """Whether packing in one host step per group of heads is modelled cheaper than one step
    for all of them (rockjit.cost's host terms). One step runs on the runtime's threads once
    it moves SPLIT_MIN_BYTES (runtime/host_threads.py) but reads every group where one context
    holds them all and writes them there, so all but one group's bytes cross cores twice
    (in to it, out to the cores multiplying by them); the groups cross none, but each may be
    too small to be split over threads. SigLIP-224's K (301 KB in thirds of 100 KB): one
    step; at 1024 tokens (1.6 MB): the groups."""
    from ..cost import calibrated
    from ..runtime.host_threads import DEFAULT_HOST_THREADS, SPLIT_MIN_BYTES

    c = calibrated()

    def pack_s(nb: int) -> float:
        return nb / (c.host_gather_gbps * 1e9 * (DEFAULT_HOST_THREADS if nb >= SPLIT_MIN_BYTES
                                                 else 1))

    total = sum(group_bytes)
    crossing = 2 * (total - max(group_bytes))
    one = pack_s(total) + crossing / (c.host_copy_gbps * 1e9)
    return sum(pack_s(nb) for nb in group_bytes) < one
