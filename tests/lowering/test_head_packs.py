"""Attention's K and V packed into the weight layout one group of heads per core
(head_groups.py): each group's host step reads only its heads' planes, on
the core whose matmul made them, and writes them into the context of the NPU job that
multiplies by them next (context_copies.next_readers), so neither K, V nor their packed
weights cross the cores.

* A 1-layer SigLIP (six heads) on the strict simulator, grouped and not (``groups_pay``
  forced false): the same output bits, fewer bytes and copy steps between the cores, and the
  output within the fp16 bound of JAX's on the CPU, also with every arena byte poisoned (fp16
  NaN) before the run, so a context that read packed weights another context wrote would
  show it.
* One context: the groups' steps all in it, no copies, the same bits again.
* The decision is the cost model's: a pack that runs on the runtime's threads as one step and
  would run single-threaded in thirds stays one step (SigLIP-224's K), a large one is split.
"""
from __future__ import annotations

import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_poisoned, small_siglip
from rockjit.lowering import head_groups as HG
from rockjit.oracle import tolerance as T
from rockjit.runtime.host_threads import SPLIT_MIN_BYTES


@pytest.fixture(scope="module")
def siglip_six_heads():
    return small_siglip(hidden=192, heads=6, image=64, seed=3)


def _run(fn, params, pixels):
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    out = np.asarray(f(params, pixels)[0])
    c = f.compiled(params, pixels)
    return out, c.stats(), c


def _packs(c) -> list[int]:
    """Host steps per K/V weight pack call of the program."""
    b = c._runner.builder
    n: dict[int, int] = {}
    for st in b.steps:
        if st.kind != "npu" and b.calls[st.host[0]].node.startswith("pack_weight"):
            n[st.host[0]] = n.get(st.host[0], 0) + 1
    return sorted(n.values())


def test_grouped_packs_keep_the_bits_and_copy_less(siglip_six_heads, monkeypatch) -> None:
    fn, params, pixels = siglip_six_heads
    grouped, s_on, c = _run(fn, params, pixels)
    with monkeypatch.context() as m:
        m.setattr(HG, "groups_pay", lambda group_bytes: False)
        whole, s_off, c_off = _run(fn, params, pixels)
    np.testing.assert_array_equal(grouped, whole)
    assert s_on["host_bytes_copied"] < s_off["host_bytes_copied"], (s_on, s_off)
    assert s_on["host_copy_steps"] < s_off["host_copy_steps"], (s_on, s_off)
    # K's and V's bytes (64 tokens x 192 x fp16) no longer gathered to one core and scattered
    # back packed: at least two thirds of each, both ways
    kv = 2 * 64 * 192 * 2
    assert s_off["host_bytes_copied"] - s_on["host_bytes_copied"] >= 2 * kv * 2 // 3 * 0.9
    # the grouped packs are one step per group of heads (three cores): more steps per pack
    assert min(_packs(c)) > max(_packs(c_off)), (_packs(c), _packs(c_off))
    assert s_on["npu_steps"] == s_off["npu_steps"] and s_on["jobs"] == s_off["jobs"]
    ref = np.asarray(fn(params, pixels)[0], np.float64)
    bound = T.graph_bound(c.graph, c.params, [pixels])[0] + 2.0 ** -23 * np.abs(ref)
    check_bound(grouped, ref, bound, "small SigLIP, K and V packed per group of heads")


def test_grouped_packs_on_a_poisoned_arena(siglip_six_heads) -> None:
    fn, params, pixels = siglip_six_heads
    got, ref, bound = run_poisoned(fn, params, pixels)
    for g, r, b in zip(got, ref, bound):
        T.check(g, r, b, "small SigLIP, grouped packs, poisoned arenas")


def test_one_context_gives_the_same_bits(siglip_six_heads) -> None:
    # the same lowered program on one context: the groups' steps all in it, no copy at all
    from rockjit.lowering.loaded_graph import LoadedGraph
    from rockjit.runtime import SimDevice

    fn, params, pixels = siglip_six_heads
    want, _, c = _run(fn, params, pixels)
    dev = SimDevice(1)
    try:
        lg = LoadedGraph(c._runner.lowered, dev)
        got = np.asarray(lg.run([pixels])[0])
        assert lg.image.stats["host_bytes_copied"] == 0
        np.testing.assert_array_equal(got, want)
    finally:
        dev.close()


def test_the_cost_model_decides_the_groups() -> None:
    # SigLIP-224's K: 196 tokens x 768 x fp16 = 301 KB, threaded as one step, single-threaded
    # in thirds of 100 KB: the copies it saves are cheaper than the threads it loses
    k224 = 196 * 768 * 2
    assert k224 >= SPLIT_MIN_BYTES > k224 // 3
    assert not HG.groups_pay([k224 // 3] * 3)
    # at 1024 tokens each third is threaded too: the groups only save copies
    k1024 = 1024 * 768 * 2
    assert k1024 // 3 >= SPLIT_MIN_BYTES
    assert HG.groups_pay([k1024 // 3] * 3)
    # below the threading size either way: the groups save copies
    assert HG.groups_pay([8192] * 3)
