"""One-pass strided host re-layouts (strided_relayout.py gives the pieces): a cube, the
weight layout and rows are affine in the element indices once a grouped axis is split, so
cube -> weights / cube -> rows / rows -> cube is one strided host copy per piece for all
batch items (heads) at once, and host element-wise ops and row maxima read a cube in place.
A mixin of the Lowerer (pipeline.py) beside LayoutConversion, which falls back to the
unpack / pack re-tiles where no strided form exists."""
from __future__ import annotations

import math
import itertools

import numpy as np

from .arith import round_up
from ..ir.graph import Value
from ..ir.ops import Op
from ..ir.types import DType
from .lowered import ConversionError, PlacedCall
from .partition import Decision
from .compile_cache import compile_scope_memo
from .head_groups import head_groups, leading_range
from .host_descriptor import view_runs
from .op_lowering import BufferSpec, HostStep, OpLowering
from .regcmd import LoweringError
from .rules import forms as F
from .rules.base import CubeForm, OpCall, RowForm, Tensor, Use, WeightForm
from . import strided_relayout as SR
from .cube_host_calls import call_descriptor, cube_call_parts


class StridedConversion:
    # (strided_relayout.py): a cube, the weight layout and rows are affine in the element
    # indices once a grouped axis is split, so cube -> weights / cube -> rows / rows -> cube
    # is one strided host copy per piece, for all batch items (heads) at once. Still a re-tile
    # of an intermediate (counted once per tensor); its bytes count as packed / unpacked.

    def _strided_copy_call(self, v: Value, label: str, pieces: list, src_dt: DType,
                           dst_dt: DType, src_loc: tuple[int, int], src_nbytes: int, out,
                           out_nbytes: int, moved: str, zero_pieces: list = (),
                           one_pieces: list = (), to_reader: bool = False) -> None:
        """One host call of strided copies ``pieces`` (src -> dst), ``zero_pieces``
        (a broadcast zero -> the padding of dst the reader takes, rewritten every run so the
        buffer needs no load-time zeroing and may share arena space) and ``one_pieces`` (a
        broadcast 1.0 after them: a row-sum kernel, rules/row_sum.py). ``to_reader``: each
        step's output may go to the context of the NPU job that reads it next (a weight pack
        that only an NPU job reads; context_copies.ResidencyWalk.host_contexts)."""

        specs = [BufferSpec("src", "input", src_nbytes), BufferSpec("dst", "output", out_nbytes)]
        binding = {"src": src_loc, "dst": (out.id, 0)}
        for name, pcs, fill in (("zero", zero_pieces, 0.0), ("one", one_pieces, 1.0)):
            if pcs:
                data = np.full(64 // dst_dt.to_numpy().itemsize, fill, dst_dt.to_numpy())
                b = self.new_buf(64, "weights", f"{label}:{name}", data.view(np.uint8))
                specs.append(BufferSpec(name, "const", 64))
                binding[name] = (b.id, 0)
        # the steps and descriptors are a function of the pieces, dtypes and sizes alone
        # (the label reaches an error only, and an error is not kept): once per compile for
        # each, the layers repeat them; each call binds its own descriptor buffers
        key = ("strided_copy_steps", tuple(pieces), tuple(zero_pieces), tuple(one_pieces),
               src_dt, dst_dt, src_nbytes, out_nbytes, moved, to_reader)
        cache = compile_scope_memo()
        made = None if cache is None else cache.get(key)
        if made is None:
            made = _copy_steps(label, pieces, zero_pieces, one_pieces, src_dt, dst_dt,
                               src_nbytes, out_nbytes, moved, to_reader)
            if cache is not None:
                cache[key] = made
        steps = [st for st, _ in made]
        for st, desc in made:
            specs.append(desc)
            dbuf = self.new_buf(desc.nbytes, "weights", f"{label}:{desc.name}", desc.data)
            binding[desc.name] = (dbuf.id, 0)
        self.group += 1
        self.retiles += 1
        call = OpCall(OpLowering(tuple(specs), tuple(steps)), (Use(v),), (Use(v),), label,
                      "host", "pipeline re-tile")
        self.calls.append(PlacedCall(call, binding, self.group, label))

    @staticmethod
    def _cube_maps(form: CubeForm) -> list:
        return SR.cube_axis_maps(form.layout, form.roles, form.strides)

    def _strided_rows(self, v: Value, cube: Tensor, dtype: DType) -> Tensor | None:
        """The whole value as ``dtype`` rows in one pass (any number of cubes, a transposed
        view, a dtype change on the way), or None where the per-cube unpack is as good (one
        plain cube of the same dtype) or no strided cut fits."""
        from .host_rules import MAX_RANK

        form = cube.form
        if form.shape != tuple(v.type.shape):
            return None
        if len(form.batch_items()) == 1 and self._natural(form) and form.dtype == dtype:
            return None
        rows = RowForm(dtype, v.type.shape)
        es_in, es_out = form.layout.esize, dtype.to_numpy().itemsize
        pieces = SR.relayout_pieces(v.type.shape, self._cube_maps(form),
                                    SR.row_axis_maps(v.type.shape, es_out), es_in, es_out, MAX_RANK)
        if pieces is None:
            return None
        out = self.new_buf(rows.nbytes, name=f"%{v.id}:rows")
        self._strided_copy_call(v, f"unpack %{v.id}", pieces, form.dtype, dtype,
                                (cube.buf, cube.offset), form.nbytes, out, rows.nbytes,
                                "unpacked_bytes")
        return self.add_tensor(v, rows, out)

    def _use_axes(self, use: Use, maps: list, base: int) -> tuple[list, list, int] | None:
        """The (extent, map) of each non-unit axis a use sees of the value (index fixed,
        perm applied), and the byte offset of the index; None for a reshape that is more
        than dropping or adding unit axes."""
        v = use.value
        shape = tuple(v.type.shape)
        nb = len(use.index)
        for k, i in enumerate(use.index):
            base += maps[k].at(i)
        rest = list(range(nb, len(shape)))
        if use.perm:
            rest = [rest[p] for p in use.perm]
        axes = [(shape[a], maps[a]) for a in rest if shape[a] != 1]
        if use.shape is not None and [n for n in use.shape if n != 1] != [n for n, _ in axes]:
            return None
        return [n for n, _ in axes], [m for _, m in axes], base

    def _strided_weight(self, use: Use, want: WeightForm) -> Tensor | None:
        """Cube -> weight layout for every batch item (head) in one pass: what unpack per
        head + transpose + pack_weight per head did in three."""
        from .host_rules import MAX_RANK

        v = use.value
        if v in self.graph.inputs or any(isinstance(t.form, RowForm) for t in self.tensors.get(v.id, [])):
            return None     # rows exist already: pack_weight from them is one pass
        cube = next((t for t in self.tensors.get(v.id, []) if isinstance(t.form, CubeForm)), None)
        lay = want.layout
        if cube is None or cube.form.shape != tuple(v.type.shape) or lay.kh != 1 or lay.kw != 1:
            return None
        seen = self._use_axes(use, self._cube_maps(cube.form), 0)
        if seen is None:
            return None
        shape, src_maps, base = seen
        wshape = list(want.shape)
        dst_all = SR.weight_axis_maps(lay, wshape[:-2], want.stride)
        keep = [i for i, n in enumerate(wshape) if n != 1]
        if [wshape[i] for i in keep] != shape:
            return None
        es_in, es_out = cube.form.layout.esize, lay.dtype.itemsize
        groups = head_groups(shape, keep, len(wshape) - 2, es_out, self.profile.cores)
        pieces = self._grouped_pieces(shape, src_maps, [dst_all[i] for i in keep], es_in,
                                      es_out, groups)
        if pieces is None and len(groups) > 1:
            groups = [(0, shape[0])]
            pieces = self._grouped_pieces(shape, src_maps, [dst_all[i] for i in keep], es_in,
                                          es_out, groups)
        if pieces is None or base % es_in:
            return None
        pieces = [SR.CopyPiece(p.shape, p.src_offset + base // es_in, p.src_strides,
                               p.dst_offset, p.dst_strides) for p in pieces]
        n, k = wshape[-2:]
        bshape = list(wshape[:-2])
        # the padding and ones kernels by the same groups, so each group's weights are
        # whole in the one context its step writes
        lead = [(0, bshape[0] if bshape else 1)] if not bshape or keep[0] != 0 else groups
        ones = self._ones_pieces(want, dst_all, lead)
        if ones is None:
            return None
        out = self.new_buf(want.nbytes, name=f"%{v.id}:weights")
        # the copy writes real elements only; the padding kernels/channels the matmul reads
        # (into its padding outputs, and through a later ones-vector row sum into real ones:
        # 0 * stale NaN) get zeros every run, as pack_weight's block fill gave them
        npad, kpad = lay.padded_kernels, lay.padded_channels
        zmaps = [SR.AxisMap(0)] * len(wshape)
        zero = []
        if want.ones is not None:
            # a row-sum kernel pads the kernels past the n_group (64 -> 80 for a 64-wide
            # head): zeroing 15 kernels every run would cost a quarter of the pack; the
            # buffer is zeroed once instead and never shared (its padding stays zero)
            out.pinned = out.zero = True
        for h0, h1 in lead:
            rest, at = leading_range(bshape, h0, h1)
            for box, first in (((*rest, npad - n, kpad), (*at, n, 0)),
                               ((*rest, n, kpad - k), (*at, 0, k))):
                if min(box) <= 0 or out.zero:
                    continue
                zp = SR.relayout_pieces(box, zmaps, dst_all, es_out, es_out, MAX_RANK, first)
                if zp is None:
                    return None
                zero += zp
        self._strided_copy_call(v, f"pack_weight %{v.id}", pieces, cube.form.dtype,
                                DType.from_numpy(lay.dtype), (cube.buf, cube.offset),
                                cube.form.nbytes, out, want.nbytes, "packed_bytes", zero, ones,
                                to_reader=len(groups) > 1)
        return Tensor(v.id, want, out.id, 0, want.nbytes)

    @staticmethod
    def _grouped_pieces(shape: list[int], src_maps: list, dst_maps: list, es_in: int,
                        es_out: int, groups: list[tuple[int, int]]) -> list | None:
        """relayout_pieces of ``shape``, one run of pieces per range of its first axis: each
        group of heads reads only its heads' planes, so the host reads them on the core that
        made them and writes them where they are multiplied (context_copies.next_readers),
        with no copy of K or V between the cores. None where a group has no strided cut."""
        from .host_rules import MAX_RANK

        pieces: list = []
        for h0, h1 in groups:
            box, first = leading_range(shape, h0, h1)
            got = SR.relayout_pieces(box, src_maps, dst_maps, es_in, es_out, MAX_RANK, first)
            if got is None:
                return None
            pieces += got
        return pieces

    @staticmethod
    def _ones_pieces(want: WeightForm, dst_all: list, lead: list[tuple[int, int]]
                     ) -> list | None:
        """The broadcast-1.0 copies of ``want``'s ones kernel over its real channels for
        every batch item, one run per range ``lead`` of the first batch axis ([] without a
        ones kernel; None where no strided cut fits)."""
        from .host_rules import MAX_RANK

        if want.ones is None:
            return []
        bshape, k = list(want.shape[:-2]), want.shape[-1]
        if not want.shape[-2] <= want.ones < want.layout.kernels:
            raise ConversionError(f"ones kernel {want.ones} is not a padding kernel of "
                                  f"{want.layout}")
        es = want.layout.dtype.itemsize
        out: list = []
        for h0, h1 in lead:
            box, at = leading_range(bshape, h0, h1)
            got = SR.relayout_pieces((*box, 1, k), [SR.AxisMap(0)] * len(want.shape), dst_all,
                                     es, es, MAX_RANK, (*at, want.ones, 0))
            if got is None:
                return None
            out += got
        return out

    def _strided_pack(self, use: Use, want: CubeForm,
                      source: tuple[Tensor, list] | None = None) -> Tensor | None:
        """Rows -> cube for the whole value at once: one item per index of the use's leading
        axes (e.g. a per-head row max packed for 12 heads) in one pass, with any dtype change
        on the way; the other items' uses then find it as a view. ``source``: the rows to read
        and their axis maps over the value's axes, when they are not the value's own rows (a
        broadcast's operand read through stride-0 axes, ``_broadcast_pack``)."""
        from .host_rules import MAX_RANK

        v = use.value
        if v in self.graph.inputs or use.perm or not self._natural(want):
            return None
        if source is not None:
            src, src_maps = source
        else:
            rows = [t for t in self.tensors.get(v.id, []) if isinstance(t.form, RowForm)
                    and t.form.shape == tuple(v.type.shape)]
            if not rows:
                return None
            src = next((t for t in rows if t.form.dtype == want.dtype), rows[0])
            if not use.index and src.form.dtype == want.dtype and len(want.batch_items()) == 1:
                return None     # one pack_cube is already one pass
            src_maps = SR.row_axis_maps(v.type.shape, src.form.dtype.to_numpy().itemsize)
        nb = len(use.index)
        step = round_up(want.nbytes, 64)
        bstrides, acc = [], step
        for n in reversed(v.type.shape[:nb]):
            bstrides.append(acc)
            acc *= n
        batched = CubeForm(want.layout, ("b",) * nb + want.roles,
                           tuple(reversed(bstrides)) + want.strides,
                           tuple(v.type.shape[:nb]) + tuple(want.shape))
        full = F.reshape(batched, tuple(v.type.shape))
        if not isinstance(full, CubeForm):
            return None
        es_in, es_out = src.form.dtype.to_numpy().itemsize, want.layout.esize
        pieces = SR.relayout_pieces(v.type.shape, src_maps, self._cube_maps(full), es_in, es_out,
                                    MAX_RANK)
        if pieces is None:
            return None
        out = self.new_buf(full.nbytes, name=f"%{v.id}:retile")
        if full.nbytes != v.type.size * es_out:
            # the copy writes real elements only; padding lanes, groups and rows the reader
            # takes must be zero: zero-filled once, never shared
            out.pinned = out.zero = True
        self._strided_copy_call(v, f"pack %{v.id}", pieces, src.form.dtype, want.dtype,
                                (src.buf, src.offset), src.form.nbytes, out, full.nbytes,
                                "packed_bytes")
        self.tensors.setdefault(v.id, []).append(Tensor(v.id, full, out.id, 0, full.nbytes))
        sub, off = batched.sub(use.index)
        return Tensor(v.id, want, out.id, off, want.nbytes)

    def _broadcast_pack(self, use: Use, want: CubeForm) -> Tensor | None:
        """A run-time value's broadcast asked for as a cube before anything made it (a deferred
        broadcast, pipeline.Lowerer._deferred): packed straight from its operand's rows, read
        through stride-0 axes, so the replicated rows are never written on the host. ModernBERT's
        local-attention bias [1,1,S,S] added to [1,12,S,S] scores was a 12x broadcast copy
        (12.6 MB of f32 at S = 512) and then a pack of it. The same elements get the same
        conversion as through the rows, so the cube holds the same bits."""
        v = use.value
        p = self.producers.get(v.id)
        if p is None or p.op is not Op.BROADCAST_IN_DIM or v.id in self.tensors or \
                v.id in self.done or not self._deferred(p, {}):
            return None
        x = p.inputs[0]
        if x.id in self.consts:
            return None
        rows = self.get_tensor(Use(x), RowForm(x.type.dtype, tuple(x.type.shape)))
        es = x.type.dtype.to_numpy().itemsize
        strides = SR.row_axis_maps(x.type.shape, es)
        maps = [SR.AxisMap(0)] * v.type.rank
        for j, a in enumerate(p.attrs["broadcast_dimensions"]):
            if x.type.shape[j] == v.type.shape[a]:
                maps[a] = strides[j]
        t = self._strided_pack(use, want, (rows, maps))
        if t is not None:
            self.done.add(v.id)
            self.decisions.append(Decision(
                f"%{v.id} = {p.op.text}", str(p.loc), "host", "pack from the operand",
                "a broadcast packed straight from its operand through stride-0 axes"))
        return t

    def _host_call_on_cube(self, call: OpCall) -> OpCall:
        """A host call reading an operand held only as a cube reads it in place where its
        op allows (element-wise ops, a row max), instead of after an unpack pass."""
        if call.where != "host" or len(call.lowering.steps) != 1:
            return call
        if call.lowering.steps[0].kind in ("unary", "binary", "compare", "copy"):
            return self._eltwise_on_cube(call)
        return self._reduce_max_on_cube(call)

    def _only_cube(self, use: Use) -> Tensor | None:
        """The value's cube when a use sees the whole value and no rows of it exist."""
        v = use.value
        if use.index or use.perm or use.shape or v.id in self.consts or v in self.graph.inputs:
            return None
        have = self.tensors.get(v.id, [])
        cube = next((t for t in have if isinstance(t.form, CubeForm)), None)
        if cube is None or any(isinstance(t.form, RowForm) for t in have) or \
                cube.form.shape != tuple(v.type.shape):
            return None
        return cube

    def _eltwise_on_cube(self, call: OpCall) -> OpCall:
        """An element-wise host op reads each operand held only as a cube through the cube's
        strided view (real lanes only); a lane tail makes it one more step over that part of
        the output. Each element is computed alone, so the results are the same bits.
        Its steps are a function of the host program and the operands' cube forms alone
        (cube_host_calls.py): made once per compile for each (the layers repeat them)."""
        # every cube read in place is an operand held only as a cube: with none (most calls)
        # the call stays as it is, without decoding its descriptor
        only = [self._only_cube(use) for use in call.operands]
        if all(t is None for t in only):
            return call
        forms = tuple(None if t is None else t.form for t in only)
        try:
            parts = cube_call_parts(call.lowering, forms)
        except LoweringError as e:
            raise LoweringError(f"{call.label}: {e}") from None
        if parts is None:
            return call
        bufs, steps, cube_forms = parts
        forms_in = list(call.forms_in) if call.forms_in else [None] * len(call.operands)
        for bind, form in cube_forms:
            forms_in[bind] = form
        return OpCall(OpLowering(bufs, steps), call.operands, call.results, label=call.label,
                      where="host", emitter=call.emitter, forms_in=tuple(forms_in),
                      forms_out=call.forms_out)

    def _reduce_max_on_cube(self, call: OpCall) -> OpCall:
        """A host ``reduce_max`` whose operand is held only as a cube reads the cube through a
        strided view (the channel axis split into group and lane, real channels only) instead
        of an unpacked copy: no pass writing the whole operand. A reduced axis the cut splits
        in two (channels not a multiple of the lane count) is reduced per part and the parts
        combined with a host max, which is exact in any order (a sum would round differently,
        so sums keep the unpack)."""
        from .host_rules import (BINARY_CODES, MAX_RANK, REDUCE_CODES, HostView, host_op_step,
                                 row_major_strides)

        prog = call.lowering
        if call.where != "host" or len(prog.steps) != 1 or prog.steps[0].kind != "reduce" or \
                len(call.operands) != 1:
            return call
        v = call.operands[0].value
        use = call.operands[0]
        cube = self._only_cube(use)
        if cube is None:
            return call
        d = call_descriptor(prog)
        rank = int(d["rank"])
        shape = [int(n) for n in d["shape"][:rank]]
        mask = int(d["axis_mask"])
        out_strides = [int(s) for s in d["view"][0]["stride"][:rank]]
        ins = [b for b in prog.buffers if b.role == "input"]
        if shape != list(v.type.shape) or int(d["code"]) != REDUCE_CODES[Op.REDUCE_MAX] or \
                int(d["ninputs"]) != 1 or len(ins) != 1 or int(d["view"][1]["offset"]) or \
                tuple(int(x) for x in d["view"][1]["stride"][:rank]) != row_major_strides(shape):
            return call     # only a max over the whole operand read densely is re-pointed
        out_spec = next(b for b in prog.buffers if b.role == "output")
        out_dt = DType(out_spec.dtype)
        maps = self._cube_maps(cube.form)
        cuts = []
        for n, m in zip(shape, maps):
            c = SR.axis_cuts(n, m.mod)
            if c is None:
                return call
            cuts.append(c)
        kept = [a for a in range(rank) if not (mask >> a) & 1]
        red = [a for a in range(rank) if (mask >> a) & 1]
        es = cube.form.layout.esize
        sizes = {ins[0].name: cube.form.nbytes, out_spec.name: out_spec.nbytes,
                 "tmp": out_spec.nbytes}
        iname = ins[0].name
        steps, specs = [], [BufferSpec(iname, "input", cube.form.nbytes, layout=cube.form.layout,
                                       bind=0), out_spec]
        code = REDUCE_CODES[Op.REDUCE_MAX]
        for kcombo in itertools.product(*[cuts[a] for a in kept]):
            for j, rcombo in enumerate(itertools.product(*[cuts[a] for a in red])):
                pieces = dict(zip(kept, kcombo)) | dict(zip(red, rcombo))
                dims, ioff, ooff, rmask = [], 0, 0, 0
                for a in range(rank):
                    start, digits = pieces[a]
                    ioff += maps[a].at(start)
                    ooff += out_strides[a] * start
                    for cnt, w in digits:
                        if cnt == 1:
                            continue
                        if (mask >> a) & 1:
                            rmask |= 1 << len(dims)
                        dims.append((cnt, SR.digit_stride(maps[a], w), out_strides[a] * w))
                if len(dims) > MAX_RANK or ioff % es or any(s % es for _, s, _ in dims):
                    return call
                if not dims:
                    dims = [(1, 0, 0)]
                dshape = [c for c, _, _ in dims]
                dst = out_spec.name if j == 0 else "tmp"
                name = f"desc{len(specs)}"
                st, desc = host_op_step(
                    "reduce", dshape, HostView(dst, out_dt, ooff, [o for _, _, o in dims]),
                    [HostView(iname, cube.form.dtype, ioff // es, [s // es for _, s, _ in dims])],
                    {**sizes, name: 0}, name, code=code, axis_mask=rmask,
                    what=f"reduce_max of %{v.id} on its cube")
                n_in = int(math.prod(dshape))
                n_out = int(math.prod([c for c, _, o in dims if o]))
                steps.append(HostStep(st.kind, st.operands,
                                      {"bytes": n_in * es + n_out * out_dt.to_numpy().itemsize}))
                specs.append(desc)
                if j:
                    # out = max(out, tmp) over this part's outputs
                    kdims = [(c, o) for c, _, o in dims if o]
                    kshape = [c for c, _ in kdims] or [1]
                    kst = [o for _, o in kdims] or [0]
                    name = f"desc{len(specs)}"
                    st, desc = host_op_step(
                        "binary", kshape, HostView(out_spec.name, out_dt, ooff, kst),
                        [HostView(out_spec.name, out_dt, ooff, kst),
                         HostView("tmp", out_dt, ooff, kst)],
                        {**sizes, name: 0}, name, code=BINARY_CODES[Op.MAX],
                        what=f"reduce_max of %{v.id} on its cube")
                    steps.append(HostStep(st.kind, st.operands,
                                          {"bytes": 3 * n_out * out_dt.to_numpy().itemsize}))
                    specs.append(desc)
        if len(steps) > SR.MAX_PIECES:
            return call
        if any(sl.buffer == "tmp" for s in steps for sl in s.operands.values()):
            specs.append(BufferSpec("tmp", "scratch", out_spec.nbytes))
        return OpCall(OpLowering(tuple(specs), tuple(steps)), call.operands, call.results,
                      label=call.label, where="host", emitter=call.emitter,
                      forms_in=(cube.form,), forms_out=call.forms_out)


def _copy_steps(label: str, pieces: list, zero_pieces: list, one_pieces: list, src_dt: DType,
                dst_dt: DType, src_nbytes: int, out_nbytes: int, moved: str,
                to_reader: bool = False) -> tuple[tuple[HostStep, BufferSpec], ...]:
    """The host copy step and descriptor constant of each piece of a strided re-tile
    (StridedConversion._strided_copy_call): ``pieces`` from ``src``, then ``zero_pieces`` and
    ``one_pieces`` from the broadcast constants."""
    from .host_rules import HostView, host_op_step

    out = []
    es = dst_dt.to_numpy().itemsize
    for j, (p, srcname) in enumerate([(p, "src") for p in pieces] +
                                     [(p, "zero") for p in zero_pieces] +
                                     [(p, "one") for p in one_pieces]):
        dname = f"desc{j}"
        dst_view = HostView("dst", dst_dt, p.dst_offset, p.dst_strides)
        src_view = HostView(srcname, src_dt if srcname == "src" else dst_dt, p.src_offset,
                            p.src_strides)
        st, desc = host_op_step("copy", p.shape, dst_view, [src_view],
                                {"src": src_nbytes, "dst": out_nbytes, "zero": 64,
                                 "one": 64, dname: 0},
                                dname, what=label)
        nb = int(math.prod(p.shape)) * es
        # the bytes each side touches (a strided piece of a cube: its copies between
        # contexts bring only those, context_copies.host_runs)
        runs = view_runs(p.shape, (dst_view, src_view))
        params = {moved: nb, "bytes": nb, "runs": runs}
        if to_reader:
            params["to_reader"] = 1
        out.append((HostStep(st.kind, st.operands, params), desc))
    return tuple(out)
