"""What a lowering rule sees and returns, and how tensors are stored.

Storage forms of an IR value (a value may be held in several, each one a ``Tensor``):

* ``RowForm``  -- dense row-major bytes of ``dtype`` (the host's form; graph inputs/outputs).
* ``CubeForm`` -- the NPU's cube layout. A ``CubeLayout`` describes one H x W x C cube; the
  logical axes of the value each have a role: ``h``, ``w``, ``c`` (at most one each) or ``b``
  (a batch axis with a byte stride between its elements). Shape ops on a cube are *views*:
  a transpose permutes roles, a reshape that splits C at a multiple of the channel atom makes a
  batch axis whose stride is a whole number of channel groups (attention's head split), a
  channel slice at a multiple of the atom moves the offset. No byte moves.

A rule maps one IR node to ``OpCall``s: an ``OpLowering`` from an emitter (or a host rule) plus
which stored value each of its ``input``/``output`` buffer binds to (``Use``: a value, an index
into its leading batch axes, an optional permutation of the remaining axes). The pipeline finds
or makes a tensor of the form each BufferSpec asks for, inserting host re-tiles only where the
forms disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DType
from ..layouts import CubeLayout
from ..op_lowering import OpLowering
from ..profile import ChipProfile


class NoNpuForm(Exception):
    """Raised by an NPU rule: this node (at these shapes/dtypes) has no legal on-device form.
    The message says why; the partitioner then tries the host rules and reports both."""


# ---------------------------------------------------------------------------------------------
# storage forms
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowForm:
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(int(d) for d in self.shape) * self.dtype.to_numpy().itemsize

    def sub(self, index: tuple[int, ...]) -> tuple["RowForm", int]:
        """The contiguous sub-array at ``index`` of the leading axes and its byte offset."""
        off, stride = 0, self.nbytes
        for i, n in zip(index, self.shape):
            stride //= n
            off += i * stride
        return RowForm(self.dtype, self.shape[len(index):]), off


@dataclass(frozen=True)
class WeightForm:
    """A matmul/conv weight operand in the weight layout (only ever made by a host
    ``pack_weight`` step from row-major fp16 [N, K] rows, or at compile time)."""

    layout: Any                       # layouts.WeightLayout
    shape: tuple[int, ...]            # (N, K) or (batch, N, K)
    stride: int = 0                   # bytes between batch elements
    # a padding kernel whose K real channels hold 1.0 (its output column is the row sum of
    # the feature operand: rules/row_sum.py); None: every padding kernel is zero
    ones: int | None = None

    @property
    def nbytes(self) -> int:
        nb = int(math.prod(self.shape[:-2])) if len(self.shape) > 2 else 1
        return (nb - 1) * self.stride + self.layout.nbytes

    @property
    def dtype(self) -> DType:
        return DType.from_numpy(self.layout.dtype)


@dataclass(frozen=True)
class CubeForm:
    layout: CubeLayout
    roles: tuple[str, ...]            # per logical axis: "h", "w", "c" or "b"
    strides: tuple[int, ...]          # byte stride of each "b" axis (0 for h/w/c)
    shape: tuple[int, ...]            # logical shape

    def __post_init__(self) -> None:
        assert len(self.roles) == len(self.shape) == len(self.strides), (self.roles, self.shape)

    @property
    def nbytes(self) -> int:
        """Extent from the tensor's offset to its last byte."""
        ext = self.layout.nbytes
        for r, s, n in zip(self.roles, self.strides, self.shape):
            if r == "b" and n > 1:
                ext += s * (n - 1)
        return ext

    @property
    def dtype(self) -> DType:
        return DType.from_numpy(self.layout.dtype)

    def sub(self, index: tuple[int, ...]) -> tuple["CubeForm", int]:
        """The cube at ``index`` over the leading axes (all of which must be batch axes)."""
        off = 0
        for k, i in enumerate(index):
            if self.roles[k] != "b":
                raise NoNpuForm(f"index over a {self.roles[k]!r} axis of a cube")
            off += i * self.strides[k]
        n = len(index)
        return CubeForm(self.layout, self.roles[n:], self.strides[n:], self.shape[n:]), off

    def permuted(self, perm: Sequence[int]) -> "CubeForm":
        return CubeForm(self.layout, tuple(self.roles[p] for p in perm),
                        tuple(self.strides[p] for p in perm), tuple(self.shape[p] for p in perm))

    def batch_items(self) -> list[tuple[tuple[int, ...], int]]:
        """(index over the b axes, byte offset) of every cube in the form."""
        items: list[tuple[tuple[int, ...], int]] = [((), 0)]
        for r, s, n in zip(self.roles, self.strides, self.shape):
            if r == "b":
                items = [(ix + (i,), off + i * s) for ix, off in items for i in range(n)]
        return items

    def hwc(self) -> tuple[int, int, int]:
        """Logical H, W, C extents (the layout may be padded beyond them)."""
        d = {r: n for r, n in zip(self.roles, self.shape) if r != "b"}
        return d.get("h", 1), d.get("w", 1), d.get("c", 1)


Form = RowForm | CubeForm | WeightForm


@dataclass
class Tensor:
    """One stored form of one IR value: bytes at ``offset`` of logical buffer ``buf``."""

    value: int            # IR value id (-1: op-private)
    form: Form
    buf: int
    offset: int = 0
    written: int = 0      # bytes the producer writes from ``offset`` (for zero-tail checks)

    @property
    def nbytes(self) -> int:
        return self.form.nbytes


# ---------------------------------------------------------------------------------------------
# what a rule returns
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Use:
    """Operand/result binding: ``value`` at ``index`` (leading batch axes), its remaining axes
    permuted by ``perm`` (None: as is), seen with ``shape`` (None: the natural shape; a reshape
    that keeps row-major order, e.g. folding batch rows into M)."""

    value: Value
    index: tuple[int, ...] = ()
    perm: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None
    roles: tuple[str, ...] | None = None   # cube roles of the seen axes (None: matrix)


@dataclass
class OpCall:
    lowering: OpLowering
    operands: tuple[Use, ...]      # BufferSpec.bind of an input -> operands[bind]
    results: tuple[Use, ...]       # BufferSpec.bind of an output -> results[bind]
    label: str = ""
    where: str = "npu"             # "npu" | "host"
    emitter: str = ""              # which emitter/host rule built it (for the report)
    # Explicit storage forms (None: derived from the BufferSpec): lane-wise ops bind the
    # operand's existing cube form whatever layout their flat view declares.
    forms_in: tuple["Form | None", ...] | None = None
    forms_out: tuple["Form | None", ...] | None = None


@dataclass
class ViewResult:
    """A shape op that moves no byte: the output is a view of operand 0's tensor."""

    derive: Callable[[Form], "tuple[Form, int] | None"]  # input form -> (output form, byte
                                                         # offset) or None: not a view
    # A view over several operands (a channel concat): operand i's channel offset in the
    # result; ``derive`` widens operand 0's form to the result's, and each other operand must
    # already be stored as the channel slice of that result at its offset.
    parts: tuple[int, ...] | None = None


@dataclass
class RuleResult:
    calls: list[OpCall] = field(default_factory=list)
    parallel: bool = False         # the calls are independent: merge their NPU steps
    view: ViewResult | None = None
    note: str = ""
    # other values the calls' outputs hold: (value, holder value, holder-relative form,
    # byte offset in the holder's tensor); the pipeline registers them, no call of their own
    # (a deferred softmax's row sums in its product's ones column: rules/row_sum.py)
    also: tuple[tuple[Value, Value, "Form", int], ...] = ()


@dataclass
class RuleContext:
    """What a rule may ask about the graph around its node."""

    profile: ChipProfile
    node: Node
    producers: Mapping[int, Node]
    consts: Mapping[int, np.ndarray]           # compile-time values by value id
    forms: Callable[[Value], list[Form]]       # forms the value is already stored in
    npu_float: DType = DType.F16
    # a fresh value id for an intermediate a rule makes that the IR does not have (a per-row
    # reciprocal between a host tail and an NPU per-row multiply)
    fresh: Callable[[Any], Value] | None = None
    graph_inputs: tuple[Value, ...] = ()
    # the value is to be written into a channel slice of a larger cube (a channel concat's
    # piece, placed by the pipeline): its padding channels would land in the next piece
    sliced: Callable[[Value], bool] | None = None
    # values the range plan has the NPU write in fp32 (a deferred softmax's e @ v, whose fp16
    # form could overflow where its quotient does not: ir/passes/softmax_dot.py)
    fp32_values: frozenset[int] = frozenset()
    # product value id -> the row-sum value its ones column provides (rules/row_sum.py)
    row_sums: Mapping[int, Value] = field(default_factory=dict)
    # value id -> the nodes reading it (row-split passes look for the reduce they feed)
    users: Mapping[int, list[Node]] = field(default_factory=dict)
    # square value id -> (v, x, s): v * v with v = x * 2^-s, squared from x in one pass
    # (rules/scaled_square.py)
    prescaled: Mapping[int, tuple[Value, Value, int]] = field(default_factory=dict)

    def const(self, v: Value) -> np.ndarray | None:
        return self.consts.get(v.id)

    def producer(self, v: Value) -> Node | None:
        return self.producers.get(v.id)

    @property
    def where(self) -> str:
        n = self.node
        return f"{n.op.text} at {n.loc}" if n.loc else f"{n.op.text} (%{n.out.id})"


LowerRule = Callable[[RuleContext], RuleResult]
"""An NPU lowering rule. Raises ``NoNpuForm`` when the node has no on-device form."""


def npu_dtype_of(dt: DType) -> DType | None:
    """The NPU compute dtype for an IR dtype: floats run as fp16 (fp32 accumulation), int8
    stays int8; anything else has no NPU form."""
    if dt.is_float:
        return DType.F16
    if dt is DType.I8:
        return DType.I8
    return None


def attr(node: Node, name: str, default: Any = None) -> Any:
    return node.attrs.get(name, default)
