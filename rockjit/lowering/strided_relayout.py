"""One-pass host re-layouts: a cube, a weight layout and row-major rows are all affine in the
element indices once an axis that a layout cuts into groups is split into (group, lane), so a
conversion between any two of them is a few strided host ``copy`` steps (rank <= the host
library's MAX_RANK) instead of unpack -> (transpose) -> pack passes over temporaries.

An ``AxisMap`` gives the byte address contribution of one logical axis index ``i``:
``(i // mod) * outer + (i % mod) * inner`` (``mod`` 0: plain ``i * inner``). Each axis of the
iteration is cut into pieces where every modulus that touches it (source's and destination's)
is affine in the piece's digits; the cross product of the pieces of all axes gives the steps.
layouts.py (numpy pack/unpack) is the independent reference these are tested against."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from .layouts import CubeLayout, WeightLayout

MAX_PIECES = 16     # more steps than this: the per-item route is no worse, keep it


@dataclass(frozen=True)
class AxisMap:
    """Byte address of index i along one axis: (i // mod) * outer + (i % mod) * inner."""

    inner: int
    mod: int = 0
    outer: int = 0

    def at(self, i: int) -> int:
        return (i // self.mod) * self.outer + (i % self.mod) * self.inner if self.mod else i * self.inner


@dataclass(frozen=True)
class CopyPiece:
    """One strided copy: ``shape`` iterated, element offsets and element strides per side."""

    shape: tuple[int, ...]
    src_offset: int
    src_strides: tuple[int, ...]
    dst_offset: int
    dst_strides: tuple[int, ...]


def cube_axis_maps(layout: CubeLayout, roles: Sequence[str], strides: Sequence[int]) -> list[AxisMap]:
    """The axes of a cube view (roles b/h/w/c; byte strides of its b axes)."""
    es = layout.esize
    out = []
    for r, s in zip(roles, strides):
        if r == "b":
            out.append(AxisMap(int(s)))
        elif r == "h":
            out.append(AxisMap(layout.line_stride))
        elif r == "w":
            out.append(AxisMap(layout.c2 * es))
        elif r == "c":
            out.append(AxisMap(es, layout.c2, layout.surf_stride))
        else:
            raise ValueError(f"cube axis role {r!r}")
    return out


def weight_axis_maps(layout: WeightLayout, batch: Sequence[int], stride: int) -> list[AxisMap]:
    """The axes (batch..., N, K) of 1x1 weights [N/NG][K/KG][NG][KG] items ``stride`` bytes
    apart (batch row-major)."""
    if layout.kh != 1 or layout.kw != 1:
        raise ValueError("strided weight re-layout covers 1x1 kernels only")
    es = layout.dtype.itemsize
    ng, kg = layout.n_group, layout.k_group
    maps, acc = [], stride
    for n in reversed(tuple(batch)):
        maps.append(AxisMap(acc))
        acc *= int(n)
    maps.reverse()
    maps.append(AxisMap(kg * es, ng, layout.padded_channels * ng * es))
    maps.append(AxisMap(es, kg, ng * kg * es))
    return maps


def row_axis_maps(shape: Sequence[int], esize: int) -> list[AxisMap]:
    out, acc = [], esize
    for n in reversed(tuple(shape)):
        out.append(AxisMap(acc))
        acc *= int(n)
    return out[::-1]


def _axis_pieces(extent: int, mods: list[int], first: int = 0
                 ) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """(first index, [(count, weight) digits]) pieces covering first..first+extent, inside
    each of which every modulus in ``mods`` cuts the index affinely (a digit of weight below
    a modulus never leaves one group of it); None when the moduli do not nest."""
    mods = sorted(set(m for m in mods if m > 1))
    if any(b % a for a, b in zip(mods, mods[1:])):
        return None

    def go(lo: int, hi: int, ms: list[int]) -> list:
        if lo >= hi:
            return []
        if not ms:
            return [(lo, [(hi - lo, 1)])]
        m = ms[-1]
        a, b = -(-lo // m) * m, hi // m * m
        if a >= b:              # inside one group of m (or straddling one boundary)
            return go(lo, min(hi, a), ms[:-1]) + go(max(lo, a), hi, ms[:-1]) if a < hi \
                else go(lo, hi, ms[:-1])
        digits, w = [((b - a) // m, m)], m
        for small in reversed([1] + ms[:-1]):
            digits.append((w // small, small))
            w = small
        return go(lo, a, ms[:-1]) + [(a, digits)] + go(b, hi, ms[:-1])

    return go(first, first + extent, mods)


def axis_pieces(extent: int, mods: list[int]) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """The pieces of one axis read through several maps (see _axis_pieces)."""
    return _axis_pieces(extent, mods)


def axis_cuts(extent: int, mod: int) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """The pieces of one axis read through one map (see _axis_pieces)."""
    return _axis_pieces(extent, [mod])


def digit_stride(m: AxisMap, w: int) -> int:
    """Byte step of a digit of index weight ``w`` inside a piece whose start is aligned."""
    if not m.mod or w < m.mod:
        return w * m.inner
    return (w // m.mod) * m.outer


def _merge(shape, a, b) -> tuple[list[int], list[int], list[int]]:
    """Drop unit dims and fuse neighbours that step as one (both sides' outer == inner * n)."""
    dims = [(n, x, y) for n, x, y in zip(shape, a, b) if n != 1]
    out: list[list[int]] = []
    for n, x, y in dims:
        if out and out[-1][1] == x * n and out[-1][2] == y * n:
            out[-1] = [out[-1][0] * n, x, y]
        else:
            out.append([n, x, y])
    if not out:
        out = [[1, 1, 1]]
    return [d[0] for d in out], [d[1] for d in out], [d[2] for d in out]


def relayout_pieces(shape: Sequence[int], src: Sequence[AxisMap], dst: Sequence[AxisMap],
                    src_esize: int, dst_esize: int, max_rank: int,
                    first: Sequence[int] | None = None) -> list[CopyPiece] | None:
    """The strided copies moving every element of the box ``shape`` (from index ``first``,
    default 0) from its ``src`` address to its ``dst`` address (bytes; element offsets and
    strides in the result). None when no cut of the axes fits ``max_rank`` dims in at most
    MAX_PIECES steps."""
    per_axis = []
    for a, (n, s, d) in enumerate(zip(shape, src, dst)):
        p = _axis_pieces(int(n), [s.mod, d.mod], int(first[a]) if first else 0)
        if p is None:
            return None
        per_axis.append(p)
    combos = list(itertools.product(*per_axis))
    if len(combos) > MAX_PIECES:
        return None

    pieces = []
    for combo in combos:
        dims, so, do = [], 0, 0
        for (start, digits), s, d in zip(combo, src, dst):
            so += s.at(start)
            do += d.at(start)
            dims += [(cnt, digit_stride(s, w), digit_stride(d, w)) for cnt, w in digits]
        if any(x % src_esize for _, x, _ in dims) or any(y % dst_esize for _, _, y in dims) \
                or so % src_esize or do % dst_esize:
            return None
        # walk the destination in address order (writes stream; the source is the gather)
        dims.sort(key=lambda d: (-abs(d[2]), -abs(d[1])))
        shp, ss, ds = _merge([c for c, _, _ in dims], [x // src_esize for _, x, _ in dims],
                             [y // dst_esize for _, _, y in dims])
        if len(shp) > max_rank:
            return None
        pieces.append(CopyPiece(tuple(shp), so // src_esize, tuple(ss), do // dst_esize, tuple(ds)))
    return pieces
