"""Shape ops as views: reshape, transpose, slice, unit-axis broadcast and float converts move
no byte when the operand's storage allows it (rules/forms.py says when). When it does not,
the partitioner takes the host rule (a strided copy)."""
from __future__ import annotations

from ...ir.ops import Op
from ...ir.types import DType
from .base import CubeForm, NoNpuForm, RowForm, RuleContext, RuleResult, ViewResult
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
    if src and int(__import__("numpy").prod(src)) != int(__import__("numpy").prod(out)):
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


RULES = {Op.RESHAPE: _reshape, Op.TRANSPOSE: _transpose, Op.SLICE: _slice,
         Op.BROADCAST_IN_DIM: _broadcast, Op.CONVERT: _convert}
