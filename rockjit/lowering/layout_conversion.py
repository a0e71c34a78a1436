"""Layout conversion: host re-tiles (unpack/pack, transpose, dtype convert, weight pack) where a
value's stored form is not the one its reader asks for; each is a counted re-tile."""
from __future__ import annotations

import math

import numpy as np

from .arith import ceil_div, round_up
from ..ir.graph import Node, Value
from ..ir.ops import Op
from ..ir.types import DType
from .layouts import CubeLayout
from .lowered import Boundary, ConversionError, PlacedCall
from .op_lowering import BufferSpec, HostStep, OpLowering, Slice
from .rules import forms as F
from .rules.base import CubeForm, Form, OpCall, RowForm, Tensor, Use, WeightForm
from .strided_conversion import StridedConversion
from .strided_relayout import weight_axis_maps


def cube_steps(kind: str, layout: CubeLayout, hwc: tuple[int, int, int], cube_offsets: list[int],
               item_bytes: int) -> list[HostStep]:
    """The one builder of cube <-> row-major host steps: ``pack_cube`` (rows "src" -> cubes
    "dst") or ``unpack_cube`` (cubes "src" -> rows "dst"), one step per cube; cube k sits at
    ``cube_offsets[k]`` of the cube buffer and item k at ``k * item_bytes`` of the rows."""
    h, w, c = hwc
    attrs = {"height": h, "width": w, "channels": c, "c2": layout.c2, "esize": layout.esize,
             "line_stride": layout.line_stride, "surf_stride": layout.surf_stride}
    if kind not in ("pack_cube", "unpack_cube"):
        raise ValueError(f"cube_steps builds pack_cube or unpack_cube steps, not {kind!r}")
    steps = []
    for k, off in enumerate(cube_offsets):
        cube = (off, layout.nbytes)
        rows = (k * item_bytes, item_bytes)
        src, dst = (rows, cube) if kind == "pack_cube" else (cube, rows)
        steps.append(HostStep(kind, {"src": Slice("src", *src), "dst": Slice("dst", *dst)},
                              dict(attrs)))
    return steps


class LayoutConversion(StridedConversion):
    """The layout-conversion part of a Lowerer (pipeline.py)."""

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
            src = self._strided_rows(v, cube, dtype) or self._unpack(v, cube)
        if src.form.dtype != dtype:
            src = self._host_convert(v, src, dtype)
        return src

    def _conversion_call(self, steps: list[HostStep], bufs: list[BufferSpec], operands, results,
                         label: str, forms_in, forms_out, boundary: bool = False) -> None:
        prog = OpLowering(tuple(bufs), tuple(steps))
        self.group += 1
        call = OpCall(prog, tuple(operands), tuple(results), label=label, where="host",
                      emitter="pipeline re-tile", forms_in=tuple(forms_in),
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
        steps += cube_steps("unpack_cube", form.layout, (h, w, c),
                            [off for _, off in form.batch_items()], item_bytes)
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
        steps = cube_steps("unpack_cube", nat.layout, (h, w, c),
                           [off for _, off in nat.batch_items()], item)
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
        call = OpCall(OpLowering(specs, tuple(steps)), (Use(v),), (Use(v),), f"unpack^T %{v.id}",
                      "host", "pipeline re-tile")
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
                      "host_rules[convert]", (src.form,), (rows,))
        self._place_call(call, self.group, call.label, {})
        return next(t for t in self.tensors[v.id] if t.form == rows)

    def _convert(self, use: Use, want: Form) -> Tensor:
        """Make the use's view of the value in form ``want`` through the host (counted)."""
        v = use.value
        key = (v.id, use.index, use.perm, use.shape, want)
        if key in self._conv_cache:
            return self._conv_cache[key]
        dtype = want.dtype if isinstance(want, RowForm) else DType.F16
        direct = self._strided_weight(use, want) if isinstance(want, WeightForm) else \
            self._strided_pack(use, want) if isinstance(want, CubeForm) else None
        if direct is not None:
            self._conv_cache[key] = direct
            return direct
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
        steps += cube_steps("pack_cube", want.layout, (h, w, c), [boff for _, boff in items],
                            item_bytes)
        # the packer writes the logical channels' groups; any groups past them up to the
        # layout's must read as zero
        if want.layout.groups > ceil_div(c, want.layout.c2) or want.layout.height > h:
            out.pinned = True
            out.zero = True
        prog = OpLowering(tuple(specs), tuple(steps))
        self.group += 1
        if v not in self.graph.inputs:   # packing a graph input is the boundary, not a re-tile
            self.retiles += 1
        tmp = Tensor(v.id, want, out.id, 0, want.nbytes)
        src_t = Tensor(v.id, sub, rows.buf, rows.offset + off, sub.nbytes)
        binding = {"src": (src_t.buf, src_t.offset), "dst": (out.id, 0)}
        call = OpCall(prog, (use,), (use,), f"pack %{v.id}", "host", "pipeline re-tile")
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
                      "host_rules[transpose]")
        self.calls.append(PlacedCall(call, binding, self.group, call.label))
        return Tensor(v.id, RowForm(dt, shape), out.id, 0, RowForm(dt, shape).nbytes)

    def _pack_weight(self, use: Use, want: WeightForm, rows: Tensor, off: int, sub: RowForm,
                     key: tuple) -> Tensor:
        """Row-major fp16 [.., N, K] -> the weight layout, one host pack_weight per element:
        an activation has no on-device route into the weight layout (counted re-tile)."""
        v = use.value
        lay = want.layout
        n, k = want.shape[-2:]
        items = int(math.prod(want.shape[:-2])) if len(want.shape) > 2 else 1
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
        if lay.kernels > round_up(n, lay.n_group) or \
                lay.channels > round_up(k, lay.k_group):
            out.pinned = out.zero = True
        self.group += 1
        self.retiles += 1
        call = OpCall(OpLowering(tuple(specs), tuple(steps)), (use,), (use,), f"pack_weight %{v.id}",
                      "host", "pipeline re-tile")
        self.calls.append(PlacedCall(call, {"src": (rows.buf, rows.offset + off),
                                            "dst": (out.id, 0)}, self.group, call.label))
        if want.ones is not None:
            # the row-sum kernel (rules/row_sum.py) over the packed bytes, every run
            b = want.shape[:-2]
            ones = self._ones_pieces(want, weight_axis_maps(lay, b, want.stride),
                                     [(0, b[0] if b else 1)])
            if ones is None:
                raise ConversionError(f"%{v.id}: no strided form of its ones kernel")
            dt = DType.from_numpy(lay.dtype)
            self._strided_copy_call(v, f"pack_weight %{v.id} ones", [], dt, dt,
                                    (out.id, 0), want.nbytes, out, want.nbytes,
                                    "packed_bytes", (), ones)
        t = Tensor(v.id, want, out.id, 0, want.nbytes)
        self._conv_cache[key] = t
        return t
