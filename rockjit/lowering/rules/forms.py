"""Shape algebra on storage forms: which reshapes/transposes/slices are views (no byte moves).

Row-major tensors: every reshape is a view; a slice over the leading axes is a view.
Cubes: unit axes come and go freely; the H axis (or a batch axis) may be split into a batch
axis and a smaller H (stride = rows x line stride); the C axis may be split into (batch, C')
when C' is a whole number of channel groups (stride = C'/C2 surfaces: attention's head split,
notes: encodings/cross-op-chaining.md); the inverse merges hold when the strides line up; a
transpose permutes the roles.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..compile_cache import memo
from ..layouts import CubeLayout
from .base import CubeForm, Form, RowForm

DEFAULT_ROLES = {1: ("c",), 2: ("h", "c")}


def default_roles(rank: int) -> tuple[str, ...]:
    if rank in DEFAULT_ROLES:
        return DEFAULT_ROLES[rank]
    return ("b",) * (rank - 2) + ("h", "c")


def cube_form(layout: CubeLayout, shape: tuple[int, ...],
              roles: tuple[str, ...] | None = None, item_stride: int | None = None) -> CubeForm:
    """The form of a value of ``shape`` stored as ``layout`` with ``roles`` (default: matrix
    rows in H, columns in C, leading axes batch). Batch axes step by ``item_stride`` bytes per
    cube (contiguous items, an emitter's batch) or, without it, are folded into H."""
    shape = tuple(shape)
    roles = roles or default_roles(len(shape))
    if item_stride is not None and "b" in roles:
        strides, acc = [], item_stride
        for r, n in reversed(list(zip(roles, shape))):
            if r == "b":
                strides.append(acc)
                acc *= n
            else:
                strides.append(0)
        return CubeForm(layout, roles, tuple(reversed(strides)), shape)
    if "b" in roles and "h" in roles:
        # leading batch axes folded into H: stride = the rows below them x line stride
        strides = []
        h = shape[roles.index("h")]
        below = h
        for r, n in reversed(list(zip(roles, shape))):
            if r == "b":
                strides.append(below * layout.line_stride)
                below *= n
            else:
                strides.append(0)
        return CubeForm(layout, roles, tuple(reversed(strides)), shape)
    return CubeForm(layout, roles, (0,) * len(shape), shape)


def _drop_units(f: CubeForm) -> CubeForm:
    # a unit axis addresses one element whatever its role (a 1-row matrix's H of extent 1,
    # M = 1): it moves no byte, so a reshape may drop it and re-add units as batch axes
    keep = [i for i, n in enumerate(f.shape) if n != 1]
    return CubeForm(f.layout, tuple(f.roles[i] for i in keep), tuple(f.strides[i] for i in keep),
                    tuple(f.shape[i] for i in keep))


def reshape(form: Form, shape: tuple[int, ...]) -> Form | None:
    """``form`` seen with a new logical shape, or None when that is not a view."""
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != math.prod(int(d) for d in form.shape):
        return None
    if isinstance(form, RowForm):
        return RowForm(form.dtype, shape)
    if shape == form.shape:
        return form
    # a pure function of the form and the shape, asked again by every layer: once per compile
    return memo(("cube_reshape", form, shape), lambda: _cube_reshape(form, shape))


def _cube_reshape(form: CubeForm, shape: tuple[int, ...]) -> CubeForm | None:
    src = _drop_units(form)
    tgt = [n for n in shape if n != 1]
    # walk both shapes, matching groups of equal products
    roles, strides, sizes = [], [], []
    i = j = 0
    s_axes = list(zip(src.roles, src.strides, src.shape))
    while i < len(s_axes) or j < len(tgt):
        if i >= len(s_axes) or j >= len(tgt):
            return None
        r, st, n = s_axes[i]
        if n == tgt[j]:
            roles.append(r), strides.append(st), sizes.append(n)
            i += 1
            j += 1
            continue
        if n > tgt[j]:
            # split source axis n into tgt[j] x (rest...) : the inner part keeps the role
            prod, k = 1, j
            while k < len(tgt) and prod < n:
                prod *= tgt[k]
                k += 1
            if prod != n:
                return None
            parts = tgt[j:k]
            inner = parts[-1]
            unit = _inner_unit(form.layout, r, st, inner)
            if unit is None:
                return None
            acc = unit
            new = []
            for p in reversed(parts[:-1]):
                new.append(("b", acc, p))
                acc *= p
            for rr, ss, nn in reversed(new):
                roles.append(rr), strides.append(ss), sizes.append(nn)
            # the inner piece keeps the role (a smaller H or C extent, or the same batch stride)
            roles.append(r), strides.append(st if r == "b" else 0), sizes.append(inner)
            i += 1
            j = k
            continue
        # merge source axes into one target axis
        prod, k = 1, i
        while k < len(s_axes) and prod < tgt[j]:
            prod *= s_axes[k][2]
            k += 1
        if prod != tgt[j]:
            return None
        group = s_axes[i:k]
        inner_r, inner_st, inner_n = group[-1]
        unit = _inner_unit(form.layout, inner_r, inner_st, inner_n)
        if unit is None:
            return None
        acc = unit
        for r2, st2, n2 in reversed(group[:-1]):
            if r2 != "b" or st2 != acc:
                return None
            acc *= n2
        roles.append(inner_r), strides.append(inner_st), sizes.append(tgt[j])
        i = k
        j += 1
    if "h" in roles and roles.count("h") > 1 or roles.count("c") > 1:
        return None
    out_roles, out_strides = [], []
    it = iter(zip(roles, strides, sizes))
    for n in shape:
        if n == 1:
            out_roles.append("b"), out_strides.append(0)
        else:
            r, st, _ = next(it)
            out_roles.append(r), out_strides.append(st)
    extents = {r: n for r, n in zip(roles, sizes) if r != "b"}
    old = dict(zip(("h", "w", "c"), form.hwc()))
    lay = form.layout
    # a split or merged H/C axis changes the per-cube extent; strides stay as stored
    ch = extents.get("c", 1) if extents.get("c", 1) != old["c"] else lay.channels
    hh = extents.get("h", 1) if extents.get("h", 1) != old["h"] else lay.height
    if (ch, hh) != (lay.channels, lay.height):
        try:
            lay = CubeLayout(hh, lay.width, ch, lay.c2, lay.dtype, lay.line_stride, lay.surf_stride)
        except Exception:
            return None
    if not _fits(lay, extents):
        return None
    return CubeForm(lay, tuple(out_roles), tuple(out_strides), shape)


def _inner_unit(layout: CubeLayout, role: str, stride: int, inner: int) -> int | None:
    """Byte stride of one step of the axis just outside an inner piece of ``inner`` elements
    of an axis with ``role``; None when such a split is not a view."""
    if role == "b":
        return stride * inner
    if role == "h":
        return inner * layout.line_stride
    if role == "w":
        return None  # splitting W would need a line stride per piece
    if role == "c":
        if inner % layout.c2:
            return None
        return (inner // layout.c2) * layout.surf_stride
    return None


def _fits(layout: CubeLayout, extents: dict[str, int]) -> bool:
    return (extents.get("h", 1) <= layout.height and extents.get("w", 1) <= layout.width
            and extents.get("c", 1) <= layout.padded_channels)


def transpose(form: Form, perm: tuple[int, ...]) -> Form | None:
    if isinstance(form, RowForm):
        if tuple(perm) == tuple(range(len(perm))):
            return form
        # a permutation that only moves unit axes keeps row-major order: the non-unit axes
        # must keep their relative order (compare axis numbers, not extents: a square
        # matrix transposed has the same extents in a different order)
        moved = [p for p in perm if form.shape[p] != 1]
        if moved == sorted(moved):
            return RowForm(form.dtype, tuple(form.shape[p] for p in perm))
        return None
    return form.permuted(perm)


def slice_form(form: Form, start: tuple[int, ...], limit: tuple[int, ...],
               strides: tuple[int, ...]) -> tuple[Form, int] | None:
    """A strided-1 slice as a view: (form, byte offset) or None."""
    if any(s != 1 for s in strides):
        return None
    shape = tuple(l - s for s, l in zip(start, limit))
    if isinstance(form, RowForm):
        # a view only when every axis after the first sliced one is whole
        first = next((i for i, (s, l, n) in enumerate(zip(start, limit, form.shape))
                      if (s, l) != (0, n)), None)
        if first is None:
            return form, 0
        if any((s, l) != (0, n) for s, l, n in
               zip(start[first + 1:], limit[first + 1:], form.shape[first + 1:])):
            return None
        if any(n != 1 for n in shape[:first]):
            return None
        esize = form.dtype.to_numpy().itemsize
        inner = int(math.prod(form.shape[first + 1:])) * esize
        outer_off = 0
        rowbytes = int(math.prod(form.shape[first:])) * esize
        for k in range(first - 1, -1, -1):
            outer_off += start[k] * rowbytes
            rowbytes *= form.shape[k]
        return RowForm(form.dtype, shape), outer_off + start[first] * inner
    off = 0
    lay = form.layout
    for r, st, s, l, n in zip(form.roles, form.strides, start, limit, form.shape):
        if (s, l) == (0, n):
            continue
        if r == "b":
            off += s * st
        elif r == "h":
            off += s * lay.line_stride
        elif r == "c":
            if s % lay.c2:
                return None
            off += (s // lay.c2) * lay.surf_stride
            # the view's cube holds only its own channel groups: the parent's groups past
            # them are other data (GeGLU's second half), never this view's zero padding
            lay = CubeLayout(lay.height, lay.width, l - s, lay.c2, lay.dtype, lay.line_stride,
                             lay.surf_stride)
        else:
            return None
    return CubeForm(lay, form.roles, form.strides, shape), off


def channel_parent(piece: Form, shape: tuple[int, ...]) -> CubeForm | None:
    """The cube of ``shape`` whose leading channels are ``piece``'s: the same rows, width,
    strides and channel atom, more channel groups (a channel concat whose first operand is
    ``piece``). The other operands' cubes are then channel slices of it (``slice_form``) at
    offsets of whole channel groups, one surface stride each. None when ``piece`` is not a
    cube with its channels on the last axis, or when a batch axis steps by whole cubes (an
    emitter's item stride: the parent's items would be further apart than the piece's)."""
    shape = tuple(int(n) for n in shape)
    if not isinstance(piece, CubeForm) or not piece.roles or piece.roles[-1] != "c":
        return None
    if len(shape) != len(piece.shape) or shape[:-1] != piece.shape[:-1]:
        return None
    lay = piece.layout
    rows = lay.height * lay.line_stride
    # a batch folded into H stays inside one surface; one that steps past it would land in
    # the next piece's channel groups
    reach = sum((n - 1) * st for r, st, n in zip(piece.roles, piece.strides, piece.shape)
                if r == "b" and n > 1)
    if reach + rows > lay.surf_stride:
        return None
    try:
        parent = CubeLayout(lay.height, lay.width, shape[-1], lay.c2, lay.dtype, lay.line_stride,
                            lay.surf_stride)
    except Exception:
        return None
    return CubeForm(parent, piece.roles, piece.strides, shape)


def same_axes(have: CubeForm, want: CubeForm) -> bool:
    """Both forms address the same elements at the same offsets: equal shapes, and equal roles
    (and batch strides) on every axis of extent > 1. A unit axis adds no offset whatever its
    role, so a 1-row result held as ('b', 'c') serves a reader asking for ('h', 'c')."""
    if have.shape != want.shape:
        return False
    for r1, s1, r2, s2, n in zip(have.roles, have.strides, want.roles, want.strides, have.shape):
        if n == 1:
            continue
        if r1 != r2 or (r1 == "b" and s1 != s2):
            return False
    return True


def layouts_agree(have: CubeLayout, want: CubeLayout) -> str:
    """'' when a reader of ``want`` can read bytes written as ``have`` in place; 'tail' when
    it can provided the channel groups past ``have``'s are zero; else the reason it cannot."""
    if have.dtype != want.dtype or have.c2 != want.c2:
        return f"dtype/atom {have.dtype}/{have.c2} vs {want.dtype}/{want.c2}"
    if have.width != want.width or have.line_stride != want.line_stride:
        return f"width/line stride {have.width}/{have.line_stride} vs {want.width}/{want.line_stride}"
    if have.surf_stride != want.surf_stride:
        return f"surface stride {have.surf_stride} vs {want.surf_stride}"
    if want.height > have.height:
        return f"height {have.height} < {want.height}"
    if want.groups > have.groups:
        return "tail"
    return ""


def with_layout(form: CubeForm, layout: CubeLayout) -> CubeForm:
    return replace(form, layout=layout)
