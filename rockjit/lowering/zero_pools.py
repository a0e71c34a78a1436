"""Must-stay-zero arena buffers shared between layers (issue 9: memory, and the pages a first run
faults in).

A buffer whose padding some reader takes as zeros (a cube packed with fewer channel groups than
its reader reads, a run-time matmul's packed B past its kernels; residency.py,
layout_conversion.py) is zero-filled once at load and pinned: live for the whole program, so no
other tensor's bytes ever land on its zero bytes. Each layer makes its own such buffers, so the
pinned bytes grow with depth: ModernBERT-base at 22 layers held 334 of them, 47.7 MB, in an
82.7 MB arena whose every other buffer fits in 35.6 MB, and each core's context mirrors the arena.

Two such buffers may share bytes when their live intervals are disjoint and every call that
binds one binds the other the same way: an op lowering equal field by field (the same regcmd
words and relocations, the same host steps; a constant's bytes aside, which move no address)
under the same name at the same offset. Both are then written at exactly the same bytes, so the
bytes neither writes -- the zeros -- are written by nobody and stay zero, and each one's written
bytes are rewritten in its own interval before they are read. Such a class shares slots (each
one pinned, zero-filled range): a buffer goes to the first slot whose last holder's interval
ended before its own began, which uses as few slots as the class ever has live at once.
ModernBERT-base x22: those buffers in 8 slots of 1.9 MB in all, the arena 82.7 -> 37.0 MB, the
pages a first call faults in 89.6 -> 49.5 MB; SigLIP-B/16 224 x12: the arena 19.3 -> 9.4 MB.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace
import enum
from types import MappingProxyType
from typing import AbstractSet, Any, Callable, Sequence

import numpy as np

from .layouts import CubeLayout
from .memory import BufReq
from .op_lowering import BufferSpec, Slice
from .regcmd import Access, Reloc


class _Unkeyed(Exception):
    pass


# kinds a field holds as is: a field keeps one kind in every lowering, so 1 and True (equal
# in Python) never meet in one position
_RAW = frozenset({int, str, bool, type(None)})
# frozen dataclasses of ints, strings and a dtype (an address, a slice, a DMA stream, a
# layout: compile_cache._PLAIN's kind), compared and hashed as they are
_PLAIN = frozenset({Reloc, Slice, Access, CubeLayout})
_AS_IS = _RAW | _PLAIN


def _seq(x: Any) -> Any:
    if all(type(v) in _AS_IS for v in x):
        return (type(x).__name__, tuple(x))     # regcmd words, offsets, streams: as is
    return (type(x).__name__, *map(_canon, x))


def _map(x: Any) -> Any:
    return ("map", *sorted((repr(k), _canon(v)) for k, v in x.items()))


_BY_TYPE: dict[type, Callable[[Any], Any]] = {
    float: lambda x: ("float", x.hex()),
    tuple: _seq, list: _seq, dict: _map, MappingProxyType: _map,
    np.ndarray: lambda x: ("nd", x.dtype.str, x.shape, np.ascontiguousarray(x).tobytes()),
}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _canon(x: Any) -> Any:
    """A hashable value equal for equal inputs of the kinds a lowering holds; raises _Unkeyed
    for anything else (the buffer then keeps a range of its own)."""
    t = type(x)
    if t in _AS_IS:
        return x
    f = _BY_TYPE.get(t)
    if f is not None:
        return f(x)
    names = _FIELDS.get(t)
    if names is None and dataclasses.is_dataclass(t):
        names = _FIELDS[t] = tuple(fl.name for fl in dataclasses.fields(t))
    if names is not None:
        return (t.__qualname__, *(_canon(getattr(x, n)) for n in names))
    if isinstance(x, enum.Enum):
        return (t.__qualname__, x.name)
    if isinstance(x, np.dtype):
        return ("dtype", x.str)
    if isinstance(x, np.generic):
        return ("np", x.dtype.str, x.tobytes())
    raise _Unkeyed(t.__name__)


def _spec_key(spec: BufferSpec) -> Any:
    """A buffer spec without a constant's bytes: the values uploaded into a weights buffer move
    no address, and the layers' weights differ."""
    return _canon(replace(spec, data=None) if spec.data is not None else spec)


def _lowering_key(lowering: Any, memo: dict[int, tuple[Any, Any]],
                  tokens: dict[Any, int]) -> int:
    """A small number equal for lowerings alike field by field -- their buffer specs (constants'
    bytes aside) and steps (for an NPU lowering the regcmd words and relocations, which fix every
    address its tasks touch) -- or the lowering's own where a field is of a kind ``_canon``
    does not know. A matmul of the layers' structure shares its steps with the first one's
    (emitters/matmul.py), so those are taken apart once."""
    hit = memo.get(id(lowering))
    if hit is not None:
        return hit[0]
    steps = memo.get(id(lowering.steps))
    try:
        if steps is None:
            steps = memo[id(lowering.steps)] = (_canon(lowering.steps), lowering.steps)
        full: Any = (tuple(_spec_key(sp) for sp in lowering.buffers), steps[0])
    except _Unkeyed:
        full = ("own", id(lowering))
    key = tokens.setdefault(full, len(tokens))
    memo[id(lowering)] = (key, lowering)     # both held, so their ids are not reused
    return key


def pool_zero_buffers(bufs: Sequence[Any], calls: Sequence[Any], boundary: AbstractSet[int],
                      pool: bool = True) -> tuple[list[BufReq], dict[int, int]]:
    """The planner's requests for the arena buffers of ``bufs`` (lowered.Buf, every live
    interval set), the must-stay-zero ones pooled into shared slots (module docstring; none
    with ``pool`` false: ROCKJIT_NO_ZERO_POOLS), and each pooled buffer's slot (a request id
    below zero).
    ``boundary``: the buffers holding graph inputs and outputs, never pooled: the runtime
    writes and reads them around the run, outside every call's interval."""
    arena = [b for b in bufs if b.kind == "arena"]
    zero = {b.id for b in arena if b.zero and b.pinned and b.id not in boundary} \
        if pool else set()
    binds: dict[int, list[tuple]] = {bid: [] for bid in zero}
    memo: dict[int, tuple[Any, Any]] = {}
    tokens: dict[Any, int] = {}
    for pc in calls:
        for name, (bid, off) in pc.binding.items():
            if bid in binds:
                binds[bid].append((_lowering_key(pc.call.lowering, memo, tokens), name, off))
    classes: dict[tuple, list[Any]] = {}
    for b in arena:
        if b.id in zero:
            key = (b.size, b.align, tuple(sorted(binds[b.id])))
            classes.setdefault(key, []).append(b)
    reqs: list[BufReq] = []
    slot_of: dict[int, int] = {}
    for members in classes.values():
        if len(members) < 2:
            continue
        ends: list[int] = []          # per slot: the last step of its latest holder
        ids: list[int] = []
        for b in sorted(members, key=lambda b: (b.first, b.id)):
            k = next((i for i, e in enumerate(ends) if e < b.first), None)
            if k is None:
                k = len(ends)
                ends.append(-1)
                ids.append(-1 - len(reqs))
                reqs.append(BufReq(ids[k], b.size, b.align, 0, 0, True, f"zero pool: {b.name}"))
            ends[k] = b.last
            slot_of[b.id] = ids[k]
    reqs += [BufReq(b.id, b.size, b.align, b.first, b.last, b.pinned, b.name)
             for b in arena if b.id not in slot_of]
    return reqs, slot_of
