"""Concat slots: a channel concat's pieces are written straight into their channel slices of
the concat's result cube, so the concat is a view and moves no byte."""
from __future__ import annotations



from ..ir.graph import Node, Value
from ..ir.types import DType
from .layouts import CubeLayout
from .op_lowering import BufferSpec
from .rules import forms as F
from .rules.shape import SLICE_PLACEMENTS
from .rules.base import CubeForm, Form, RuleResult, Tensor


class ConcatSlots:
    """The concat-slot part of a Lowerer (pipeline.py)."""

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
