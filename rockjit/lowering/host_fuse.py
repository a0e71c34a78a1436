"""Fused host steps: a run of consecutive small element-wise host-op steps (a norm's per-row
statistics between two NPU steps: ~15 ops on vectors of one value per row, then the
converting copy that writes the NPU's row-vector form) becomes ONE runtime step of kind
``fused`` (csrc/runtime/rj_host_ops.h, RJ_HOST_FUSED).

The fused step runs the same ops with the same kernels in the same order, so every bit is the
same as before; it saves the per-step dispatch of each tiny op. A step joins the run only
when the runtime would run it on one thread (a large op keeps its own step and its threads)
and when the run's buffers fit the step's four slots (one BO each: the arena, the weights).
A pack (``pack %v``) fused after the host op that computed ``%v`` is the producing step
writing the NPU's form, not a re-tile (image_stats.py counts it so)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..runtime import host_abi as ABI
from ..runtime.image import HostStepSpec, Source, StepSpec, Upload
from .host_descriptor import DTYPE_CODES

FUSABLE = ("copy", "unary", "binary", "compare")
SLOTS = ABI.FUSED_SLOTS
MAX_OPS = ABI.FUSED_MAX_OPS
_VIEW_OPERANDS = ("dst", "src", "src1", "src2")    # view v of a host op <-> its step operand
_ANY_THREADS = 64   # a step the runtime would split on any thread count stays on its own


@dataclass
class _Group:
    slots: list[int] = field(default_factory=list)      # BO per slot; slot 0 = every op's dst
    members: list[int] = field(default_factory=list)    # indexes into the step list
    records: list[np.ndarray] = field(default_factory=list)


def _member(spec: HostStepSpec, desc: bytes, group: _Group) -> tuple[bytes, list[int]] | None:
    """The step's descriptor bytes (views re-based on their BO's start) and its views' BOs
    if it can join ``group``, else None. On the bytes (a structured scalar per field cost
    ~1 us a touch, per host step of every layer)."""
    if ABI.KINDS.get(spec.kind) != _U32.unpack_from(desc, _KIND_AT)[0]:
        return None
    nin = _U32.unpack_from(desc, _NIN_AT)[0]
    out = bytearray(desc)
    bos = []
    for v in range(nin + 1):
        bo, off = spec.operands[_VIEW_OPERANDS[v]][:2]
        at = _VIEW_AT + v * _VIEW_BYTES
        esize = _ESIZE[_U32.unpack_from(desc, at + _VDTYPE_AT)[0]]
        if off % esize:
            return None     # the view cannot count its offset in elements from the BO start
        _I64.pack_into(out, at + _VOFFSET_AT, _I64.unpack_from(desc, at + _VOFFSET_AT)[0] + off // esize)
        bos.append(int(bo))
    if group.slots and bos[0] != group.slots[0]:
        return None
    return bytes(out), bos


def _field(dtype: np.dtype, name: str, fmt: str) -> int:
    """A field's byte offset, checked to hold ``fmt`` (little-endian u32 or i64)."""
    ft, at = dtype.fields[name][:2]
    assert ft.base == np.dtype(fmt), (name, ft)
    return at


_U32, _I64 = struct.Struct("<I"), struct.Struct("<q")
_KIND_AT = _field(ABI.DESC_DTYPE, "kind", "<u4")
_NIN_AT = _field(ABI.DESC_DTYPE, "ninputs", "<u4")
_VIEW_AT = ABI.DESC_DTYPE.fields["view"][1]
_VIEW_BYTES = ABI.DESC_DTYPE.fields["view"][0].base.itemsize
_VDTYPE_AT = _field(ABI.DESC_DTYPE.fields["view"][0].base, "dtype", "<u4")
_VOFFSET_AT = _field(ABI.DESC_DTYPE.fields["view"][0].base, "offset", "<i8")
_ESIZE = {code: dt.to_numpy().itemsize for dt, code in DTYPE_CODES.items()}


def _slots_after(group: _Group, bos: Sequence[int]) -> list[int] | None:
    slots = list(group.slots) or [bos[0]]
    for bo in bos[1:]:
        if bo not in slots:
            slots.append(bo)
    return slots if len(slots) <= SLOTS else None


def plan_groups(specs: Sequence[StepSpec], descs: Sequence[bytes | None],
                small: Sequence[bool]) -> list[_Group]:
    """Runs of consecutive fusable steps (``descs[i]``: step i's descriptor when it is a
    host-op step the lowering made, ``small[i]``: the runtime runs it on one thread), each of
    two or more steps."""
    out: list[_Group] = []
    g = _Group()

    def close() -> None:
        nonlocal g
        if len(g.members) > 1:
            out.append(g)
        g = _Group()

    for i, (spec, desc) in enumerate(zip(specs, descs)):
        if spec.kind != "host" or desc is None or not small[i] or spec.host.kind not in FUSABLE:
            close()
            continue
        m = _member(spec.host, desc, g)
        slots = _slots_after(g, m[1]) if m is not None else None
        if m is None or slots is None or len(g.members) == MAX_OPS:
            close()
            m = _member(spec.host, desc, g)
            slots = _slots_after(g, m[1]) if m is not None else None
            if m is None or slots is None:
                continue
        rec, bos = m
        g.slots = slots
        g.members.append(i)
        g.records.append(record(rec, [slots.index(bo) for bo in bos]))
    close()
    return out


def record(desc: bytes | np.ndarray, slots: Sequence[int]) -> np.ndarray:
    """One op of a fused step: its ``rj_host_op`` bytes (element offsets counted from its
    slots' bases) and the slot of each view (output first)."""
    r = np.zeros((), ABI.FUSED_OP_DTYPE)
    r["op"] = np.frombuffer(bytes(desc), ABI.DESC_DTYPE)[0]
    r["slot"][:len(slots)] = slots
    return r


def descriptor(records: Sequence[np.ndarray]) -> np.ndarray:
    """A fused step's descriptor bytes: the header, then one record per op."""
    h = np.zeros((), ABI.FUSED_DTYPE)
    h["magic"], h["version"], h["nops"] = ABI.FUSED_MAGIC, ABI.FUSED_VERSION, len(records)
    recs = np.array(records, ABI.FUSED_OP_DTYPE)
    return np.concatenate([np.frombuffer(h.tobytes(), np.uint8),
                           np.frombuffer(recs.tobytes(), np.uint8)])


def fuse_host_steps(b: Any, specs: list[StepSpec], members: list[tuple[int, Any] | None]) -> list[StepSpec]:
    """``b``: the ImageBuilder; ``members[i]``: (call index, lowering HostStep) of image step i
    when the lowering made it (None for NPU steps and cross-context copies). Returns the step
    list with each group fused; adds the descriptors' BO and uploads to ``b`` and corrects
    its counts (``host``) and ``folded_packs``."""
    from .. import debugflags
    from ..runtime.host_threads import plan_threads
    from .host_rules import DESC_BYTES

    b.folded_packs = 0
    if debugflags.enabled(debugflags.NO_HOST_FUSE.name):
        return specs

    descs: list[bytes | None] = []
    small: list[bool] = []
    # a host op's thread plan is a function of its kind and descriptor alone
    # (csrc/runtime/host_steps.c rj_host_step_plan_threads); the layers repeat them
    threads: dict[tuple[str, bytes], int] = {}
    for spec, m in zip(specs, members):
        d = None
        if m is not None and spec.host.kind in FUSABLE:
            ci, hs = m
            sl = hs.operands["desc"]
            data = b._spec(ci, sl.buffer).data
            d = np.asarray(data, np.uint8).reshape(-1)[sl.offset:sl.offset + DESC_BYTES].tobytes()
        descs.append(d)
        if d is not None:
            key = (spec.host.kind, d)
            n = threads.get(key)
            if n is None:
                n = threads[key] = plan_threads(spec.host, d, _ANY_THREADS)
        small.append(d is not None and n == 1)
    groups = plan_groups(specs, descs, small)
    if not groups:
        return specs
    steps_of: dict[int, list[int]] = {}     # call -> its host steps in the image
    for i, m in enumerate(members):
        if m is not None:
            steps_of.setdefault(m[0], []).append(i)
    b.folded_packs = _folded_packs(b, groups, members, steps_of)
    direct = _write_npu_form_directly(b, groups, members, steps_of)
    blobs = [descriptor(g.records) for g in groups]
    offs = np.cumsum([0] + [(x.size + 63) // 64 * 64 for x in blobs])
    bo = b._add_bo(int(offs[-1]), "weights", 0)
    first = {}
    for k, (g, blob) in enumerate(zip(groups, blobs)):
        key = f"fuseddesc{k}"
        b.arrays[key] = blob
        b.uploads.append(Upload(bo, int(offs[k]), key))
        ops = {"dst": (g.slots[0], 0, "u8", 0), "desc": (bo, int(offs[k]), "u8", 0)}
        for name, sbo in zip(("src", "src1", "src2"), g.slots[1:]):
            ops[name] = (sbo, 0, "u8", 0)
        first[g.members[0]] = (g, StepSpec("host", (), HostStepSpec("fused", ops, {"steps": len(g.members)}),
                                           combined_source(b, [specs[i].source for i in g.members],
                                                           "host_fuse")))
    b._count["host"] -= sum(len(g.members) - 1 for g in groups)
    b._count["fused_steps"] = len(groups)
    b._count["fused_ops"] = sum(len(g.members) for g in groups) - direct
    out, skip = [], set()
    for i, spec in enumerate(specs):
        if i in first:
            g, fused = first[i]
            out.append(fused)
            skip.update(g.members)
        elif i not in skip:
            out.append(spec)
    return out


def combined_source(b: Any, members: Sequence[int], emitter: str) -> int:
    """The source of a step or job that runs several ops (``members``: their sources): their
    labels in order, the first user location among them (a failure names every op it runs)."""
    srcs = [b.sources[i] for i in dict.fromkeys(members)]
    loc = next((s.loc for s in srcs if s.loc), "")
    b.sources.append(Source("; ".join(s.node for s in srcs), loc, emitter))
    return len(b.sources) - 1


def _write_npu_form_directly(b: Any, groups: list[_Group], members: list,
                             steps_of: dict[int, list[int]]) -> int:
    """Where a fused pack copies the f32 rows the op just before it wrote, over the same
    elements, and nothing else ever reads those rows (no other call binds their buffer, no
    graph output lives there), that op writes the pack's destination view itself and the
    pack's record goes: the producing op writes the NPU's form. The op computes in f32 and
    stores with the output's conversion (rj_host_ops.h), the conversion the pack applied to
    the same f32 values, so the bits are the same. Returns the records dropped."""
    users: dict[int, set[int]] = {}
    for ci, pc in enumerate(b.calls):
        for bid, _ in pc.binding.values():
            users.setdefault(bid, set()).add(ci)
    outs = {bd.tensor.buf for bd in (*b.lowered.outputs, *b.lowered.inputs)}
    dropped = 0
    for g in groups:
        at = list(g.members)        # the step of each record (records go, steps stay fused)
        k = 1
        while k < len(g.records):
            ci, pi = members[at[k]][0], members[at[k - 1]][0]
            node, src = b.calls[ci].node, b.calls[ci].binding.get("src")
            if not node.startswith("pack %") or src is None:
                k += 1      # the test below starts with these (the records' cheaper first)
                continue
            pack, prod = g.records[k]["op"], _squeezed(g.records[k - 1]["op"])
            same = (int(pack["rank"]) == int(prod["rank"]) and
                    np.array_equal(pack["shape"], prod["shape"]) and
                    g.records[k]["slot"][1] == g.records[k - 1]["slot"][0] and
                    pack["view"][1].tobytes() == prod["view"][0].tobytes())
            if (node.startswith("pack %") and src is not None and same and
                    int(pack["kind"]) == ABI.KINDS["copy"] and int(pack["ninputs"]) == 1 and
                    int(prod["kind"]) in (ABI.KINDS["unary"], ABI.KINDS["binary"]) and
                    int(prod["view"][0]["dtype"]) == ABI.DTYPES["f32"] and
                    b.calls[pi].node.startswith(f"{node.split()[1]} = ") and
                    users.get(src[0], set()) <= {ci, pi} and src[0] not in outs and
                    len(steps_of[ci]) == 1):
                prod["view"][0] = pack["view"][0]
                g.records[k - 1]["op"] = prod
                g.records[k - 1]["slot"][0] = g.records[k]["slot"][0]
                # the pack's bytes are no longer moved
                b._count["packed"] -= int(members[at[k]][1].params.get("packed_bytes", 0))
                del g.records[k], at[k]
                dropped += 1
                continue
            k += 1
    return dropped


def _squeezed(d: np.void) -> np.void:
    """An element-wise descriptor without its unit axes (their strides never move a view)."""
    rank = int(d["rank"])
    axes = [a for a in range(rank) if int(d["shape"][a]) != 1] or [0]
    out = d.copy()
    out["rank"] = len(axes)
    out["shape"][:] = 0
    out["shape"][:len(axes)] = d["shape"][axes]
    for v in range(int(d["ninputs"]) + 1):
        out["view"][v]["stride"][:] = 0
        out["view"][v]["stride"][:len(axes)] = d["view"][v]["stride"][axes]
    return out


def _folded_packs(b: Any, groups: list[_Group], members: list,
                  steps_of: dict[int, list[int]]) -> int:
    """Pack calls (``pack %v``, a counted re-tile) every step of which sits in a fused step
    after a step of the call that computed ``%v``: the producing host step writes the NPU's
    form."""
    folded = 0
    for g in groups:
        cis = [members[i][0] for i in g.members]
        for pos, ci in enumerate(cis):
            node = b.calls[ci].node
            if not node.startswith("pack %") or cis.index(ci) != pos:
                continue
            if not set(steps_of[ci]) <= set(g.members):
                continue
            v = node.split()[1]
            if any(b.calls[p].node.startswith(f"{v} = ") for p in cis[:pos]):
                folded += 1
    return folded
