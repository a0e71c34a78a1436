"""Import rule for gather: only the row-lookup form (``table[ids]``, ``jnp.take(x, ids, axis)``),
which becomes the IR's ``take``.  Every other gather is refused with the reason."""
from __future__ import annotations

from ..ir.graph import Value
from ..ir.ops import Op
from .context import EqnContext
from .registry import import_rule


def _take_axis(ctx: EqnContext, operand: Value, indices: Value) -> int:
    """The axis of a gather that is a take along one axis, or an UnsupportedError saying why
    this gather is not one."""
    p = ctx.params
    dn = p["dimension_numbers"]
    r = operand.type.rank
    slice_sizes = tuple(int(s) for s in p["slice_sizes"])

    def refuse(why: str) -> Exception:
        return ctx.unsupported(
            f"only the lookup form of gather (table[ids] or jnp.take(x, ids, axis=a)) is "
            f"supported; this gather {why} (dimension_numbers={dn}, slice_sizes={slice_sizes})")

    if tuple(dn.operand_batching_dims) or tuple(dn.start_indices_batching_dims):
        raise refuse("has batching dimensions")
    start_map, collapsed = tuple(dn.start_index_map), tuple(dn.collapsed_slice_dims)
    if len(start_map) != 1 or collapsed != start_map:
        raise refuse("indexes more than one axis or keeps the indexed axis")
    if indices.type.rank == 0 or indices.type.shape[-1] != 1:
        raise refuse("does not take one index per lookup")
    (axis,) = start_map
    want_sizes = tuple(1 if d == axis else operand.type.shape[d] for d in range(r))
    if slice_sizes != want_sizes:
        raise refuse("takes partial slices")
    nb = indices.type.rank - 1
    want_offsets = tuple(range(axis)) + tuple(range(axis + nb, r - 1 + nb))
    if tuple(dn.offset_dims) != want_offsets:
        raise refuse("places the looked-up rows in another output order")
    return axis


@import_rule("gather")
def _gather(ctx: EqnContext, operand: Value, indices: Value) -> Value:
    axis = _take_axis(ctx, operand, indices)
    # jnp.take (FILL_OR_DROP) and x[ids] (PROMISE_IN_BOUNDS) normalise negative ids before the
    # gather, so every mode agrees for in-range ids; out-of-range ids follow the IR's take.
    ids = ctx.reshape(indices, indices.type.shape[:-1])
    return ctx.add(Op.TAKE, [operand, ids], {"axis": axis})
