"""Must-stay-zero arena buffers pooled across layers (rockjit/lowering/zero_pools.py).

* The rule on hand-made buffers: alike buffers (the same lowering bound under the same name at
  the same offset, equal sizes) with disjoint live intervals share a slot, overlapping ones
  get another, and a buffer written anywhere else, bound at another offset, not zero-filled
  or holding a graph input or output keeps a range of its own.
* A 3-layer SigLIP on the simulator: its layers' zero buffers share slots, the arena is
  smaller than with ROCKJIT_NO_ZERO_POOLS (every one in a range of its own) and the output
  bits are the same, and the output stays within the fp16 bound of JAX's on the CPU when every
  other arena byte is NaN before the run and after a first call on other pixels (a pooled
  buffer that kept another layer's or call's bytes in its zero padding would show).
"""
from __future__ import annotations

import numpy as np
import pytest

import rockjit
from rockjit.lowering.lowered import Buf
from rockjit.lowering.op_lowering import BufferSpec, HostStep, OpLowering, Slice
from rockjit.lowering.zero_pools import pool_zero_buffers
from rockjit.oracle import tolerance as T


class _Call:
    def __init__(self, lowering: OpLowering) -> None:
        self.lowering = lowering


class _Placed:
    def __init__(self, lowering: OpLowering, binding: dict) -> None:
        self.call = _Call(lowering)
        self.binding = binding


def _pack(dst_offset: int = 0, table: float = 1.0) -> OpLowering:
    """A host step writing 96 of a buffer's 128 bytes (built afresh each time, as the
    pipeline's re-tiles are), with a constant whose values move no address."""
    return OpLowering((BufferSpec("src", "input", 96), BufferSpec("dst", "output", 128),
                       BufferSpec("t", "const", 8, data=np.full(4, table, np.float16))),
                      (HostStep("copy", {"src": Slice("src", 0, 96),
                                         "dst": Slice("dst", dst_offset, 96)}),))


def _zero(i: int, first: int, last: int, size: int = 128) -> Buf:
    return Buf(i, size, "arena", f"b{i}", pinned=True, zero=True, first=first, last=last)


def test_alike_zero_buffers_share_slots_by_interval() -> None:
    src = Buf(100, 96, "arena", "src", first=0, last=20)
    bufs = [src, _zero(0, 0, 2), _zero(1, 5, 7), _zero(2, 6, 9), _zero(3, 12, 13),
            _zero(4, 15, 16), _zero(5, 18, 19), _zero(6, 0, 20, size=256),
            Buf(7, 128, "arena", "out", pinned=True, first=0, last=20)]
    calls = [_Placed(_pack(), {"src": (100, 0), "dst": (b, 0)}) for b in (0, 1, 2)]
    calls.append(_Placed(_pack(dst_offset=32), {"src": (100, 0), "dst": (3, 0)}))
    calls.append(_Placed(_pack(), {"src": (100, 0), "dst": (4, 64)}))
    calls.append(_Placed(_pack(table=2.0), {"src": (100, 0), "dst": (5, 0)}))
    calls += [_Placed(_pack(), {"src": (100, 0), "dst": (b, 0)}) for b in (6, 7)]
    # 8 alike and in turn with 0, but a graph input or output: the runtime writes or reads it
    # outside every call's interval
    bufs.append(_zero(8, 3, 4))
    calls.append(_Placed(_pack(), {"src": (100, 0), "dst": (8, 0)}))
    reqs, slot_of = pool_zero_buffers(bufs, calls, boundary={8})
    # 0 and 1 in turn in one slot; 2 is live with 1, so another; 5 (steps 18-19, its
    # constant's values another layer's) takes the first slot free again
    assert slot_of[0] == slot_of[1] == slot_of[5] != slot_of[2]
    # another write offset (3), another binding offset (4), another size (6), not
    # zero-filled (7): not pooled
    assert not {3, 4, 6, 7, 8} & set(slot_of)
    slots = [r for r in reqs if r.id < 0]
    assert len(slots) == 2 and all(r.pinned and r.size == 128 for r in slots)
    assert {r.id for r in reqs} == {r.id for r in slots} | {100, 3, 4, 6, 7, 8}


def _siglip(layers: int, seed: int):
    from models import siglip
    from models.specs import configure

    cfg = configure(siglip.SiglipVisionConfig(), {
        "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": layers,
        "num_attention_heads": 3, "image_size": 56, "patch_size": 8})
    rng = np.random.default_rng(seed)
    params = {n: (rng.standard_normal(s) * 0.05 + (1.0 if "norm" in n and n.endswith("weight")
                                                    else 0.0)).astype(np.float32)
              for n, s in sorted(siglip.expected_shapes(cfg).items())}

    def fn(p, x):
        return siglip.forward(p, x, cfg)
    return fn, params, rng


@pytest.fixture(scope="module")
def three_layers():
    return _siglip(3, seed=5)


def test_layers_share_their_zero_buffers(three_layers, monkeypatch) -> None:
    fn, params, rng = three_layers
    pixels = rng.standard_normal((1, 3, 56, 56)).astype(np.float32)
    runs = {}
    for pool in (True, False):
        monkeypatch.setenv("ROCKJIT_NO_ZERO_POOLS", "0" if pool else "1")
        f = rockjit.compile(fn, resident_argnums=0, backend="sim")
        out = [np.asarray(o) for o in f(params, pixels)]
        runs[pool] = out, f.compiled(params, pixels)._runner.builder
    (pooled, b), (alone, b_alone) = runs[True], runs[False]
    zero = [x for x in b.bufs if x.kind == "arena" and x.zero]
    ranges = {(b.plan.offsets[x.id], x.size) for x in zero}
    assert len(zero) >= 6 and len(ranges) <= len(zero) // 2, (len(zero), len(ranges))
    assert len({(b_alone.plan.offsets[x.id], x.size) for x in b_alone.bufs
                if x.kind == "arena" and x.zero}) == len(zero)
    assert b.plan.size < b_alone.plan.size, (b.plan.size, b_alone.plan.size)
    # the same tasks on other bytes: the same bits
    for p, a in zip(pooled, alone):
        np.testing.assert_array_equal(p, a)


def test_pooled_zero_buffers_on_a_poisoned_arena(three_layers) -> None:
    fn, params, rng = three_layers
    first = rng.standard_normal((1, 3, 56, 56)).astype(np.float32)
    pixels = rng.standard_normal((1, 3, 56, 56)).astype(np.float32) * 3
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    f(params, first)          # leaves its bytes in the pooled slots' written parts
    prog = f.compiled(params, first)._runner.loaded_graph
    poison = np.full(prog.arena_bytes, 0xFF, np.uint8)      # fp16 NaN everywhere else
    zero = [b for b in prog.lowered.bufs if b.kind == "arena" and b.zero]
    for arena, _, _ in prog.context_bos.values():
        prog.program.write(arena, poison)
        for b in zero:
            prog.program.write(arena, np.zeros(b.size, np.uint8), prog.plan.offsets[b.id])
    got = f(params, pixels)
    c = f.compiled(params, pixels)
    assert c._runner.loaded_graph is prog
    refs = fn(params, pixels)
    for g, r, bd in zip(got, refs, T.graph_bound(c.graph, c.params, [pixels])):
        r = np.asarray(r, np.float64)
        T.check(np.asarray(g, np.float64), r, bd + 2.0 ** -23 * np.abs(r),
                "3-layer SigLIP, pooled zero buffers, poisoned arenas")
