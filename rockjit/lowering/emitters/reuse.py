"""Which tiles of a conv plan share one job with a CBUF operand kept resident (issue 9).

The CNA keeps the feature tile (CNA_CBUF_CON0 DATA_REUSE) or the weight tile (WEIGHT_REUSE) of
the previous task of the same job instead of fetching it again (notes: encodings/cbuf-reuse.md:
bit 12 / bit 13; one operand at a time; the tile loop is reordered so the shared operand is
adjacent). A group is a run of (row tile, kernel tile) pairs of one image that share the row
tile ("data": the feature of each K step is fetched once for the whole run) or the kernel tile
("weight": the weights of each K step once). Inside a group the tasks run K step by K step,
every tile of the group per step, so each task after the first of a step reuses; the arithmetic
of every output element is unchanged (the same K steps in the same order).

The choice: for each mode and number of groups per chain, the jobs' DMA bytes (plus one CBUF of
traffic per job, tiling.py's weight of a dispatch) spread over the cores largest-first; the
least loaded critical core wins, then the fewest bytes (uneven jobs lose there by themselves).
A plan with at least as many tiles as cores keeps at least as many jobs, so placement
(resident_placement.py) can still spread them over every core.
"""
from __future__ import annotations

from ..compile_cache import memo
from ..profile import ChipProfile
from ..tiling import KACC_DPU, ConvPlan

Tile = tuple[int, int]          # (row tile index, kernel tile index)
Group = tuple[str, tuple[Tile, ...]]  # ("none" | "data" | "weight", its tiles in order)


def _parts(n: int, g: int) -> list[range]:
    base, extra = divmod(n, g)
    out, s = [], 0
    for i in range(g):
        size = base + (i < extra)
        out.append(range(s, s + size))
        s += size
    return out


def _critical(loads: list[float], cores: int) -> float:
    per = [0.0] * max(1, cores)
    for x in sorted(loads, reverse=True):
        per[per.index(min(per))] += x
    return max(per)


def reuse_groups(plan: ConvPlan, profile: ChipProfile, images: int = 1) -> tuple[Group, ...]:
    """The jobs of one image of ``plan`` as groups of tiles (module docstring); ``images``
    copies of them share the step's cores. Decided once per plan in a compile (every image
    and every layer asks again)."""
    return memo(("reuse_groups", plan, profile, images),
                lambda: _reuse_groups(plan, profile, images))


class TileBytes:
    """The DMA bytes of a plan's tiles (all K steps): what a group of tiles moves when it keeps
    one operand in the CBUF (module docstring). tile_choice.py prices plans with it."""

    def __init__(self, plan: ConvPlan, profile: ChipProfile) -> None:
        s = plan.shape
        esize = profile.input(s.in_dtype).esize
        self.depthwise = s.depthwise
        ch = sum(c.size for c in plan.channels)
        if s.depthwise:
            # a channel tile reads its own channels of the feature and its own kernels
            self.feat = [[r.in_rows * s.width * k.size * esize for k in plan.kernels]
                         for r in plan.rows]
            self.wt = [k.size * s.kh * s.kw * esize for k in plan.kernels]
        else:
            self.feat = [[r.in_rows * s.width * ch * esize] * len(plan.kernels)
                         for r in plan.rows]
            self.wt = [k.size * s.kh * s.kw * ch * esize for k in plan.kernels]
        out_e = profile.output(s.in_dtype, s.out_dtype).esize
        # the output, and the fp32 partials of a DPU K accumulation (each written and read back)
        part = 2 * 4 * (plan.k_steps - 1) if plan.kacc == KACC_DPU else 0
        self.other = [[r.out_rows * s.out_w * k.size * (out_e + part) for k in plan.kernels]
                      for r in plan.rows]

    def group(self, mode: str, tiles: tuple[Tile, ...]) -> int:
        """Bytes of one group: the shared operand once ("data": the row tile's feature,
        "weight": the kernel tile's weights; "none": a single tile reads both)."""
        r0, j0 = tiles[0]
        shared = self.wt[j0] if mode == "weight" else self.feat[r0][j0]
        return shared + sum(self.other[r][j] + (self.feat[r][j] if mode == "weight" else self.wt[j])
                            for r, j in tiles)


def single_groups(plan: ConvPlan) -> tuple[Group, ...]:
    """One job per tile, no operand kept (convs, and plans with nothing to share)."""
    return tuple(("none", ((r, j),)) for r in range(len(plan.rows))
                 for j in range(len(plan.kernels)))


def _reuse_groups(plan: ConvPlan, profile: ChipProfile, images: int) -> tuple[Group, ...]:
    s = plan.shape
    nr, nn = len(plan.rows), len(plan.kernels)
    single = single_groups(plan)
    p = profile.input(s.in_dtype)
    if s.depthwise or not p.chainable or nr * nn == 1:
        return single
    tb = TileBytes(plan, profile)
    job = profile.cbuf_bytes
    # a group's load is the CBUF weight of its job plus TileBytes.group; the unshared part
    # summed by prefix along each chain, so a grouping is priced without building it
    pre = {"data": [_prefix([tb.other[r][j] + tb.wt[j] for j in range(nn)]) for r in range(nr)],
           "weight": [_prefix([tb.other[r][j] + tb.feat[r][j] for r in range(nr)])
                      for j in range(nn)]}
    shared = {"data": [tb.feat[r][0] for r in range(nr)], "weight": tb.wt}

    best: tuple[tuple[float, float], str, int] | None = None
    for mode, chains, length in (("data", nr, nn), ("weight", nn, nr)):
        for g in range(1, length + 1):
            if chains * g * images < min(profile.cores, nr * nn * images):
                continue        # placement keeps a job per core to spread where it can
            parts = _parts(length, g)
            loads = [job + shared[mode][c] + pre[mode][c][p_.stop] - pre[mode][c][p_.start]
                     for c in range(chains) for p_ in parts]
            key = (_critical(loads * images, profile.cores), sum(loads))
            if best is None or key < best[0]:
                best = (key, mode, g)
    assert best is not None
    _, mode, g = best
    chains, length = (nr, nn) if mode == "data" else (nn, nr)
    groups: list[Group] = []
    for c in range(chains):
        for part_ in _parts(length, g):
            tiles = tuple((c, i) if mode == "data" else (i, c) for i in part_)
            groups.append((mode if len(tiles) > 1 else "none", tiles))
    return tuple(groups)


def _prefix(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out
