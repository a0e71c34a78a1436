"""The range plan: a compile-time bound for every float value, and what the lowering does where
a value could leave fp16's range (design.md, convention 13).

Bounds are magnitudes (a bound B means |v| <= B for every element), from interval arithmetic
over the IR with the resident weights known: one rule per op in ``BOUND_RULES``. A matmul's
output is bounded by each output column's weight L1 norm times the input bound; a LayerNorm's
output by sqrt(H) (each centred element is at most sqrt(H) row deviations) times its gain,
plus its shift; a softmax lies in [0, 1]; saturating functions in their limits.

Input assumption (one place: ``fp16_range.INPUT_BOUND``): a float32 argument's dtype range says
nothing useful, so graph inputs are assumed to lie within fp16's finite range (the NPU reads
them as fp16; the call-time input check enforces it). Worst-case bounds through a residual
stream then grow layer by layer past fp16 -- real streams do not, but the bound cannot know
that -- so the plan does not prescale by such bounds (that would flush every ordinary value to
zero). Instead it handles the known overflow sites *structurally*, with a method exact for any
fp16 input, and prescales by a bound only where the bound is tight enough to use:

* Norm statistics (LayerNorm's and RMSNorm's sum of squares). ``c * c`` overflows fp16 for
  |c| >= 256 (real Whisper checkpoints carry a channel at ~620; a ModernBERT-large stream
  passes 29000), and rsqrt(inf) = 0 would silently turn the row into the LayerNorm bias. Every
  ``sum(c * c)`` over the last axis whose operand bound exceeds ``SQUARE_SAFE`` is rewritten
  into a per-row-scaled form (``rewrite_square_sums``):

      pass 1  c1 = c * 2^-s0 (s0 from c's bound, at most 8: |c| <= 65504 -> |c1| < 256),
              r1 = sum(c1 * c1)                     NPU: exact scale, fp32 reduce
      host    t  = 2^floor(log2(ROW_TARGET / sqrt(4^s0 r1 + floor)))   per row, O(rows)
      pass 2  c2 = c * t,  r2 = sum(c2 * c2)        NPU: per-row multiply, fp32 reduce
      host    sum(c * c) = r2 / t^2;  and every per-row multiply c * g of the norm's output
              becomes c2 * (g / t), so the output is computed from the same c2 the
              statistics saw.

  Where c = x - mean(x) (LayerNorm), pass 1 squares x instead (s0 from x's bound) and the host
  bounds sum(c^2) from sum(x^2) and the mean's own sum of x (``rewrite_square_sums``): pass 1
  then runs in the mean's NPU step, one host round trip fewer per norm.
  The floor (H 2^(2 s0 - 24)) covers the squares pass 1 flushed to zero, so |c2| <= ROW_TARGET
  for every element of every row: no square overflows whatever the row holds, and a row of
  small values is scaled *up* (no fp16 underflow of its squares either). t is a power of two,
  so c * t is exact in fp16 and the host's divisions by t are exact: where the original would
  not have overflowed, the output is what it would have been.
  The mean path needs nothing: the NPU's feature reduce sums fp16 inputs in fp32.

* Gated-MLP products (the down-projection's input). ``p * q`` of two in-range values whose
  bound passes fp16, read only by matmuls with resident weights, becomes ``p * (q 2^-s)`` with
  the weights scaled by 2^s (``rewrite_matmul_inputs``): exact powers of two, the matmul's
  result unchanged. This one is driven by the bound (finite here: LayerNorm output bound x the
  weights' L1 norms), so it may prescale where real data would not need it; the cost is an
  absolute error of 2^(s-25) per element, below the matmul's own rounding.

* Scaled activation products (attention's ``q k^T * head_dim^-0.5``). The matmul writes the
  product before the scale, in fp16: scaled logits past 8192 (head_dim 64) overflow there
  though they fit after it. The scale's power-of-two part moves onto the first activation
  operand, into q's projection weights where it can (score_scales.py): exact, the matmul then
  writes the scaled logits, and the scores are not read and written again for the scale.

Before these, not for range but for one rounding less: a bias-free norm's gain ``n * g`` read
only by projections with resident weights is folded into their weights (gain_fold.py).

What the plan guarantees: no fp16 overflow in a norm's statistics for any fp16 input, none in a
value whose bound is finite and below 65504 (``fp16``), none in a prescaled product; values it
cannot bound (``assumed``: the residual stream and what is computed from it before a norm)
stay within fp16 only if the data does -- and if they do not, the program raises
``NumericsError`` (loaded_graph.py) instead of returning the result.

Every record says what the plan decided for one value: ``fp16`` (bound within fp16), ``fp32``
(the NPU writes it in fp32: the feature reduce), ``host`` (computed on the host in f32),
``prescale 2^-s`` / ``row prescale`` (the rewrite above), or ``assumed`` (an NPU fp16 value
whose worst-case bound exceeds fp16 -- a residual stream -- that relies on the input
assumption; an overflow there shows as inf/NaN in the output, never as a plausible number,
because the norm rewrite turns an infinite deviation into NaN instead of the bias, and a
max/min bound beyond fp16 that would clip it is made infinite: inf_guard.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..ir.graph import Graph
from ..ir.passes.softmax_dot import is_deferred_product
from ..ir.ops import Op
from .fp16_range import FP16_MAX
from .range_bounds import INF, ROW_TARGET, compute_bounds
from .gain_fold import GainFoldSite, fold_norm_gains
from .key_bias import drop_key_biases
from .range_rewrites import NormSite, ProductSite, rewrite_matmul_inputs, rewrite_square_sums
from .score_scales import ScoreScaleSite, rewrite_score_scales


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RangeRecord:
    value: int              # IR value id (%value)
    op: str
    loc: str                # the user's source line
    bound: float            # |value| <= bound (inf: no finite bound)
    action: str             # fp16 | fp32 | host | prescale 2^-s | row prescale | assumed
    note: str = ""

    def __str__(self) -> str:
        b = "inf" if not math.isfinite(self.bound) else f"{self.bound:.4g}"
        note = f"  [{self.note}]" if self.note else ""
        return f"%{self.value:<6} {self.op:<14} |v| <= {b:<10} {self.action:<14} {self.loc}{note}"


@dataclass
class RangePlan:
    bounds: dict[int, float]
    sites: list[NormSite]
    records: list[RangeRecord] = field(default_factory=list)
    products: list[ProductSite] = field(default_factory=list)
    score_scales: list[ScoreScaleSite] = field(default_factory=list)
    gain_folds: list[GainFoldSite] = field(default_factory=list)
    key_bias_drops: int = 0

    def counts(self) -> dict[str, int]:
        """Counts for Program.stats(): prescaled / fp32 / host-kept / assumed values."""
        out = {"range_prescaled": 0, "range_fp32": 0, "range_host": 0, "range_fp16": 0,
               "range_assumed": 0, "range_norm_rewrites": len(self.sites),
               "range_matmul_input_rewrites": len(self.products),
               "range_score_scale_rewrites": len(self.score_scales),
               "range_gain_folds": len(self.gain_folds),
               "range_key_bias_drops": self.key_bias_drops}
        for r in self.records:
            key = ("range_prescaled" if "prescale" in r.action else f"range_{r.action}")
            if key in out:
                out[key] += 1
        return out

    def report(self) -> str:
        return "\n".join(str(r) for r in self.records)


def plan_ranges(graph: Graph, params: Mapping[str, np.ndarray]) -> tuple[Graph, RangePlan]:
    """Bounds for ``graph``, the norm-statistics rewrite where a square could overflow, and
    the bounds of the rewritten graph (its records are filled in by ``finish_plan`` once the
    partition knows where each value is computed)."""
    from .fp16_range import saturate_consts
    from .fold import fold_consts

    # not a range rewrite but one that saves a rounding (gain_fold.py); first, so that the
    # bounds below are those of the graph that runs
    folded = fold_consts(graph, params)
    graph, gain_folds = fold_norm_gains(graph, folded)
    # the fold rewrites the graph only where it found a gain; otherwise its values stand
    consts = saturate_consts(fold_consts(graph, params) if gain_folds else folded, graph)
    # a key bias a softmax cannot see (key_bias.py); it only removes nodes, so the constants
    # of the graph that remains stand
    graph, key_drops = drop_key_biases(graph, consts)
    bounds = compute_bounds(graph, consts)
    g2, sites = rewrite_square_sums(graph, consts, bounds)
    known = dict(bounds)
    if sites:
        # the rewrite equals the original in exact arithmetic: a value it kept keeps its bound
        for s in sites:
            # pass 2's operand is <= ROW_TARGET by construction (no bound rule can see it)
            known[s.scaled.id] = ROW_TARGET
            known[s.prescaled.id] = min(s.operand_bound, FP16_MAX) * 2.0 ** -s.shift
        consts = saturate_consts(fold_consts(g2, params), g2)
        bounds = compute_bounds(g2, consts, known)
    g3, products = rewrite_matmul_inputs(g2, consts, bounds)
    if products:
        known = dict(bounds)
        for ps in products:
            known[ps.product.id] = ps.bound * 2.0 ** -ps.shift
        consts = saturate_consts(fold_consts(g3, params), g3)
        bounds = compute_bounds(g3, consts, known)
    g4, scores = rewrite_score_scales(g3, consts)
    if scores:
        bounds = compute_bounds(g4, saturate_consts(fold_consts(g4, params), g4), bounds)
    plan = RangePlan(bounds, sites)
    plan.products = products
    plan.score_scales = scores
    plan.gain_folds = gain_folds
    plan.key_bias_drops = key_drops
    return g4, plan


def finish_plan(plan: RangePlan, graph: Graph, decisions) -> None:
    """One record per float value the lowering computes: what it runs as and its bound."""
    where: dict[int, str] = {}
    for d in decisions:
        try:
            vid = int(d.node.split("=")[0].strip().lstrip("%"))
        except ValueError:
            continue
        where[vid] = d.where
    pre = {s.prescaled.id: (s.shift, "norm statistics, pass 1") for s in plan.sites if s.shift}
    pre.update({ps.scaled_operand.id: (ps.shift, "a matmul input's operand; undone in its "
                "weights") for ps in plan.products})
    moved = "a scaled matmul's operand: the scale moved before the product"
    pre.update({ss.scaled_operand.id: (ss.shift, moved) for ss in plan.score_scales})
    scaled = {s.scaled.id for s in plan.sites}
    producers, users = graph.producers(), graph.users()
    recs = []
    for n in graph.nodes:
        v = n.out
        w = where.get(v.id)
        if w not in ("npu", "host") or not v.type.dtype.is_float:
            continue
        b = plan.bounds.get(v.id, INF)
        loc = str(n.loc) if n.loc else ""
        note = ""
        if w == "host":
            action = "host"
        elif n.op is Op.REDUCE_SUM:
            action = "fp32"       # the feature reduce's ones-matmul writes fp32
        elif is_deferred_product(n, producers, users):
            action = "fp32"
            note = "a deferred softmax's e @ v (ir/passes/softmax_dot.py)"
        elif v.id in pre:
            action = f"prescale 2^-{pre[v.id][0]}"
            note = pre[v.id][1]
        elif v.id in scaled:
            action = "row prescale"
            note = "norm statistics, pass 2: each row to <= 128"
        elif b <= FP16_MAX:
            action = "fp16"
        else:
            action = "assumed"
            note = ("worst-case bound exceeds fp16; relies on inputs within fp16 "
                    "(fp16_range.INPUT_BOUND) -- an overflow shows as inf/NaN")
        recs.append(RangeRecord(v.id, n.op.text, loc, b, action, note))
    plan.records = recs
