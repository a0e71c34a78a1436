"""A deferred softmax's row sum from its value product: ``e @ [v | 1]`` (issue 9).

ir/passes/softmax_dot.py turns ``softmax(x) @ v`` into ``(e @ v) / broadcast(sum(e))``. The
sum over the keys is what the product's matmul computes for a kernel of ones, so the value
operand is widened by one such kernel and the row sum read from that output column: the
separate ones-vector pass over ``e`` (rules/reduce.py, one read of the [rows, keys] exp values
per head) disappears.

Layout: the product's kernels are padded to ``n_pad`` (the K atom, as the unfused product's
output channels), the ones kernel is kernel ``n_pad``, so the sum is channel 0 of the output's
channel group ``n_pad / C2`` -- the same 1-channel fp32 column cube (value of row p at line p)
a feature reduce writes, one surface further on. The product itself is seen as the first
``n_pad`` channels of each item (the unfused layout), so its readers are unchanged.

Numerics: the column is the fp32 accumulation of the fp16 ``e`` times 1.0 over the real keys
(padding key channels are zero in the ones kernel, as in the feature reduce's ones row):
the same sum as rules/reduce.py's ``lower_reduce_sum``, rounded once to fp32; masked keys
contribute their e = 0 as before.

Matched (``row_sum_columns``): a deferred product (``is_deferred_product``) whose division's
row sums are read by that division's broadcast only, and are not a graph output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ...ir.graph import Graph, Value
from ...ir.ops import Op
from ...ir.passes.softmax_dot import deferred_division, is_deferred_product
from ..arith import round_up
from ..layouts import CubeLayout
from . import forms as F
from .base import CubeForm


def row_sum_columns(graph: Graph) -> dict[int, Value]:
    """Product value id -> the row-sum value its ones column can provide."""
    producers, users = graph.producers(), graph.users()
    outputs = {v.id for v in graph.outputs}
    found: dict[int, Value] = {}
    for div in graph.nodes:
        dot = deferred_division(div, producers)
        if dot is None or not is_deferred_product(dot, producers, users):
            continue
        pb = producers[div.inputs[1].id]
        s = pb.inputs[0]
        if producers[s.id].op is not Op.REDUCE_SUM or s.id in outputs or pb.out.id in outputs:
            continue
        if [u.out.id for u in users.get(s.id, [])] != [pb.out.id] or \
                [u.out.id for u in users.get(pb.out.id, [])] != [div.out.id]:
            continue
        found[dot.out.id] = s
    return found


@dataclass(frozen=True)
class RowSumColumn:
    """Where the widened product keeps its real columns and its row-sum column."""

    n_pad: int                 # kernels before the ones kernel (the product's own layout)

    @property
    def kernels(self) -> int:
        return self.n_pad + 1

    def weights(self, w: np.ndarray, n: int) -> np.ndarray:
        """A compile-time [.., N, K] rhs with zero padding kernels and the ones kernel."""
        wide = np.zeros(w.shape[:-2] + (self.kernels, w.shape[-1]), w.dtype)
        wide[..., :n, :] = w
        wide[..., self.n_pad, :] = 1.0
        return wide

    def product_form(self, out: CubeLayout, shape: Sequence[int], batch: int,
                     item_stride: int) -> CubeForm:
        """The product as the first ``n_pad`` channels of each (wider) output item."""
        lay = replace(out, channels=self.n_pad)
        if batch > 1:
            return F.cube_form(lay, tuple(shape), item_stride=item_stride)
        return F.cube_form(lay, tuple(shape))

    def sum_form(self, out: CubeLayout, rows: int, batch: int, item_stride: int
                 ) -> tuple[CubeForm, int]:
        """The row sums as a 1-channel column cube and its byte offset in the output."""
        if self.n_pad % out.c2:
            raise ValueError(f"the ones kernel at {self.n_pad} does not start a channel group")
        lay = replace(out, channels=1)
        if batch > 1:
            form = F.cube_form(lay, (batch, rows), ("b", "h"), item_stride=item_stride)
        else:
            form = F.cube_form(lay, (rows,), ("h",))
        return form, self.n_pad // out.c2 * out.surf_stride


def row_sum_column(n: int, align: int) -> RowSumColumn:
    """The ones kernel after ``n`` kernels padded to ``align`` (the unfused product's output
    channels), so the product's own layout is unchanged."""
    return RowSumColumn(round_up(n, align))

