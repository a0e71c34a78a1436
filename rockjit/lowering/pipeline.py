"""The lowering driver: IR graph -> placed calls -> memory plan -> schedule -> NpuProgram.

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
      -> program (program.py): BOs, relocations, jobs, host steps -> runtime Program

Broadcasts of run-time values are lowered lazily: a per-row operand is consumed by its user's
emitter (eltwise.lower_binary_row) and never materialized; only a user that needs the
broadcast tensor itself triggers its (host) lowering.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import UnsupportedError
from ..ir.graph import Graph, Node, Value
from ..ir.ops import Group, Op
from ..ir.reference import evaluate
from ..ir.types import DType
from .bounds import CompileBoundError, check_graph
from .fp16_range import saturate_consts
from .layouts import CubeLayout, WeightLayout
from .opprogram import BufferSpec, HostStep, NpuStep, OpProgram, Slice
from .partition import Decision, host_result, lower_node
from .profile import ChipProfile, get_profile
from .rules import forms as F
from .rules.shape import SLICE_PLACEMENTS
from .rules.base import (CubeForm, Form, NoNpuForm, OpCall, RowForm, RuleContext,
                         RuleResult, Tensor, Use, WeightForm)

# Ops whose value is known at compile time when all their inputs are.
_FOLDABLE = {Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.TRANSPOSE, Op.CONVERT, Op.SLICE,
             Op.CONCATENATE, Op.PAD, Op.IOTA, Op.CONSTANT}


def fold_consts(graph: Graph, params: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Compile-time values: params, constants, and data movement over them (a resident weight
    seen through a transpose or a bias through a broadcast is still a constant)."""
    out: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        if n.op is Op.PARAM:
            name = n.attrs["name"]
            if name not in params:
                from ..errors import WeightError
                raise WeightError(f"param {name!r} ({n.out.type}) at {n.loc} is not bound")
            out[n.out.id] = np.asarray(params[name])
        elif n.op is Op.BROADCAST_IN_DIM and n.inputs[0].id in out:
            # a read-only view: a scalar broadcast to a large shape must not become a large array
            # (its users read what they need; a write into it fails loudly)
            out[n.out.id] = _broadcast_view(out[n.inputs[0].id], n.attrs, n.out.type.shape)
        elif n.op in _FOLDABLE and all(v.id in out for v in n.inputs):
            out[n.out.id] = evaluate(n.op, [out[v.id] for v in n.inputs], n.attrs, n.out.type)
    return out


def _broadcast_view(x: np.ndarray, attrs: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """broadcast_in_dim (ir/reference.py's meaning) as a zero-copy view."""
    x = np.asarray(x)
    dims = [1] * len(shape)
    for src, dst in enumerate(attrs["broadcast_dimensions"]):
        dims[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(dims), shape)


@dataclass
class Buf:
    """A logical buffer: arena (placed by liveness), weights (uploaded once) or io."""

    id: int
    size: int
    kind: str                      # "arena" | "weights"
    name: str = ""
    data: np.ndarray | None = None
    pinned: bool = False
    zero: bool = False             # upload zeros once (a must-stay-zero tail lives here)
    align: int = 64
    first: int = 1 << 60
    last: int = -1


@dataclass
class PlacedCall:
    call: OpCall
    binding: dict[str, tuple[int, int]]   # buffer name -> (Buf id, offset); regcmd excluded
    group: int                            # parallel group (calls that may merge their steps)
    node: str


@dataclass
class Boundary:
    """A graph input or output and the row-major tensor that holds it."""

    index: int
    value: Value
    tensor: Tensor


@dataclass
class LoweredGraph:
    graph: Graph
    profile: ChipProfile
    bufs: list[Buf]
    calls: list[PlacedCall]
    inputs: list[Boundary]
    outputs: list[Boundary]
    decisions: list[Decision]
    retiles: int = 0
    groups: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    range_plan: Any = None         # range_plan.RangePlan of ``graph`` (the rewritten graph)


class ConversionError(NoNpuForm):
    pass


class Lowerer:
    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], profile: ChipProfile) -> None:
        self.graph = graph
        self.profile = profile
        self.producers = graph.producers()
        # a mask's finfo(f32).min or -inf would be -inf in fp16: saturated (fp16_range.py)
        self.consts = saturate_consts(fold_consts(graph, params))
        self.tensors: dict[int, list[Tensor]] = {}
        self.bufs: list[Buf] = []
        self.calls: list[PlacedCall] = []
        self.decisions: list[Decision] = []
        self.done: set[int] = set()
        self.retiles = 0
        self.group = 0
        self._conv_cache: dict[tuple, Tensor] = {}
        self.writes: dict[int, list[tuple[int, int]]] = {}   # buf id -> emitter write spans
        self.inputs: list[Boundary] = []
        # free channel concats: piece value id -> (concat value, channel offset, last piece);
        # concat value id -> the result cube the pieces are written into (None: given up)
        self.slots: dict[int, tuple[Value, int, bool]] = {}
        self.parents: dict[int, Tensor | None] = {}
        ids = [v.id for n in graph.nodes for v in n.outputs] + [v.id for v in graph.inputs]
        self._next_id = max(ids, default=0) + (1 << 20)

    # ---------------------------------------------------------------- buffers / tensors
    def new_buf(self, size: int, kind: str = "arena", name: str = "", data: np.ndarray | None = None,
                pinned: bool = False, align: int = 64) -> Buf:
        b = Buf(len(self.bufs), max(int(size), 1), kind, name, data, pinned, align=align)
        self.bufs.append(b)
        return b

    def add_tensor(self, value: Value, form: Form, buf: Buf, offset: int = 0) -> Tensor:
        t = Tensor(value.id, form, buf.id, offset, form.nbytes)
        self.tensors.setdefault(value.id, []).append(t)
        return t

    def forms(self, v: Value) -> list[Form]:
        return [t.form for t in self.tensors.get(v.id, [])]

    def ctx(self, node: Node) -> RuleContext:
        return RuleContext(self.profile, node, self.producers, self.consts, self.forms,
                           fresh=self.fresh_value, graph_inputs=self.graph.inputs,
                           sliced=lambda v: v.id in self.slots and self._slot_open(v))

    def fresh_value(self, t) -> Value:
        """A value id no graph node uses, for a rule's private intermediate."""
        self._next_id += 1
        return Value(self._next_id, t)

    # ---------------------------------------------------------------- driving
    def run(self) -> None:
        from ..ir.passes.fuse import find_activations

        g = self.graph
        # composite activations (GELU's erf/tanh spellings, SiLU) become one LUT activation;
        # their interior nodes are only lowered if something else needs them
        self.fused = find_activations(g, self.consts)
        self.absorbed = {i for a in self.fused.values() for i in a.absorbed}
        for i, v in enumerate(g.inputs):
            # graph inputs arrive row-major in their IR dtype (the boundary writes them)
            buf = self.new_buf(RowForm(v.type.dtype, v.type.shape).nbytes, name=f"in{i}",
                               pinned=True)
            t = self.add_tensor(v, RowForm(v.type.dtype, v.type.shape), buf)
            self.inputs.append(Boundary(i, v, t))
        self._plan_slots()
        users = g.users()
        from ..progress import progress
        for node in progress(g.nodes, "lowering"):
            if node.out.id in self.consts or node.op in (Op.PARAM, Op.CONSTANT):
                self.decisions.append(Decision(f"%{node.out.id} = {node.op.text}", str(node.loc),
                                               "const", "compile time"))
                continue
            if self._deferred(node, users) or node.out.id in self.absorbed:
                continue
            self.lower(node)

    def _plan_slots(self) -> None:
        """Before lowering: which values should be produced straight into a channel slice of a
        later op's result (a channel concat's pieces), so that op moves no byte. Only values
        made by a node (not graph inputs, not constants), each for one op."""
        g = self.graph
        atom = self.profile.input(DType.F16).feature_c2
        inputs = {v.id for v in g.inputs}
        for n in g.nodes:
            hint = SLICE_PLACEMENTS.get(n.op)
            if hint is None or n.out.id in self.consts:
                continue
            slots = hint(n, atom)
            if not slots or any(v.id in self.consts or v.id in inputs or v.id in self.slots
                                or v.id not in self.producers for v, _ in slots):
                continue
            for i, (v, off) in enumerate(slots):
                self.slots[v.id] = (n.out, off, i == len(slots) - 1)

    def _deferred(self, node: Node, users: Mapping[int, list[Node]]) -> bool:
        """A broadcast of a run-time value waits until someone needs its tensor."""
        return node.op is Op.BROADCAST_IN_DIM and node.out not in self.graph.outputs and \
            int(np.prod(node.inputs[0].type.shape, dtype=np.int64)) != node.out.type.size

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
        act = getattr(self, "fused", {}).get(node.out.id)
        if act is not None and self._lower_fused(node, act):
            return
        for v in node.inputs:
            p = self.producers.get(v.id)
            if p is None or not self._deferred(p, {}):
                self.demand(v)
        ctx = self.ctx(node)
        res, why = lower_node(ctx)
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

    def _lower_fused(self, node: Node, act) -> bool:
        """A fused composite activation as one LUT op; False (lower the nodes one by one)
        when the LUT has no form for it here."""
        from .rules.eltwise import lut_result

        self.demand(act.x)
        try:
            res = lut_result(self.ctx(node), act.kind, act.x, node.out,
                             note=f"fused from {act.ops} ops")
        except NoNpuForm:
            for i in act.absorbed:
                self.absorbed.discard(i)
            return False
        try:
            self._place(node, res)
        except ConversionError as e:
            raise UnsupportedError(f"{node.op.text} at {node.loc}: {e}") from None
        self.decisions.append(Decision(f"%{node.out.id} = {act.kind}(%{act.x.id})",
                                       str(node.loc), "npu", res.calls[0].emitter, res.note))
        return True

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

    def _apply_join(self, node: Node, res: RuleResult) -> bool:
        """A view over several operands (a channel concat): the result is operand 0's cube
        widened to every channel, provided each operand is already stored as the channel slice
        of that cube at its offset (placed there by _slot_tensor, or slices of one cube)."""
        if node.out.id in self.parents and self.parents[node.out.id] is None:
            return False
        for t0 in self.tensors.get(node.inputs[0].id, []):
            d = res.view.derive(t0.form)
            if d is None:
                continue
            pform, off = d
            base = t0.offset + off
            last = len(node.inputs) - 1
            held = [self._holds_slice(v, t0.buf, base, pform, c, i == last)
                    for i, (v, c) in enumerate(zip(node.inputs, res.view.parts))]
            if any(t is None for t in held):
                continue
            # the last piece's padded channels (computed zeros, e.g. a matmul's N padding)
            # are the result's padding too: a reader of more channel groups reads them
            lay = pform.layout
            pad = res.view.parts[-1] + held[-1].form.layout.channels
            if pad > lay.channels:
                pform = F.with_layout(pform, CubeLayout(lay.height, lay.width, pad, lay.c2,
                                                        lay.dtype, lay.line_stride,
                                                        lay.surf_stride))
            self.tensors.setdefault(node.out.id, []).append(
                Tensor(node.out.id, pform, t0.buf, base, pform.nbytes))
            return True
        return False

    def _holds_slice(self, v: Value, buf: int, base: int, parent: CubeForm, c_off: int,
                     last: bool) -> Tensor | None:
        """``v`` is stored in ``buf`` as channels [c_off, c_off + width) of the cube
        ``parent`` at ``base``. A piece other than the last must not claim channel groups past
        its own: those are the next piece's, never its zero padding."""
        r = len(parent.shape)
        w = v.type.shape[-1]
        try:
            sl = F.slice_form(parent, (0,) * (r - 1) + (c_off,), parent.shape[:-1] + (c_off + w,),
                              (1,) * r)
        except Exception:   # an empty piece has no cube
            return None
        if sl is None:
            return None
        want, soff = sl
        for t in self.tensors.get(v.id, []):
            if t.buf != buf or t.offset != base + soff or not isinstance(t.form, CubeForm):
                continue
            have = t.form.layout
            if not F.same_axes(t.form, want) or F.layouts_agree(have, want.layout) != "":
                continue
            if last or have.groups == want.layout.groups:
                return t
        return None

    def _slot_open(self, v: Value) -> bool:
        """``v`` is a concat piece whose concat has not been given up."""
        cv = self.slots[v.id][0]
        return not (cv.id in self.parents and self.parents[cv.id] is None)

    def _slot_tensor(self, v: Value, full: Form, spec: BufferSpec) -> Tensor | None:
        """Where an emitter writes ``v`` when ``v`` is a piece of a channel concat: its channel
        slice of the concat's result cube (DST address = the slice's first group, the parent's
        surface stride), so the concat is a view. None (its own buffer) when the cube does not
        fit the slice: another geometry, a row-major (host) result, or a padded write span
        that would reach the next piece's groups; the concat then goes to the host, and the
        pieces still to come get buffers of their own."""
        slot = self.slots.get(v.id)
        if slot is None or not self._slot_open(v):
            return None
        cv = slot[0]
        t = self._fit_slot(v, full, spec)
        if t is None:
            self.parents[cv.id] = None
        return t

    def _fit_slot(self, v: Value, full: Form, spec: BufferSpec) -> Tensor | None:
        cv, c_off, last = self.slots[v.id]
        if not isinstance(full, CubeForm):
            return None
        parent = self.parents.get(cv.id)
        if parent is not None and any(t.buf == parent.buf for t in self.tensors.get(v.id, [])):
            # written twice (a second pass of its op): the slice may no longer hold the final
            # value when the concat is read
            return None
        pform = parent.form if parent is not None else F.channel_parent(full, cv.type.shape)
        if pform is None:
            return None
        r = len(full.shape)
        try:
            sl = F.slice_form(pform, (0,) * (r - 1) + (c_off,),
                              pform.shape[:-1] + (c_off + full.shape[-1],), (1,) * r)
        except Exception:   # an empty piece has no cube
            return None
        if sl is None:
            return None
        want, soff = sl
        lay = full.layout
        if (not F.same_axes(full, want) or F.layouts_agree(lay, want.layout) != ""
                or lay.height != want.layout.height):
            return None
        # the emitter writes its whole padded span: it must end where the next piece begins
        if not last and max(full.nbytes, spec.nbytes) > want.layout.groups * lay.surf_stride:
            return None
        if parent is None:
            buf = self.new_buf(pform.nbytes, name=f"%{cv.id}")
            parent = self.parents[cv.id] = Tensor(cv.id, pform, buf.id, 0, pform.nbytes)
        return self.add_tensor(v, full, self.bufs[parent.buf], parent.offset + soff)

    # ---------------------------------------------------------------- placing calls
    def _place(self, node: Node, res: RuleResult) -> None:
        # Only a rule's independent calls (``parallel``) share a group, whose steps the
        # scheduler merges; dependent calls each get their own, so they run in order.
        out_tensors: dict[int, Tensor] = {}
        for i, call in enumerate(res.calls):
            if i == 0 or not res.parallel:
                self.group += 1
            self._place_call(call, self.group, f"%{node.out.id} = {node.op.text}", out_tensors)

    def _spec_form(self, spec: BufferSpec, use: Use, forced: Form | None) -> Form:
        if forced is not None:
            return forced
        shape = tuple(use.shape or self._use_shape(use))
        if isinstance(spec.layout, WeightLayout):
            nb = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
            return WeightForm(spec.layout, shape, spec.nbytes // nb if nb > 1 else 0)
        if spec.layout is not None:
            roles = use.roles or F.default_roles(len(shape))
            nb = int(np.prod([n for r, n in zip(roles, shape) if r == "b"], dtype=np.int64))
            if nb > 1 and spec.shape is not None and len(spec.shape) == len(shape):
                # an emitter batch: items contiguous, nbytes / items apart
                return F.cube_form(spec.layout, shape, roles, spec.nbytes // nb)
            return F.cube_form(spec.layout, shape, roles)
        dt = DType(spec.dtype) if spec.dtype else use.value.type.dtype
        return RowForm(dt, tuple(spec.shape) if spec.shape else shape)

    @staticmethod
    def _use_shape(use: Use) -> tuple[int, ...]:
        s = use.value.type.shape[len(use.index):]
        if use.perm:
            s = tuple(s[p] for p in use.perm)
        return tuple(s)

    def _place_call(self, call: OpCall, group: int, label: str,
                    out_tensors: dict[int, Tensor]) -> None:
        binding: dict[str, tuple[int, int]] = {}
        prog = call.program
        # inputs first (conversions they need are placed before this call)
        for spec in prog.buffers:
            if spec.role != "input":
                continue
            use = call.operands[spec.bind]
            forced = call.forms_in[spec.bind] if call.forms_in else None
            want = self._spec_form(spec, use, forced)
            t = self.get_tensor(use, want)
            buf = self.bufs[t.buf]
            need = t.offset + max(spec.nbytes, t.nbytes)
            if buf.kind == "arena" and need > buf.size:
                # the emitter reads a padded span past the tensor: give its buffer the room
                buf.size = need
            if spec.nbytes > t.written:
                self._finite_tail(buf, t.offset + t.written, t.offset + spec.nbytes)
            binding[spec.name] = (t.buf, t.offset)
        for spec in prog.buffers:
            if spec.role == "output":
                use = call.results[spec.bind]
                forced = call.forms_out[spec.bind] if call.forms_out else None
                t = self._output_tensor(spec, use, forced, out_tensors)
                buf = self.bufs[t.buf]
                need = t.offset + max(spec.nbytes, t.nbytes)
                if need > buf.size:
                    buf.size = need
                binding[spec.name] = (t.buf, t.offset)
                if spec.zero:
                    # positions of the result the op never writes are read as zero by its
                    # consumer: zero-filled once, never shared (no other tensor's bytes land
                    # there, and each run rewrites only the written positions)
                    buf.size = max(buf.size, need)
                    buf.pinned = buf.zero = True
                # the emitter writes its whole (padded) span: bytes past the cube get padding
                # results, so they can never serve as a reader's zero tail (_tail_free)
                self.writes.setdefault(t.buf, []).append((t.offset, need))
            elif spec.role == "scratch":
                b = self.new_buf(spec.nbytes, name=f"{label}:{spec.name}", align=max(spec.align, 64))
                if spec.zero:
                    # padding the op never writes must read as zero: zero-filled once, never
                    # shared with another buffer
                    b.pinned = b.zero = True
                binding[spec.name] = (b.id, 0)
            elif spec.role == "const":
                data = spec.data if spec.data is not None else np.zeros(spec.nbytes, np.uint8)
                b = self.new_buf(spec.nbytes, "weights", f"{label}:{spec.name}",
                                 np.ascontiguousarray(data).reshape(-1).view(np.uint8),
                                 align=max(spec.align, 64))
                binding[spec.name] = (b.id, 0)
        self.calls.append(PlacedCall(call, binding, group, label))

    def _output_tensor(self, spec: BufferSpec, use: Use, forced: Form | None,
                       out_tensors: dict[int, Tensor]) -> Tensor:
        v = use.value
        if not use.index:
            form = self._spec_form(spec, use, forced)
            full = F.reshape(form, v.type.shape)
            if full is None:
                raise ConversionError(f"emitter output {spec.name} ({form}) cannot hold "
                                      f"{v.type}")
            sliced = self._slot_tensor(v, full, spec)
            if sliced is not None:
                return sliced
            buf = self.new_buf(max(full.nbytes, spec.nbytes), name=f"%{v.id}")
            return self.add_tensor(v, full, buf)
        # one batch element of a batched result: the whole value is one tensor whose batch
        # axes step by the element's (aligned) size
        whole = out_tensors.get(v.id)
        sub_shape = v.type.shape[len(use.index):]
        if whole is None:
            form = self._spec_form(spec, use, forced)
            sub = F.reshape(form, sub_shape)
            if sub is None:
                raise ConversionError(f"emitter output {spec.name} cannot hold {sub_shape}")
            nb = len(use.index)
            bshape = v.type.shape[:nb]
            if isinstance(sub, CubeForm):
                step = -(-max(sub.nbytes, spec.nbytes) // 64) * 64
                strides, acc = [], step
                for n in reversed(bshape):
                    strides.append(acc)
                    acc *= n
                full = CubeForm(sub.layout, ("b",) * nb + sub.roles,
                                tuple(reversed(strides)) + sub.strides, v.type.shape)
                size = acc
            else:
                full = RowForm(sub.dtype, v.type.shape)
                size = full.nbytes
            buf = self.new_buf(size, name=f"%{v.id}")
            whole = self.add_tensor(v, full, buf)
            out_tensors[v.id] = whole
        f, off = whole.form.sub(use.index)
        return Tensor(v.id, f, whole.buf, whole.offset + off, f.nbytes)

    # ---------------------------------------------------------------- residency
    def view_of(self, t: Tensor, use: Use) -> tuple[Form, int] | None:
        f: Form | None = t.form
        off = 0
        try:
            if use.index:
                f, off = f.sub(use.index)
        except NoNpuForm:
            return None
        if use.perm:
            f = F.transpose(f, use.perm)
            if f is None:
                return None
        shape = use.shape or self._use_shape(use)
        f = F.reshape(f, shape)
        if f is None:
            return None
        return f, t.offset + off

    def _agree(self, have: Form, want: Form) -> str | None:
        """None: incompatible; '' in place; 'tail': in place with a zero tail."""
        if isinstance(have, RowForm) and isinstance(want, RowForm):
            return "" if have.dtype == want.dtype and have.shape == want.shape else None
        if isinstance(have, WeightForm) or isinstance(want, WeightForm):
            return "" if have == want else None
        if isinstance(have, CubeForm) and isinstance(want, CubeForm):
            if not F.same_axes(have, want):
                return None
            r = F.layouts_agree(have.layout, want.layout)
            return r if r in ("", "tail") else None
        return None

    def get_tensor(self, use: Use, want: Form) -> Tensor:
        v = use.value
        if v.id in self.consts:
            return self._const_tensor(use, want)
        self.demand(v)
        for t in self.tensors.get(v.id, []):
            vw = self.view_of(t, use)
            if vw is None:
                continue
            f, off = vw
            agree = self._agree(f, want)
            if agree is None:
                continue
            if agree == "tail":
                if not self._tail_free(t.buf, off + f.nbytes, off + want.nbytes):
                    continue
                self._zero_tail(t, off, f, want)
            return Tensor(v.id, want, t.buf, off, f.nbytes)
        return self._convert(use, want)

    def _tail_free(self, buf: int, start: int, end: int) -> bool:
        """No emitter writes bytes [start, end) of ``buf``: a reader may take them as the
        zero channel groups past a cube (zero-filled once at load). A channel-slice view's
        neighbour groups (the parent's other channels) and an element-wise op's padded span
        are written, so such a tail needs a re-tile instead."""
        return all(e <= start or s >= end for s, e in self.writes.get(buf, ()))

    def _finite_tail(self, buf: Buf, start: int, end: int) -> None:
        """An emitter reads bytes [start, end) past what the tensor's producer writes (the
        element-wise flat view's padded span). They are not ignored: the flat view's identity
        conv sums a flat row's 32 channels, which are atoms one chunk-surface apart, so a tail
        atom meets real atoms in the MAC and 0 * Inf or NaN (stale bytes: an f32 tensor's bits
        read as fp16) makes the real outputs NaN. The tail must hold finite values: an arena
        buffer is zero-filled once and never shared (no other tensor's bytes land there); a
        constant is padded with zeros. A tail an emitter writes (an element-wise producer's
        own padded span) holds its padding results, finite when its inputs' tails are."""
        if self._written(buf.id, start, end):
            return
        if buf.kind == "arena":
            buf.size = max(buf.size, end)
            buf.pinned = buf.zero = True
        elif buf.data is not None and buf.data.size < end:
            buf.data = np.concatenate([buf.data, np.zeros(end - buf.data.size, np.uint8)])
            buf.size = max(buf.size, end)

    def _written(self, buf: int, start: int, end: int) -> bool:
        """Emitter write spans of ``buf`` cover [start, end)."""
        for s, e in sorted(self.writes.get(buf, ())):
            if s <= start < e:
                start = e
            if start >= end:
                return True
        return start >= end

    def _zero_tail(self, t: Tensor, off: int, have: CubeForm, want: CubeForm) -> None:
        """The reader reads channel groups the writer never writes: they must be zero, so the
        buffer is pinned (never shared) and zero-filled at load."""
        buf = self.bufs[t.buf]
        buf.size = max(buf.size, off + want.nbytes)
        buf.pinned = True
        buf.zero = True

    def _const_tensor(self, use: Use, want: Form) -> Tensor:
        """A compile-time value in the asked form: packed now, uploaded with the weights."""
        a = np.asarray(self.consts[use.value.id])
        if use.index:
            a = a[use.index]
        if use.perm:
            a = np.transpose(a, use.perm)
        a = a.reshape(use.shape or a.shape)
        if isinstance(want, RowForm):
            data = np.ascontiguousarray(a.astype(want.dtype.to_numpy())).reshape(-1).view(np.uint8)
        else:
            data = np.zeros(want.nbytes, np.uint8)
            self._pack_into(data, want, a)
        b = self.new_buf(data.size, "weights", f"const%{use.value.id}", data)
        return Tensor(use.value.id, want, b.id, 0, want.nbytes)

    @staticmethod
    def _natural(form: CubeForm) -> bool:
        """Row-major order of the value == the cubes' (b..., h, w, c) order. Unit axes hold
        one element whatever their role, so only the axes of extent > 1 decide."""
        roles = [r for r, n in zip(form.roles, form.shape) if n != 1]
        rest = [r for r in roles if r != "b"]
        if rest and "b" in roles[roles.index(rest[0]):]:
            return False
        order = {"h": 0, "w": 1, "c": 2}
        return [order[r] for r in rest] == sorted(order[r] for r in rest)

    def _pack_into(self, data: np.ndarray, form: CubeForm, a: np.ndarray) -> None:
        if not self._natural(form):
            # a constant is packed at compile time: transpose it into the cube's axis order
            rank = {"b": 0, "h": 1, "w": 2, "c": 3}
            order = sorted(range(len(form.roles)),
                           key=lambda i: (rank[form.roles[i]], -form.strides[i], i))
            a = np.transpose(np.asarray(a).reshape(form.shape), order)
            form = form.permuted(order)
            if not self._natural(form):
                raise ConversionError(f"a constant seen as a cube view ({form.roles}) that no "
                                      f"axis order makes a plain cube")
        h, w, c = form.hwc()
        items = form.batch_items()
        flat = np.asarray(a, form.layout.dtype).reshape(len(items), h, w, c)
        for (ix, off), item in zip(items, flat):
            lay = CubeLayout(h, w, c, form.layout.c2, form.layout.dtype, form.layout.line_stride,
                             form.layout.surf_stride)
            packed = lay.pack(np.ascontiguousarray(item))
            data[off:off + packed.size] = packed

    def _rows_of(self, v: Value, dtype: DType) -> Tensor:
        """The whole value, row-major, in ``dtype`` (cached)."""
        for t in self.tensors.get(v.id, []):
            if isinstance(t.form, RowForm) and t.form.dtype == dtype and t.form.shape == v.type.shape:
                return t
        src = None
        for t in self.tensors.get(v.id, []):
            if isinstance(t.form, RowForm) and t.form.shape == v.type.shape:
                src = t
        if v in self.graph.inputs:
            # the boundary writes the input again in the wanted dtype (a cast on the copy in)
            buf = self.new_buf(RowForm(dtype, v.type.shape).nbytes, name=f"in%{v.id}:{dtype.value}",
                               pinned=True)
            t = self.add_tensor(v, RowForm(dtype, v.type.shape), buf)
            self.inputs.append(Boundary(self.graph.inputs.index(v), v, t))
            return t
        if src is None:
            cube = next((t for t in self.tensors.get(v.id, []) if isinstance(t.form, CubeForm)), None)
            if cube is None:
                raise ConversionError(f"%{v.id} has no stored form to convert from")
            src = self._unpack(v, cube)
        if src.form.dtype != dtype:
            src = self._host_convert(v, src, dtype)
        return src

    def _conversion_call(self, steps: list[HostStep], bufs: list[BufferSpec], operands, results,
                         label: str, forms_in, forms_out, boundary: bool = False) -> None:
        prog = OpProgram(tuple(bufs), tuple(steps))
        self.group += 1
        call = OpCall(prog, tuple(operands), tuple(results), label=label, where="host",
                      emitter="pipeline re-tile", retile=not boundary, forms_in=tuple(forms_in),
                      forms_out=tuple(forms_out))
        if not boundary:
            self.retiles += 1
        self._place_call(call, self.group, label, {})

    def _unpack(self, v: Value, cube: Tensor, boundary: bool = False) -> Tensor:
        form = cube.form
        if not self._natural(form):
            return self._unpack_transposed(v, cube)
        dt = form.dtype
        rows = RowForm(dt, v.type.shape)
        h, w, c = form.hwc()
        es = form.layout.esize
        item_bytes = h * w * c * es
        steps, specs = [], [BufferSpec("src", "input", form.nbytes, layout=form.layout, bind=0),
                            BufferSpec("dst", "output", rows.nbytes, dtype=dt.value,
                                       shape=rows.shape, bind=0)]
        for k, (ix, off) in enumerate(form.batch_items()):
            steps.append(HostStep("unpack_cube", {"src": Slice("src", off, form.layout.nbytes),
                                                  "dst": Slice("dst", k * item_bytes, item_bytes)},
                                  {"height": h, "width": w, "channels": c,
                                   "c2": form.layout.c2, "esize": es,
                                   "line_stride": form.layout.line_stride,
                                   "surf_stride": form.layout.surf_stride}))
        self._conversion_call(steps, specs, [Use(v)], [Use(v)], f"unpack %{v.id}", [form], [rows],
                              boundary)
        return next(t for t in self.tensors[v.id] if t.form == rows)

    def _unpack_transposed(self, v: Value, cube: Tensor) -> Tensor:
        """A cube seen through a transpose (its logical axes permuted against the cube's
        b/h/w/c order): unpack the cube in its own order, then one strided host copy puts the
        axes in the value's order. Both steps are counted re-tiles: a transpose is data
        movement the NPU has no form for."""
        from .host_rules import HostView, host_op_step, row_major_strides

        form = cube.form
        rank = {"b": 0, "h": 1, "w": 2, "c": 3}
        order = sorted(range(len(form.roles)),
                       key=lambda i: (rank[form.roles[i]], -form.strides[i], i))
        nat = form.permuted(order)
        if not self._natural(nat):
            raise ConversionError(f"%{v.id} is held as a cube view ({form.roles}) that no axis "
                                  f"order makes a plain cube")
        dt = form.dtype
        nat_rows = RowForm(dt, nat.shape)
        tmp = self.new_buf(nat_rows.nbytes, name=f"%{v.id}:unpackT")
        h, w, c = nat.hwc()
        es = nat.layout.esize
        item = h * w * c * es
        steps = []
        for k, (ix, off) in enumerate(nat.batch_items()):
            steps.append(HostStep("unpack_cube", {"src": Slice("src", off, nat.layout.nbytes),
                                                  "dst": Slice("dst", k * item, item)},
                                  {"height": h, "width": w, "channels": c, "c2": nat.layout.c2,
                                   "esize": es, "line_stride": nat.layout.line_stride,
                                   "surf_stride": nat.layout.surf_stride}))
        rows = RowForm(dt, v.type.shape)
        out = self.new_buf(rows.nbytes, name=f"%{v.id}:rows")
        # value axis i is cube-order axis order.index(i)
        ns = row_major_strides(nat.shape)
        src_strides = [ns[order.index(i)] for i in range(len(order))]
        sizes = {"dst": nat_rows.nbytes, "rows": rows.nbytes, "tdesc": 0}
        st, desc = host_op_step("copy", v.type.shape, HostView("rows", dt, 0,
                                                               row_major_strides(v.type.shape)),
                                [HostView("dst", dt, 0, src_strides)], sizes, "tdesc",
                                what=f"transpose of %{v.id}")
        # the copy reads "dst" (the unpacked rows) as its input: rename for the binding
        st = HostStep(st.kind, {"dst": Slice("rows", 0, rows.nbytes), "src": Slice("dst", 0, nat_rows.nbytes),
                                "desc": st.operands["desc"]})
        steps.append(st)
        specs = (BufferSpec("src", "input", form.nbytes, layout=form.layout),
                 BufferSpec("dst", "scratch", nat_rows.nbytes), desc,
                 BufferSpec("rows", "output", rows.nbytes))
        dbuf = self.new_buf(desc.nbytes, "weights", f"T%{v.id}:desc", desc.data)
        self.group += 1
        self.retiles += 1
        call = OpCall(OpProgram(specs, tuple(steps)), (Use(v),), (Use(v),), f"unpack^T %{v.id}",
                      "host", "pipeline re-tile", True)
        self.calls.append(PlacedCall(call, {"src": (cube.buf, cube.offset), "dst": (tmp.id, 0),
                                            "tdesc": (dbuf.id, 0), "rows": (out.id, 0)},
                                     self.group, call.label))
        return self.add_tensor(v, rows, out)

    def _host_convert(self, v: Value, src: Tensor, dtype: DType) -> Tensor:
        from . import partition
        hr = partition.host_rules()
        if Op.CONVERT not in hr:
            raise ConversionError(f"converting %{v.id} from {src.form.dtype.value} to "
                                  f"{dtype.value} needs the host convert op (host_rules), "
                                  f"which is not available")
        from ..ir.types import TensorType
        node = Node(Op.CONVERT, (Value(v.id, TensorType(src.form.dtype, v.type.shape)),),
                    (Value(v.id, TensorType(dtype, v.type.shape)),), {}, None)
        prog = hr[Op.CONVERT](node)
        rows = RowForm(dtype, v.type.shape)
        self.group += 1
        self.retiles += 1
        call = OpCall(prog, (Use(v),), (Use(v),), f"convert %{v.id}", "host",
                      "host_rules[convert]", True, (src.form,), (rows,))
        self._place_call(call, self.group, call.label, {})
        return next(t for t in self.tensors[v.id] if t.form == rows)

    def _convert(self, use: Use, want: Form) -> Tensor:
        """Make the use's view of the value in form ``want`` through the host (counted)."""
        v = use.value
        key = (v.id, use.index, use.perm, use.shape, repr(want))
        if key in self._conv_cache:
            return self._conv_cache[key]
        dtype = want.dtype if isinstance(want, RowForm) else DType.F16
        rows = self._rows_of(v, dtype)
        if use.perm and tuple(use.perm) != tuple(range(len(use.perm))):
            rows = self._host_transpose(v, rows, use)
            use = Use(v, use.index, None, use.shape, use.roles)
        sub, off = rows.form.sub(use.index)
        sub = RowForm(sub.dtype, use.shape or sub.shape)
        if isinstance(want, RowForm):
            t = Tensor(v.id, sub, rows.buf, rows.offset + off, sub.nbytes)
            self._conv_cache[key] = t
            return t
        if isinstance(want, WeightForm):
            return self._pack_weight(use, want, rows, off, sub, key)
        # rows -> cube: one pack step per cube of the wanted form
        if not self._natural(want):
            raise ConversionError(f"%{v.id} is needed as a transposed cube ({want.roles})")
        h, w, c = want.hwc()
        es = want.layout.esize
        item_bytes = h * w * c * es
        out = self.new_buf(want.nbytes, name=f"%{v.id}:retile")
        steps = []
        specs = [BufferSpec("src", "input", sub.nbytes, dtype="f16", shape=sub.shape, bind=0),
                 BufferSpec("dst", "output", want.nbytes, layout=want.layout, bind=0)]
        items = self._pack_items(v, want, h, w)
        if len(items) == 1 and len(want.batch_items()) > 1:
            h *= len(want.batch_items())    # the batch folded into the cube's rows: one pack
        for k, (ix, boff) in enumerate(items):
            steps.append(HostStep("pack_cube", {"src": Slice("src", k * item_bytes, item_bytes),
                                                "dst": Slice("dst", boff, want.layout.nbytes)},
                                  {"height": h, "width": w, "channels": c, "c2": want.layout.c2,
                                   "esize": es, "line_stride": want.layout.line_stride,
                                   "surf_stride": want.layout.surf_stride}))
        # the packer writes the logical channels' groups; any groups past them up to the
        # layout's must read as zero
        if want.layout.groups > -(-c // want.layout.c2) or want.layout.height > h:
            out.pinned = True
            out.zero = True
        prog = OpProgram(tuple(specs), tuple(steps))
        self.group += 1
        if v not in self.graph.inputs:   # packing a graph input is the boundary, not a re-tile
            self.retiles += 1
        tmp = Tensor(v.id, want, out.id, 0, want.nbytes)
        src_t = Tensor(v.id, sub, rows.buf, rows.offset + off, sub.nbytes)
        binding = {"src": (src_t.buf, src_t.offset), "dst": (out.id, 0)}
        call = OpCall(prog, (use,), (use,), f"pack %{v.id}", "host", "pipeline re-tile", True)
        self.calls.append(PlacedCall(call, binding, self.group, f"pack %{v.id}"))
        if not use.index and not use.perm and (use.shape is None or use.shape == v.type.shape):
            self.tensors[v.id].append(tmp)
        else:
            full = F.reshape(want, v.type.shape) if not use.index else None
            if full is not None:
                self.tensors[v.id].append(Tensor(v.id, full, out.id, 0, want.nbytes))
        self._conv_cache[key] = tmp
        return tmp

    @staticmethod
    def _pack_items(v: Value, want: CubeForm, h: int, w: int) -> list[tuple[tuple, int]]:
        """The cubes one pack step each writes. The packer zero-fills its whole layout extent
        (every channel group's plane) before copying, so items must not share a plane: a
        batch folded into the cube's rows (items h lines apart in one taller layout, as a
        batched matmul or element-wise op sees B x T rows) is packed as one cube of all the
        rows; any other interleaving is refused rather than packed over its neighbours."""
        items = want.batch_items()
        lay = want.layout
        if len(items) == 1:
            return items
        offs = sorted(off for _, off in items)
        if all(b >= a + lay.nbytes for a, b in zip(offs, offs[1:])):
            return items                          # separate cubes
        rows = h * lay.line_stride
        if w == lay.width and len(items) * h <= lay.height and \
                [off for _, off in items] == [k * rows for k in range(len(items))]:
            return [((), 0)]
        raise ConversionError(f"%{v.id}: its cubes interleave in one layout ({want.roles}, "
                              f"strides {want.strides}) in a way one pack per cube would "
                              f"overwrite; pack it row-major first")

    def _host_transpose(self, v: Value, rows: Tensor, use: Use) -> Tensor:
        """The value with its axes after ``use.index`` permuted, row-major, by the host-op
        library's strided copy (no on-device transpose exists; counted re-tile)."""
        from ..ir.types import TensorType
        from . import partition
        nb = len(use.index)
        perm = tuple(range(nb)) + tuple(nb + p for p in use.perm)
        shape = tuple(v.type.shape[p] for p in perm)
        dt = rows.form.dtype
        rule = partition.host_rules().get(Op.TRANSPOSE)
        if rule is None:
            raise ConversionError(f"%{v.id} is needed transposed and no host transpose exists")
        node = Node(Op.TRANSPOSE, (Value(v.id, TensorType(dt, v.type.shape)),),
                    (Value(v.id, TensorType(dt, shape)),), {"permutation": perm}, None)
        prog = rule(node)
        out = self.new_buf(RowForm(dt, shape).nbytes, name=f"%{v.id}:T")
        binding = {}
        for spec in prog.buffers:
            if spec.role == "input":
                binding[spec.name] = (rows.buf, rows.offset)
            elif spec.role == "output":
                binding[spec.name] = (out.id, 0)
            elif spec.role == "const":
                b = self.new_buf(spec.nbytes, "weights", f"T%{v.id}:{spec.name}",
                                 np.ascontiguousarray(spec.data).reshape(-1).view(np.uint8))
                binding[spec.name] = (b.id, 0)
            elif spec.role == "scratch":
                binding[spec.name] = (self.new_buf(spec.nbytes).id, 0)
        self.group += 1
        self.retiles += 1
        call = OpCall(prog, (Use(v),), (Use(v),), f"transpose %{v.id}", "host",
                      "host_rules[transpose]", True)
        self.calls.append(PlacedCall(call, binding, self.group, call.label))
        return Tensor(v.id, RowForm(dt, shape), out.id, 0, RowForm(dt, shape).nbytes)

    def _pack_weight(self, use: Use, want: WeightForm, rows: Tensor, off: int, sub: RowForm,
                     key: tuple) -> Tensor:
        """Row-major fp16 [.., N, K] -> the weight layout, one host pack_weight per element:
        an activation has no on-device route into the weight layout (counted re-tile)."""
        v = use.value
        lay = want.layout
        n, k = want.shape[-2:]
        items = int(np.prod(want.shape[:-2], dtype=np.int64)) if len(want.shape) > 2 else 1
        es = lay.dtype.itemsize
        out = self.new_buf(want.nbytes, name=f"%{v.id}:weights")
        specs = [BufferSpec("src", "input", sub.nbytes, dtype="f16", shape=sub.shape, bind=0),
                 BufferSpec("dst", "output", want.nbytes, bind=0)]
        steps = [HostStep("pack_weight", {"src": Slice("src", i * n * k * es, n * k * es),
                                          "dst": Slice("dst", i * want.stride, lay.nbytes)},
                          {"kernels": n, "channels": k, "kh": 1, "kw": 1,
                           "n_group": lay.n_group, "k_group": lay.k_group, "esize": es})
                 for i in range(items)]
        # the packer zero-fills its kernels rounded up to n_group; a layout with more kernels
        # (a matmul's N tile padded further: attention scores over 196 keys use 224) keeps
        # the rest, which the matmul multiplies into its padding channels. Stale NaN there
        # reaches real outputs through a later ones-vector row sum (0 * NaN): zero-fill once.
        if lay.kernels > -(-n // lay.n_group) * lay.n_group or \
                lay.channels > -(-k // lay.k_group) * lay.k_group:
            out.pinned = out.zero = True
        self.group += 1
        self.retiles += 1
        call = OpCall(OpProgram(tuple(specs), tuple(steps)), (use,), (use,), f"pack_weight %{v.id}",
                      "host", "pipeline re-tile", True)
        self.calls.append(PlacedCall(call, {"src": (rows.buf, rows.offset + off),
                                            "dst": (out.id, 0)}, self.group, call.label))
        t = Tensor(v.id, want, out.id, 0, want.nbytes)
        self._conv_cache[key] = t
        return t

    # ---------------------------------------------------------------- outputs
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
    made by ``build_program`` (program.py).

    The result depends on the graph, the resident ``params`` and the profile only: no run-time
    value is looked at (LUT domains come from the functions, calibrate.py), so compiling from
    ``jax.ShapeDtypeStruct`` inputs and after a call give the same program."""
    from .range_plan import finish_plan, plan_ranges
    from .value_checks import check_weights

    check_weights(graph, params)     # a NaN or > 65504 weight is refused, never saturated
    prof = get_profile(profile) if isinstance(profile, str) else profile
    check_graph(graph)  # before anything is allocated at the graph's sizes
    # bounds, and the norm-statistics rewrite where a square could overflow fp16; the rest of
    # the lowering sees the rewritten graph (equal to the original in exact arithmetic)
    graph, plan = plan_ranges(graph, params)
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
