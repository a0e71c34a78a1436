"""The lowering driver: IR graph -> placed calls -> memory plan -> schedule -> LoadedGraph.

    graph (canonicalized + constfolded by the frontend)
      -> range plan (range_plan.py): a bound for every float value; sums of squares that
         could overflow fp16 rewritten into an exact per-row-scaled form
      -> fold compile-time values (params, constants and shape ops over them)
      -> partition + lower node by node (partition.py, rules/): emitter OpCalls or views
      -> residency: bind each OpCall buffer to a stored tensor of the form it asks for; an fp16
         op's output cube is the next op's input cube when the layouts agree (no host trip);
         host re-tiles (unpack/pack, in C) only where they do not; each counted
         a channel concat's pieces are written straight into their channel slices of the
         concat's result cube (_plan_slots / _slot_tensor), so the concat is a view
      -> memory plan (memory.py): one arena, liveness reuse, views share bytes, zero tails
      -> schedule (schedule.py): step order, parallel jobs over the cores
      -> coalesce (coalesce.py, in image_builder before the memory plan's liveness): host steps
         that do not wait for an NPU step run first, adjacent context-0 NPU steps merge
      -> image (image_builder.py): BOs, relocations, jobs, host steps -> runtime Program

Broadcasts of run-time values are lowered lazily: a per-row operand is consumed by its user's
emitter (eltwise.build_binary_row) and never materialized; only a user that needs the
broadcast tensor itself triggers its (host) lowering.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..errors import UnsupportedError
from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from .bounds import CompileBoundError, check_graph
from .compile_cache import compile_scope
from .concat_slots import ConcatSlots
from .fold import fold_consts
from .fp16_range import saturate_consts
from .inf_guard import guard_bounds
from .layout_conversion import LayoutConversion
from .lowered import Boundary, Buf, ConversionError, LoweredGraph, PlacedCall
from .partition import Decision, host_result, lower_node
from ..ir.passes.softmax_dot import is_deferred_product
from .profile import ChipProfile, get_profile
from .residency import Residency
from .rules import forms as F
from .rules.base import CubeForm, RowForm, RuleContext, RuleResult, Tensor
from .rules.row_sum import row_sum_columns
from .rules.scaled_square import prescaled_squares

__all__ = ["Buf", "Boundary", "LoweredGraph", "Lowerer", "PlacedCall", "fold_consts", "lower_graph"]


class Lowerer(Residency, ConcatSlots, LayoutConversion):
    """Lowers a graph node by node on demand (a use lowers its producer first)."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], profile: ChipProfile) -> None:
        self.graph = graph
        self.profile = profile
        self.producers = graph.producers()
        # a mask's finfo(f32).min or -inf would be -inf in fp16: saturated (fp16_range.py)
        self.consts = saturate_consts(fold_consts(graph, params), graph)
        self.tensors: dict[int, list[Tensor]] = {}
        self.bufs: list[Buf] = []
        self.calls: list[PlacedCall] = []
        self.decisions: list[Decision] = []
        self.done: set[int] = set()
        self.retiles = 0
        self.group = 0
        self.fp16_ids: set[int] = set()     # host max/min results of fp16 values (inf_guard.py)
        self._conv_cache: dict[tuple, Tensor] = {}
        self.writes: dict[int, list[tuple[int, int]]] = {}   # buf id -> emitter write spans
        self.inputs: list[Boundary] = []
        # free channel concats: piece value id -> (concat value, channel offset, last piece);
        # concat value id -> the result cube the pieces are written into (None: given up)
        self.slots: dict[int, tuple[Value, int, bool]] = {}
        self.parents: dict[int, Tensor | None] = {}
        ids = [v.id for n in graph.nodes for v in n.outputs] + [v.id for v in graph.inputs]
        self._next_id = max(ids, default=0) + (1 << 20)
        users = graph.users()
        self.users = users
        self.fp32_values = frozenset(n.out.id for n in graph.nodes
                                     if is_deferred_product(n, self.producers, users))
        # a deferred softmax's row sums taken from its product's ones column: the product
        # is lowered first, whichever comes first in the graph (rules/row_sum.py)
        self.row_sums = row_sum_columns(graph)
        self.row_sum_dots = {s.id: self.producers[d] for d, s in self.row_sums.items()}
        # squares of a power-of-two prescale read from the unscaled value: the prescale is
        # lowered only if something still reads it (rules/scaled_square.py)
        self.prescaled = prescaled_squares(graph, self.consts)
        self.absorbed = {v.id: sq for sq, (v, _, _) in self.prescaled.items()}

    def ctx(self, node: Node) -> RuleContext:
        return RuleContext(self.profile, node, self.producers, self.consts, self.forms,
                           fresh=self.fresh_value, graph_inputs=self.graph.inputs,
                           sliced=lambda v: v.id in self.slots and self._slot_open(v),
                           fp32_values=self.fp32_values, row_sums=self.row_sums,
                           users=self.users, prescaled=self.prescaled)

    def fresh_value(self, t) -> Value:
        """A value id no graph node uses, for a rule's private intermediate."""
        self._next_id += 1
        return Value(self._next_id, t)

    def run(self) -> None:
        g = self.graph
        for i, v in enumerate(g.inputs):
            # graph inputs arrive row-major in their IR dtype (the boundary writes them)
            buf = self.new_buf(RowForm(v.type.dtype, v.type.shape).nbytes, name=f"in{i}",
                               pinned=True)
            t = self.add_tensor(v, RowForm(v.type.dtype, v.type.shape), buf)
            self.inputs.append(Boundary(i, v, t))
        self._plan_slots()
        users = self.users       # the graph's, made in __init__ (the graph has not changed)
        from ..progress import progress
        for node in progress(g.nodes, "lowering"):
            if node.out.id in self.consts or node.op in (Op.PARAM, Op.CONSTANT):
                self.decisions.append(Decision(f"%{node.out.id} = {node.op.text}", str(node.loc),
                                               "const", "compile time"))
                continue
            if self._deferred(node, users) or node.out.id in self.absorbed:
                continue
            self.lower(node)

    def _deferred(self, node: Node, users: Mapping[int, list[Node]]) -> bool:
        """A broadcast of a run-time value waits until someone needs its tensor."""
        return node.op is Op.BROADCAST_IN_DIM and node.out not in self.graph.outputs and \
            math.prod(node.inputs[0].type.shape) != node.out.type.size

    def lower(self, node: Node) -> None:
        if node.out.id in self.done:
            return
        try:
            self._lower(node)
        except CompileBoundError as e:
            if getattr(e, "located", False):
                raise
            err = CompileBoundError(f"%{node.out.id} = {node.op.text} ({node.out.type}) at "
                                    f"{node.loc}: {e}")
            err.located = True
            raise err from None

    def _lower(self, node: Node) -> None:
        self.done.add(node.out.id)
        dot = self.row_sum_dots.get(node.out.id)
        if dot is not None:
            self.lower(dot)
            if node.out.id in self.tensors:     # the product's rule took the ones column
                self.decisions.append(Decision(
                    f"%{node.out.id} = {node.op.text}", str(node.loc), "npu",
                    f"ones column of %{dot.out.id}'s value product (rules/row_sum.py)"))
                return
        fused = self.prescaled.get(node.out.id)
        for v in ((fused[1],) if fused else node.inputs):
            p = self.producers.get(v.id)
            if p is None or not self._deferred(p, {}):
                self.demand(v)
        # a max/min bound beyond fp16 that would clip an fp16 overflow back into range
        node = guard_bounds(node, self.consts, self.tensors, self.fresh_value, self.fp16_ids)
        ctx = self.ctx(node)
        res, why = lower_node(ctx)
        if fused and self._prescale_read(node, fused[0], res):
            res, why = lower_node(self.ctx(node))   # again, with the prescale's own form known
        label = f"%{node.out.id} = {node.op.text}"
        if res.view is not None:
            if self._apply_view(node, res):
                self.decisions.append(Decision(label, str(node.loc), "view", "no copy"))
                return
            why = res.note or "not a view of the operand's storage"
            res = host_result(node, ctx, why)
        try:
            self._place(node, res)
        except ConversionError as e:
            raise UnsupportedError(f"{node.op.text} at {node.loc}: {e}") from None
        where = "npu" if any(c.where == "npu" for c in res.calls) else "host"
        how = " + ".join(dict.fromkeys(c.emitter for c in res.calls))
        self.decisions.append(Decision(label, str(node.loc), where, how, why or res.note
                                       if where == "host" else why))

    def _prescale_read(self, node: Node, v: Value, res: RuleResult) -> bool:
        """Whether the chosen calls of a matched square still read its prescale ``v`` (then
        lowered now); else records that v is not computed."""
        if any(u.value.id == v.id for c in res.calls for u in c.operands):
            self.demand(v)
            return True
        self.decisions.append(Decision(f"%{v.id} = mul", str(node.loc), "npu",
                                       f"read by %{node.out.id}'s one-pass square from its "
                                       f"operand (rules/scaled_square.py)"))
        return False

    def demand(self, v: Value) -> None:
        if v.id in self.tensors or v.id in self.consts:
            return
        p = self.producers.get(v.id)
        if p is not None:
            self.lower(p)

    def _apply_view(self, node: Node, res: RuleResult) -> bool:
        if res.view.parts is not None:
            return self._apply_join(node, res)
        src = node.inputs[0]
        if src.id in self.consts:
            return False
        made = False
        for t in list(self.tensors.get(src.id, [])):
            d = res.view.derive(t.form)
            if d is None:
                continue
            form, off = d
            self.tensors.setdefault(node.out.id, []).append(
                Tensor(node.out.id, form, t.buf, t.offset + off, form.nbytes))
            made = True
        return made

    def _place(self, node: Node, res: RuleResult) -> None:
        # Only a rule's independent calls (``parallel``) share a group, whose steps the
        # scheduler merges; dependent calls each get their own, so they run in order.
        # The group is taken before placing: the first call's input conversion (a host pack
        # placed in front of it) takes a group of its own, and the calls after it must still
        # share the first one's, or a head's job splits off the others' step.
        out_tensors: dict[int, Tensor] = {}
        group = self.group
        for i, call in enumerate(res.calls):
            if i == 0 or not res.parallel:
                self.group += 1
                group = self.group
            self._place_call(call, group, f"%{node.out.id} = {node.op.text}", out_tensors)
        for v, holder, form, off in res.also:
            t = self.tensors[holder.id][-1]
            full = F.reshape(form, v.type.shape)
            if full is None:
                raise ConversionError(f"%{v.id} cannot be seen in {form}")
            self.tensors.setdefault(v.id, []).append(
                Tensor(v.id, full, t.buf, t.offset + off, full.nbytes))

    def finish(self) -> list[Boundary]:
        outs = []
        for i, v in enumerate(self.graph.outputs):
            if v.id in self.consts:
                a = np.asarray(self.consts[v.id])
                b = self.new_buf(a.nbytes, "weights", f"out{i}", np.ascontiguousarray(a).reshape(-1).view(np.uint8))
                outs.append(Boundary(i, v, Tensor(v.id, RowForm(v.type.dtype, v.type.shape), b.id)))
                continue
            self.demand(v)
            row = next((t for t in self.tensors.get(v.id, []) if isinstance(t.form, RowForm)
                        and t.form.shape == v.type.shape), None)
            if row is None:
                cube = next((t for t in self.tensors.get(v.id, [])
                             if isinstance(t.form, CubeForm)), None)
                if cube is None:
                    # a view of a view chain with a non-natural cube: fall back to rows
                    raise ConversionError(f"output %{v.id} has no stored form")
                row = self._unpack(v, cube, boundary=True)
            self.bufs[row.buf].pinned = True
            outs.append(Boundary(i, v, row))
        for b in self.inputs:
            self.bufs[b.tensor.buf].pinned = True
        return outs


def lower_graph(graph: Graph, params: Mapping[str, np.ndarray], *,
                profile: ChipProfile | str = "rk3588") -> LoweredGraph:
    """Partition, lower and place every node of ``graph``; the memory plan and the program are
    made by ``ImageBuilder`` (image_builder.py).

    The result depends on the graph, the resident ``params`` and the profile only: no run-time
    value is looked at (LUT domains come from the functions, calibrate.py), so compiling from
    ``jax.ShapeDtypeStruct`` inputs and after a call give the same program.

    One compile scope (compile_cache.py) spans the lowering: a tile plan asked again for the
    same shape (the next layer) is reused."""
    with compile_scope():
        return _lower_graph(graph, params, profile)


def _lower_graph(graph: Graph, params: Mapping[str, np.ndarray],
                 profile: ChipProfile | str) -> LoweredGraph:
    from ..ir.composites import expand
    from ..ir.passes.epilogue import fuse_matmul_epilogue
    from ..ir.passes.fuse import fuse
    from ..ir.passes.softmax_dot import defer_softmax_division
    from .range_plan import finish_plan, plan_ranges
    from .rotation_fold import fold_rotations
    from .rules.contract import epilogue_accepts
    from .value_checks import check_weights

    check_weights(graph, params)     # a NaN or > 65504 weight is refused, never saturated
    prof = get_profile(profile) if isinstance(profile, str) else profile
    check_graph(graph)  # before anything is allocated at the graph's sizes
    # composite activations as activation{kind} ops (the frontend already ran this pass; a
    # graph built by hand has not: the pass is idempotent and costs milliseconds); composites
    # without an emitter of their own (softmax) expanded back into primitive ops; a softmax
    # feeding a value product divides that product instead (ir/passes/softmax_dot.py)
    graph = expand(defer_softmax_division(fuse(graph)))
    # RoPE's rotate_half of a projection: a second projection with rotated weights
    # (rotation_fold.py), before the range plan so that its bounds see the graph that runs
    if any(n.op is Op.CONCATENATE for n in graph.nodes):   # a rotation reassembles q
        graph, _ = fold_rotations(graph, fold_consts(graph, params))
    # bounds, and the norm-statistics rewrite where a square could overflow fp16; the rest of
    # the lowering sees the rewritten graph (equal to the original in exact arithmetic)
    graph, plan = plan_ranges(graph, params)
    # matmul + bias as matmul_epilogue{bias} (one NPU step), formed after the range plan: its
    # rewrites look for dot_general; they keep value ids, and the fused op keeps the add's
    graph = fuse_matmul_epilogue(graph, accept=epilogue_accepts)
    lw = Lowerer(graph, params, prof)
    lw.run()
    try:
        outs = lw.finish()
    except ConversionError as e:
        raise UnsupportedError(str(e)) from None
    # graph-input boundaries: NPU users read the f32 rows through an fp16 pack; that pack wants
    # fp16 rows, so an input whose only row-major reader is a pack is written as fp16 directly
    finish_plan(plan, graph, lw.decisions)
    lg = LoweredGraph(graph, prof, lw.bufs, lw.calls, lw.inputs, outs, lw.decisions,
                      lw.retiles, lw.group, range_plan=plan)
    return lg
