"""Residency: where each value is stored, and binding an OpCall's buffers to stored tensors
of the forms it asks for (a view when the layouts agree, a zero tail where allowed, else a
layout conversion, layout_conversion.py)."""
from __future__ import annotations

import math

import numpy as np

from .arith import round_up
from ..ir.graph import Value
from ..ir.types import DType
from ..weight_timing import timed
from .layouts import WeightLayout
from .lowered import Buf, ConversionError, PlacedCall
from .weight_cast import cast_to
from .op_lowering import BufferSpec
from .rules import forms as F
from .rules.base import CubeForm, Form, NoNpuForm, OpCall, RowForm, Tensor, Use, WeightForm


class Residency:
    """Buffers, tensors and call placement of a Lowerer (pipeline.py)."""

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

    def _place_call(self, call: OpCall, group: int, label: str,
                    out_tensors: dict[int, Tensor]) -> None:
        binding: dict[str, tuple[int, int]] = {}
        call = self._host_call_on_cube(call)     # layout_conversion.py: read a cube in place
        prog = call.lowering
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

    def _spec_form(self, spec: BufferSpec, use: Use, forced: Form | None) -> Form:
        if forced is not None:
            return forced
        shape = tuple(use.shape or self._use_shape(use))
        if isinstance(spec.layout, WeightLayout):
            nb = int(math.prod(shape[:-2])) if len(shape) > 2 else 1
            return WeightForm(spec.layout, shape, spec.nbytes // nb if nb > 1 else 0)
        if spec.layout is not None:
            roles = use.roles or F.default_roles(len(shape))
            nb = int(math.prod([n for r, n in zip(roles, shape) if r == "b"]))
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
                step = round_up(max(sub.nbytes, spec.nbytes), 64)
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
        if isinstance(want, CubeForm):
            # a deferred broadcast asked for as a cube: packed from its operand, never
            # replicated on the host first (strided_conversion._broadcast_pack)
            t = self._broadcast_pack(use, want)
            if t is not None:
                return t
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
        with timed("pack") as packed:
            a = np.asarray(self.consts[use.value.id])
            if use.index:
                a = a[use.index]
            if use.perm:
                a = np.transpose(a, use.perm)
            a = a.reshape(use.shape or a.shape)
            if isinstance(want, RowForm):
                data = cast_to(a, want.dtype.to_numpy()).reshape(-1).view(np.uint8)
            else:
                data = np.zeros(want.nbytes, np.uint8)
                self._pack_into(data, want, a)
            packed[0] = data.nbytes
        b = self.new_buf(data.size, "weights", f"const%{use.value.id}", data)
        return Tensor(use.value.id, want, b.id, 0, want.nbytes)
