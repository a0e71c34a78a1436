"""The coalescing pass (rockjit/lowering/coalesce.py): independent host steps move ahead of NPU
steps, adjacent context-0 NPU steps become one, and no dependency is broken.

* Whole graphs on the strict simulator, against JAX on CPU (graphs_testutil: the fp16 bound
  of tolerance.graph_bound, which a row swap fails): a host op on an input is hoisted and the
  two NPU ops around it share a step; a host op on an NPU result stays between them.
* Hand-built schedules, with the expected order worked out from the accesses: a host step that
  overwrites bytes an NPU job reads stays after it (WAR), one that writes bytes a job reads
  stays before it (RAW), a step on another context is never merged.
* A 1-layer SigLIP (small config): fewer NPU steps than without the pass, and the same bits.
"""
from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_sim, small_siglip
from rockjit.lowering.coalesce import coalesce, dependencies, merge, reorder
from rockjit.lowering.op_lowering import HostStep, NpuJob, Slice
from rockjit.lowering.regcmd import Access, Kick
from rockjit.lowering.schedule import JobRef, ScheduledStep


def _steps(c) -> list[str]:
    """'npu' / 'host <op>' per step of a compiled function's image."""
    img = c._runner.image
    out = []
    for s in img.steps:
        node = img.sources[s.source].node if s.source >= 0 else ""
        out.append("npu" if s.kind == "npu" else f"host {node}")
    return out


def _matmul_then_add_of_host_log(w, x, y):
    a = x @ w             # NPU
    s = jnp.log(y)        # host, reads only an input
    return a + s          # NPU


def _matmul_log_matmul(w, x):
    a = x @ w["a"]        # NPU
    s = jnp.log(a)        # host, reads the NPU result
    return s @ w["b"]     # NPU


def test_independent_host_step_is_hoisted_and_npu_steps_merge(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    y = rng.uniform(1.0, 2.0, (16, 64)).astype(np.float32)
    got, ref, bound, st, _ = run_sim(_matmul_then_add_of_host_log, w, x, y)
    check_bound(got, ref, bound, "x @ w + log(y), coalesced")
    assert st["npu_ops"] == 2 and st["npu_steps"] == 1, st
    monkeypatch.setenv("ROCKJIT_NO_COALESCE", "1")
    off = rockjit.compile(_matmul_then_add_of_host_log, resident_argnums=0, backend="sim")
    np.testing.assert_array_equal(np.asarray(off(w, x, y)), got)   # a pure reordering
    assert off.compiled(w, x, y).stats()["npu_steps"] == 2


def test_host_step_on_an_npu_result_stays_between(monkeypatch) -> None:
    rng = np.random.default_rng(4)
    w = {"a": (rng.uniform(0.0, 1.0, (64, 64)) / 8).astype(np.float32),
         "b": (rng.standard_normal((64, 32)) / 8).astype(np.float32)}
    x = rng.uniform(0.1, 1.0, (16, 64)).astype(np.float32)
    got, ref, bound, st, _ = run_sim(_matmul_log_matmul, w, x)
    check_bound(got, ref, bound, "log(x @ a) @ b, coalesced")
    assert st["npu_steps"] == 2, st
    f = rockjit.compile(_matmul_log_matmul, resident_argnums=0, backend="sim")
    order = _steps(f.compiled(w, x))
    first, last = order.index("npu"), len(order) - 1 - order[::-1].index("npu")
    assert any("= log" in s for s in order[first:last]), order


# ---------------------------------------------------------------- hand-built schedules

def _kick(reads=(), writes=()) -> Kick:
    return Kick("rc", 0, (), {}, (0,), (1,), (0,), tuple(reads), tuple(writes))


def _npu(call: int, reads=(), writes=(), core: int = 0) -> ScheduledStep:
    return ScheduledStep("npu", [JobRef(call, NpuJob((_kick(reads, writes),)), core)])


def _host(call: int, dst: Slice, src: Slice) -> ScheduledStep:
    return ScheduledStep("host", host=(call, HostStep("copy", {"dst": dst, "src": src})))


# call 0 binds "s" to bytes [0, 256) of buffer 7 and "in" to buffer 1; call 1 binds "t" to
# bytes [128, 256) of buffer 7 (a slot of the same buffer) and "in" to buffer 2
CALLS = [SimpleNamespace(binding={"s": (7, 0), "in": (1, 0), "out": (3, 0)}),
         SimpleNamespace(binding={"t": (7, 128), "in": (2, 0), "out": (4, 0)})]


def test_war_on_a_scratch_region_is_kept_and_a_disjoint_write_is_hoisted() -> None:
    steps = [
        _npu(0, reads=[Access("s", 0, 64, 64)], writes=[Access("out", 0, 64, 64)]),   # 0
        _host(0, Slice("s", 0, 64), Slice("in", 0, 64)),        # 1: overwrites what 0 reads
        _host(0, Slice("s", 64, 64), Slice("in", 0, 64)),       # 2: disjoint bytes of s
        _npu(0, reads=[Access("s", 64, 64, 64)], writes=[Access("out", 64, 64, 64)]),  # 3
        _host(1, Slice("t", 0, 64), Slice("in", 0, 64)),        # 4: s bytes [128, 192)
        _npu(0, reads=[Access("s", 0, 64, 64)], writes=[Access("out", 128, 64, 64)]),  # 5
    ]
    preds = dependencies(steps, CALLS)
    assert preds[1] == {0} and preds[2] == set() and preds[3] == {2}
    assert preds[4] == set() and preds[5] == {1}      # RAW on s[0:64); reads of 0 are no edge
    order = reorder(steps, preds)
    assert order == [2, 4, 0, 3, 1, 5]
    merged, ordered, multi = coalesce(steps, CALLS)
    assert [s.kind for s in merged] == ["host", "host", "npu", "host", "npu"] and not multi
    assert len(merged[2].jobs) == 2 and [s for s in ordered] == [steps[i] for i in order]


def test_data_crossing_contexts_splits_merged_steps() -> None:
    # a chain through "out": 0 -> 1 (on context 1) -> 2: each hand-over needs a copy between
    # steps, so nothing merges
    steps = [_npu(0, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)]),
             _npu(0, reads=[Access("out", 0, 64, 64)], writes=[Access("out", 64, 64, 64)], core=1),
             _npu(0, reads=[Access("out", 64, 64, 64)], writes=[Access("out", 128, 64, 64)])]
    merged, _, multi = coalesce(steps, CALLS)
    assert [len(s.jobs) for s in merged] == [1, 1, 1] and not multi
    # the same on context 1 throughout, a context-0 job beside it on other bytes, and a
    # context-2 job that only reads what context 0 wrote before: one merged step over three
    # contexts, whose calls keep their bytes for all of it
    steps = [_npu(0, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)], core=1),
             _npu(0, reads=[Access("out", 0, 64, 64)], writes=[Access("out", 64, 64, 64)], core=1),
             _npu(1, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)]),
             _npu(0, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 128, 64, 64)], core=2)]
    merged, ordered, multi = coalesce(steps, CALLS)
    assert [len(s.jobs) for s in merged] == [4] and multi == [range(0, 4)]
    assert merge(ordered, CALLS)[1] == multi
    # context 2 reading bytes context 1 wrote in the open step: a new step
    steps[3] = _npu(0, reads=[Access("out", 64, 64, 64)], writes=[Access("out", 128, 64, 64)],
                    core=2)
    merged, _, multi = coalesce(steps, CALLS)
    assert [len(s.jobs) for s in merged] == [3, 1] and multi == [range(0, 3)]
    one_context = [_npu(0, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)]),
                   _npu(1, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)])]
    assert [len(s.jobs) for s in coalesce(one_context, CALLS)[0]] == [2]


def test_a_step_joining_the_open_step_goes_before_ready_host_steps() -> None:
    # 0: context 0 reads "in"; 1: a host step on 0's result; 2: a job on context 1 that needs
    # only "in" (a norm's x * 2^-s0 beside its first reduce); 3: needs the host result.
    # Without touches the host step runs first and 2 lands in 3's step; with them 2 joins 0
    steps = [_npu(0, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)]),
             _host(0, Slice("s", 0, 64), Slice("out", 0, 64)),
             _npu(1, reads=[Access("in", 0, 64, 64)], writes=[Access("out", 0, 64, 64)], core=1),
             _npu(0, reads=[Access("s", 0, 64, 64)], writes=[Access("out", 128, 64, 64)])]
    preds = dependencies(steps, CALLS)
    assert preds == [set(), {0}, set(), {1}]
    assert reorder(steps, preds) == [0, 1, 3, 2]
    merged, _, multi = coalesce(steps, CALLS)
    assert [s.kind for s in merged] == ["npu", "host", "npu"] and multi == [range(0, 2)]
    assert [len(s.jobs) for s in merged if s.kind == "npu"] == [2, 1]
    # a job on context 1 reading what context 0 wrote in the open step cannot join it: the
    # host step keeps its place before it
    steps[2] = _npu(0, reads=[Access("out", 0, 64, 64)], writes=[Access("out", 192, 64, 64)],
                    core=1)
    merged, ordered, _ = coalesce(steps, CALLS)
    assert [s.kind for s in ordered] == ["npu", "host", "npu", "npu"]
    assert [len(s.jobs) for s in merged if s.kind == "npu"] == [1, 2]
    # coalesce takes reorder's join decisions: merge on the order decides the same
    again, multi_again = merge(ordered, CALLS)
    assert [s.jobs for s in again] == [s.jobs for s in merged] and multi_again == _


def test_an_undeclared_buffer_counts_as_all_of_it() -> None:
    # a job naming "s" with no declared stream: every host write to s must stay after it
    job = NpuJob((_kick(),), reads=("s",), writes=("out",))
    steps = [ScheduledStep("npu", [JobRef(0, job, 0)]),
             _host(1, Slice("t", 64, 64), Slice("in", 0, 64))]
    assert dependencies(steps, CALLS)[1] == {0}


# ---------------------------------------------------------------- a 1-layer SigLIP

@pytest.fixture(scope="module")
def siglip_small():
    return small_siglip(hidden=64, heads=2, image=48, seed=11)


def test_siglip_layer_has_fewer_npu_steps_and_the_same_bits(siglip_small, monkeypatch) -> None:
    fn, params, pixels = siglip_small
    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ROCKJIT_NO_COALESCE", flag)
        f = rockjit.compile(fn, resident_argnums=0, backend="sim")
        runs[flag] = ([np.asarray(o) for o in f(params, pixels)],
                      f.compiled(params, pixels).stats())
    (off, s_off), (on, s_on) = runs["1"], runs["0"]
    # measured: 69 NPU steps without the pass, 25 with it (3 contexts: the steps whose jobs
    # the cost model deals over several cores stay alone; host LayerNorm / softmax tails split
    # the rest)
    assert s_on["npu_steps"] <= 26 and s_on["npu_steps"] * 2.5 <= s_off["npu_steps"], (s_on, s_off)
    # coalescing moves host ops and adds none (brought next to each other, more of them may
    # run as one fused step: lowering/host_fuse.py)
    ops = [s["host_steps"] + s["host_fused_ops"] - s["host_fused_steps"] for s in (s_on, s_off)]
    # the same tasks; more of them share a step on a core, where job_merge.py links them
    assert s_on["tasks"] == s_off["tasks"] and s_on["jobs"] <= s_off["jobs"], (s_on, s_off)
    assert ops[0] == ops[1], ops
    for a, b in zip(off, on):
        np.testing.assert_array_equal(a, b)
    ref = fn(params, pixels)[0]
    cos = float(np.vdot(on[0], ref) / np.linalg.norm(on[0]) / np.linalg.norm(ref))
    assert cos > 0.999, cos
