"""Shape ops as views: reshape, transpose, slice, unit-axis broadcast and float converts move
no byte when the operand's storage allows it (rules/forms.py says when). When it does not,
the partitioner takes the host rule (a strided copy)."""
from __future__ import annotations

import math

from ...ir.graph import Value
from ...ir.ops import Op
from .base import CubeForm, NoNpuForm, RuleContext, RuleResult, ViewResult
from . import forms as F


def _reshape(ctx: RuleContext) -> RuleResult:
    shape = ctx.node.out.type.shape

    def derive(f):
        g = F.reshape(f, shape)
        return None if g is None else (g, 0)
    return RuleResult(view=ViewResult(derive))


def _transpose(ctx: RuleContext) -> RuleResult:
    perm = tuple(ctx.node.attrs["permutation"])

    def derive(f):
        g = F.transpose(f, perm)
        return None if g is None else (g, 0)
    return RuleResult(view=ViewResult(derive))


def _slice(ctx: RuleContext) -> RuleResult:
    a = ctx.node.attrs

    def derive(f):
        return F.slice_form(f, tuple(a["start"]), tuple(a["limit"]), tuple(a["strides"]))
    return RuleResult(view=ViewResult(derive))


def _broadcast(ctx: RuleContext) -> RuleResult:
    """Only the unit-axis form (a reshape that adds size-1 axes) is a view; a real broadcast
    is folded into its consumer (per-row / per-channel operands) or runs on the host."""
    node = ctx.node
    src, out = node.inputs[0].type.shape, node.out.type.shape
    if src and math.prod(src) != math.prod(out):
        raise NoNpuForm("a broadcast that replicates data (folded into its consumer when it "
                        "is a per-row or per-channel operand)")
    dims = tuple(node.attrs["broadcast_dimensions"])
    if list(dims) != sorted(dims):
        raise NoNpuForm("a broadcast that also permutes axes")

    def derive(f):
        g = F.reshape(f, out)
        return None if g is None else (g, 0)
    return RuleResult(view=ViewResult(derive))


def _convert(ctx: RuleContext) -> RuleResult:
    """Float -> float converts are views of an NPU cube (every float runs as fp16 there)."""
    node = ctx.node
    if not (node.inputs[0].type.dtype.is_float and node.out.type.dtype.is_float):
        raise NoNpuForm("a convert that changes the number kind runs on the host")

    def derive(f):
        return (f, 0) if isinstance(f, CubeForm) else None
    return RuleResult(view=ViewResult(derive))


def _concat_offsets(node) -> list[int] | None:
    """Channel offset of every operand of a concat along the last axis; None for any other
    axis (the cube holds only its channels in separate surfaces)."""
    rank = len(node.out.type.shape)
    if rank == 0 or int(node.attrs["dimension"]) % rank != rank - 1:
        return None
    offs, at = [], 0
    for v in node.inputs:
        offs.append(at)
        at += v.type.shape[-1]
    return offs


def _concatenate(ctx: RuleContext) -> RuleResult:
    """A channel concat is a view when its operands already sit side by side in one cube:
    operand 0's cube widened to every channel (forms.channel_parent), each other operand a
    channel slice of it at a whole number of groups. The pipeline places the producers' output
    cubes that way (concat_slots); whether they landed there is checked on the stored tensors,
    and if not the host copies the pieces."""
    node = ctx.node
    offs = _concat_offsets(node)
    if offs is None:
        raise NoNpuForm("a concat off the channel axis moves whole cubes (host copy)")
    shape = node.out.type.shape

    def derive(f):
        g = F.channel_parent(f, shape)
        return None if g is None else (g, 0)
    return RuleResult(view=ViewResult(derive, parts=tuple(offs)),
                      note="the pieces are not side by side in one cube (an offset that is not "
                           "a whole channel group, or a piece made on the host or given as input)")


def concat_slots(node, atom: int) -> list[tuple[Value, int]] | None:
    """(operand, channel offset) for a channel concat whose producers may write straight into
    the result's cube: every offset a whole number of ``atom``-channel groups, every operand
    distinct and of the same leading shape, and a float result (the fp16 cube)."""
    offs = _concat_offsets(node)
    if offs is None or not node.out.type.dtype.is_float or len(node.inputs) < 2:
        return None
    if any(o % atom for o in offs) or len({v.id for v in node.inputs}) != len(node.inputs):
        return None
    lead = node.out.type.shape[:-1]
    if any(v.type.shape[:-1] != lead for v in node.inputs):
        return None
    return list(zip(node.inputs, offs))


RULES = {Op.RESHAPE: _reshape, Op.TRANSPOSE: _transpose, Op.SLICE: _slice,
         Op.BROADCAST_IN_DIM: _broadcast, Op.CONVERT: _convert, Op.CONCATENATE: _concatenate}

# Ops whose operands are best produced straight into a slice of the op's result (placement
# hints the pipeline reads before lowering: node, channel atom -> [(operand, channel offset)]).
SLICE_PLACEMENTS = {Op.CONCATENATE: concat_slots}
