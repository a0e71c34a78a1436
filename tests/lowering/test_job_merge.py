"""Runtime jobs linked into one kick per core and run of independent work (job_merge.py).

* A 1-layer SigLIP (small config, four heads) on the strict simulator, merging on and off:
  the same output bits, the same tasks in fewer jobs and kicks, and the output within the
  fp16 bound (tolerance.graph_bound) of JAX's on the CPU. The simulator follows the linked trailers as silicon does, so a redirect to the
  wrong task, or none, changes the bits or stops the run.
* In every merged job, no member reads bytes an earlier member wrote or writes bytes an
  earlier member touched, judged from the image builder's own DMA runs of each job
  (ImageBuilder._ranges), not from the merge's; the members' tasks are back to back.
* One context takes every job of a step: the most merging, the same bits again.
"""
from __future__ import annotations

import numpy as np
import pytest

import rockjit
from graphs_testutil import small_siglip
from rockjit.lowering.job_shapes import job_shape
from rockjit.oracle import tolerance as T


@pytest.fixture(scope="module")
def siglip_small():
    return small_siglip(hidden=128, heads=4, image=64, seed=12)


def _run(fn, params, pixels, monkeypatch, merge: bool):
    monkeypatch.setenv("ROCKJIT_NO_JOB_MERGE", "0" if merge else "1")
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    out = [np.asarray(o) for o in f(params, pixels)]
    c = f.compiled(params, pixels)
    return out, c.stats(), c


def test_merged_jobs_give_the_same_bits_in_fewer_jobs(siglip_small, monkeypatch) -> None:
    fn, params, pixels = siglip_small
    on, s_on, c = _run(fn, params, pixels, monkeypatch, True)
    off, s_off, _ = _run(fn, params, pixels, monkeypatch, False)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)
    assert s_on["tasks"] == s_off["tasks"]
    assert s_on["jobs"] < s_off["jobs"] and s_on["kicks"] < s_off["kicks"], (s_on, s_off)
    assert s_on["npu_steps"] == s_off["npu_steps"]
    ref = np.asarray(fn(params, pixels)[0], np.float64)
    bound = T.graph_bound(c.graph, c.params, [pixels])[0] + 2.0 ** -23 * np.abs(ref)
    T.check(on[0], ref, bound, "small SigLIP, jobs merged")


def _merged_groups(b, chained: bool):
    """Per merged job that is (``chained``) one self-chained kick, or else a kick per task: its
    members as (JobRef, runtime job index), in order."""
    out = []
    for si, st in enumerate(b.steps):
        into = b.job_groups.get(si)
        if into is None:
            continue
        members: dict[int, list] = {}
        k = 0
        for jr in st.jobs:
            for r in range(len(job_shape(b._shapes, jr.job).runtime)):
                members.setdefault(into[k], []).append((jr, r))
                k += 1
        assert k == len(into)
        out += [m for g, m in members.items() if len(m) > 1 and b.job_chained[si][g] == chained]
    return out


def _spans(runs):
    return [(lo, lo + (pieces - 1) * pitch + chunk) for lo, pieces, pitch, chunk in runs]


def _meet(a, b) -> bool:
    return any(lo < h and l2 < hi for lo, hi in a for l2, h in b)


@pytest.mark.parametrize("contexts", [None, 1])
def test_merged_members_are_independent_and_back_to_back(siglip_small, monkeypatch,
                                                         contexts) -> None:
    fn, params, pixels = siglip_small
    monkeypatch.delenv("ROCKJIT_NO_JOB_MERGE", raising=False)
    f = rockjit.compile(fn, resident_argnums=0, backend="null")
    f(params, pixels)
    b = f.compiled(params, pixels)._runner.builder
    if contexts is not None:
        from rockjit.lowering.image_builder import ImageBuilder
        b = ImageBuilder(b.lowered, contexts)
    groups = _merged_groups(b, chained=True)
    assert groups, "no step had independent jobs to merge"
    for members in groups:
        assert len({jr.core for jr, _ in members}) == 1
        # whole JobRefs: a member's op has one runtime job here, so its runs are the job's
        assert all(len(job_shape(b._shapes, jr.job).runtime) == 1 for jr, _ in members)
        seen_r: list = []
        seen_w: list = []
        for jr, _ in members:
            rd, wr = _spans(b._ranges(jr, "r")), _spans(b._ranges(jr, "w"))
            assert not _meet(rd, seen_w), f"{b.calls[jr.call].node} reads what a member wrote"
            assert not _meet(wr, seen_r + seen_w), f"{b.calls[jr.call].node} overwrites a member"
            seen_r += rd
            seen_w += wr
    # every job the image submits as one kick lists its tasks back to back (even-word stride)
    for js in b.image.jobs:
        if js.chained:
            for (bo, off, n), (bo2, off2, _) in zip(js.tasks, js.tasks[1:]):
                assert bo2 == bo and off2 == off + 8 * (n + (n & 1))


def test_one_context_merges_most_and_keeps_the_bits(siglip_small, monkeypatch) -> None:
    fn, params, pixels = siglip_small
    monkeypatch.delenv("ROCKJIT_NO_JOB_MERGE", raising=False)
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    want = [np.asarray(o) for o in f(params, pixels)]
    c = f.compiled(params, pixels)
    from rockjit.lowering.loaded_graph import LoadedGraph
    from rockjit.runtime import SimDevice

    dev = SimDevice(1)
    try:
        lg = LoadedGraph(c._runner.lowered, dev)
        got = lg.run([pixels])
        assert lg.image.stats["jobs"] <= c.stats()["jobs"]
        for a, b in zip(want, got):
            np.testing.assert_array_equal(np.asarray(b), a)
    finally:
        dev.close()


def test_the_model_prices_the_merged_jobs(siglip_small, monkeypatch) -> None:
    """The cost model sees the jobs the image submits: less dispatch with merging, the same
    DMA and MACs (the same tasks)."""
    from rockjit import cost

    fn, params, pixels = siglip_small
    est = {}
    for merge in (True, False):
        monkeypatch.setenv("ROCKJIT_NO_JOB_MERGE", "0" if merge else "1")
        f = rockjit.compile(fn, resident_argnums=0, backend="null")
        f(params, pixels)
        est[merge] = cost.estimate(cost.describe(f.compiled(params, pixels)._runner.builder))
    on, off = est[True].bucket_ms(), est[False].bucket_ms()
    assert on["dispatch"] < off["dispatch"], (on, off)
    assert on["dma"] == pytest.approx(off["dma"]) and on["mac"] == pytest.approx(off["mac"])
    assert est[True].ms < est[False].ms


def _first_trailer_redirects(b, js) -> bool:
    """Whether the first task of image job ``js`` ends in a PC redirect (job_merge._link's
    test of a sealed trailer, read from the context's regcmd words)."""
    from rockjit.lowering.regcmd import TRAILER_WORDS

    _, off, n = js.tasks[0]
    words = b.arrays[f"regcmd{js.core}"]
    return int(words[off // 8 + n - TRAILER_WORDS]) != 0


def test_dependent_jobs_share_a_job_only_as_a_kick_per_task(siglip_small, monkeypatch) -> None:
    """A core's dependent jobs of a step gathered into one job run a kick per task, and no such
    job starts with a redirecting task: the kernel would run it all as one batched kick, a
    task reading its predecessor's output inside one kick (job_merge._gather)."""
    fn, params, pixels = siglip_small
    monkeypatch.delenv("ROCKJIT_NO_JOB_MERGE", raising=False)
    f = rockjit.compile(fn, resident_argnums=0, backend="null")
    f(params, pixels)
    b = f.compiled(params, pixels)._runner.builder
    gathered = _merged_groups(b, chained=False)
    assert gathered, "no core had dependent jobs to gather"
    for members in gathered:
        assert len({jr.core for jr, _ in members}) == 1
    unchained = [js for js in b.image.jobs if not js.chained and len(js.tasks) > 1]
    assert unchained
    for js in unchained:
        assert not _first_trailer_redirects(b, js), js
    # a chained job's first task does redirect: the test reads the words it means to
    assert any(_first_trailer_redirects(b, js) for js in b.image.jobs
               if js.chained and len(js.tasks) > 1)


def test_no_job_is_gathered_where_a_job_costs_nothing(siglip_small, monkeypatch) -> None:
    """On the keep-attached kernel a job costs no more than its kicks (job_us = 0), so the
    model gathers nothing: a kick per task would only add kicks."""
    from rockjit import cost

    fn, params, pixels = siglip_small
    monkeypatch.delenv("ROCKJIT_NO_JOB_MERGE", raising=False)
    keep = cost.calibrated().keep_attached()
    monkeypatch.setattr(cost, "calibrated", lambda: keep)
    f = rockjit.compile(fn, resident_argnums=0, backend="null")
    f(params, pixels)
    b = f.compiled(params, pixels)._runner.builder
    assert _merged_groups(b, chained=True), "independent jobs are still linked"
    assert not _merged_groups(b, chained=False)
