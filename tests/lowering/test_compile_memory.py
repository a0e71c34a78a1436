"""What a finished compile still holds (issue 9, memory): the lowering's intermediates (the
Lowerer with its folded fp32 constants and tensor map) must be freed by reference counting
when the compile returns, not left in a reference cycle for a full collection of the cyclic
collector, which the compile pauses (gc_pause.py) and which then runs rarely: a whole SigLIP
at 1024 tokens left ~3 GB that way between two tests.

The first two run with the collector disabled, so a cycle keeps its objects and the weakref
stays alive. The last checks that a context given only part of the weights (weight_spans.py)
still computes what numpy does."""
from __future__ import annotations

import gc
import weakref

import jax
import numpy as np
import pytest

import rockjit
from rockjit.lowering import compile_cache, pipeline


@pytest.fixture
def no_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Held:
    """Stands for a caller's local that a kept traceback would keep alive."""


def test_a_memoized_error_keeps_no_frames_alive(no_gc) -> None:
    """An error cached by ``memo`` and raised again holds no traceback into its callers."""
    refs = []

    def compute():
        held = _Held()
        refs.append(weakref.ref(held))
        raise ValueError("no form")

    def caller(key):
        local = _Held()             # a caller's local, as the Lowerer is in lower_node
        refs.append(weakref.ref(local))
        try:
            compile_cache.memo(key, compute)
        except ValueError as e:
            assert str(e) == "no form"
        else:
            raise AssertionError("memo did not raise the cached error")

    with compile_cache.compile_scope():
        caller("k")
        caller("k")                 # a hit: the cached error raised again
    assert len(refs) == 3
    assert [r() for r in refs] == [None] * 3


def test_the_lowerer_dies_with_the_compile(no_gc, monkeypatch) -> None:
    """An attention pooling (one query row from resident weights, as SigLIP's head: its
    deferred softmax division tries NPU forms that refuse with memoized errors) compiled for
    the null device: once ``compile()`` returns, the Lowerer and its constants are gone
    without a collection."""
    made = []
    run = pipeline.Lowerer.run

    def tracking_run(self):
        made.append(weakref.ref(self))
        return run(self)

    monkeypatch.setattr(pipeline.Lowerer, "run", tracking_run)

    def pool(w, x):
        q = w["probe"] @ w["q"]
        k, v = x @ w["k"], x @ w["v"]
        return jax.nn.softmax(q @ k.T * 0.125, axis=-1) @ v

    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal((64, 64)).astype(np.float32) * 0.1 for n in "qkv"}
    w["probe"] = rng.standard_normal((1, 64)).astype(np.float32)
    x = jax.ShapeDtypeStruct((32, 64), np.float32)
    compiled = rockjit.compile(pool, resident_argnums=0, backend="null").lower(w, x).compile()
    assert compiled.image is not None
    assert len(made) == 1
    assert made[0]() is None, "the Lowerer outlived the compile (a reference cycle holds it)"


def test_core_2_gets_only_its_high_weight_span_and_runs_right(monkeypatch) -> None:
    """A matmul dealt over three cores by output columns: each context's weights BO holds only
    the span of the packed weights its jobs use (weight_spans.py, image_builder
    ._lay_out_weights), core 2's from the top of the buffer, so the three BOs together hold
    the weights about once, where each used to be laid out for all of them (rocket pins every
    page of a BO). Run with every new BO filled with 0xAA (RJ_POISON_BOS): a job reading a
    byte its context was not given would read fp16 -0.052 where a weight of magnitude ~1
    belongs, and the result would miss numpy's by far more than fp16 rounding."""
    monkeypatch.setenv("RJ_POISON_BOS", "1")

    def mm(w, x):
        return x @ w["w"] + w["b"]

    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((768, 3072)).astype(np.float32),
         "b": rng.standard_normal(3072).astype(np.float32)}
    x = rng.standard_normal((196, 768)).astype(np.float32)
    f = rockjit.compile(mm, resident_argnums=0, backend="sim")
    img = f.lower(w, x).compile().image
    # the packed weights and bias cube, each byte once (the image stores each piece once)
    once = sum(a.size for name, a in img.arrays.items() if name.startswith("w"))
    assert once >= w["w"].size * 2
    spans = {}
    for k, bo in enumerate(img.bos):
        ups = [img.arrays[u.array].size for u in img.uploads
               if u.bo == k and u.array.startswith("w")]
        if bo.role == "weights" and ups:     # not the copy descriptors' BO
            assert bo.core not in spans, f"two weights BOs in context {bo.core}"
            spans[bo.core] = (bo.size, sum(ups))
    assert set(spans) == {0, 1, 2}, f"the matmul was not dealt over three cores: {spans}"
    size, uploaded = spans[2]
    assert size < once / 2 and uploaded > size * 0.9, (
        f"core 2 should hold only its span of the {once} packed bytes: {spans[2]}")
    total = sum(size for size, _ in spans.values())
    assert total < once * 1.3, f"the contexts hold the weights {total / once:.2f} times"
    uploads = {(u.bo, u.array): img.arrays[u.array] for u in img.uploads}
    top = [a for (bo, name), a in uploads.items() if img.bos[bo].core == 2 and "@" in name]
    assert top, "core 2 should be given a piece from inside the buffer, not all of it"
    got = np.asarray(f(w, x), np.float64)
    want = x.astype(np.float64) @ w["w"].astype(np.float64) + w["b"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2e-3, f"max |ours - numpy| / max |numpy| = {err:.2e}"


def test_a_forward_after_the_first_hands_no_heap_back(monkeypatch) -> None:
    """The heap is handed back to the kernel around a compile and a load (gc_pause), not
    around every forward: per call, malloc_trim made the next arrays fault their pages in
    again (SigLIP-224 one layer: host cost ~1.7 -> ~3.8 ms per forward on the null backend).
    The forwards still compute what numpy does."""
    from rockjit import gc_pause

    trims = []
    monkeypatch.setattr(gc_pause, "return_free_heap", lambda: trims.append(1))
    w = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    x = np.linspace(-2, 2, 16 * 64, dtype=np.float32).reshape(16, 64)
    f = rockjit.compile(lambda w, x: x @ w, resident_argnums=0, backend="sim")
    first = np.asarray(f(w, x))
    assert trims, "the first call compiles and loads under gc_paused"
    trims.clear()
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(w, x)), first, rtol=0, atol=0)
    assert not trims, f"{len(trims)} heap trims over 3 forwards"
    np.testing.assert_allclose(first, x @ w, rtol=2e-3, atol=2e-2)


def test_a_weights_buffer_addressed_without_a_declared_read_goes_whole() -> None:
    """weight_spans.context_spans: a declared stream gives its bytes; an address word into a
    weights buffer with no declared stream gives the whole buffer (how far the hardware reads
    from it is not known there), as coalesce counts such a name."""
    from types import SimpleNamespace

    from rockjit.lowering.op_lowering import NpuJob
    from rockjit.lowering.regcmd import Access, Kick, Reloc
    from rockjit.lowering.schedule import JobRef
    from rockjit.lowering.weight_spans import context_spans

    def job(relocs, reads):
        return NpuJob((Kick("rc", 0, (), relocs, (0,), (1,), (0,), tuple(reads), ()),))

    bufs = [SimpleNamespace(kind="weights", size=4096), SimpleNamespace(kind="weights", size=512)]
    declared = job({0: Reloc("w", 256)}, [Access("w", 256, 128, 128)])
    undeclared = job({0: Reloc("t", 64)}, [])
    b = SimpleNamespace(
        steps=[SimpleNamespace(jobs=[JobRef(0, declared, 1), JobRef(0, undeclared, 2),
                                     JobRef(0, undeclared, 0)])],
        calls=[SimpleNamespace(binding={"w": (0, 1024), "t": (1, 0)})], bufs=bufs, _shapes={})
    spans = context_spans(b)
    assert spans == {(1, 0): (1280, 1408), (2, 1): (0, 512)}, spans


def test_weight_spans_of_one_job_shared_by_two_calls_follow_each_binding() -> None:
    """context_spans takes each job apart once (the layers' calls share their jobs) and
    applies every call's own binding: the same job under two bindings, on two contexts, and
    under a binding that puts its weights name in the arena, gives each call's own span."""
    from types import SimpleNamespace

    from rockjit.lowering.op_lowering import NpuJob
    from rockjit.lowering.regcmd import Access, Kick, Reloc
    from rockjit.lowering.schedule import JobRef
    from rockjit.lowering.weight_spans import context_spans

    def kick(relocs, reads):
        return Kick("rc", 0, (), relocs, (0,), (1,), (0,), tuple(reads), ())

    # read [256, 384) of "w" in the first kick, an address of "w" at 500 in the second
    shared = NpuJob((kick({0: Reloc("w", 300)}, [Access("w", 256, 128, 128)]),
                     kick({0: Reloc("w", 500)}, [])))
    bufs = [SimpleNamespace(kind="weights", size=4096), SimpleNamespace(kind="weights", size=4096),
            SimpleNamespace(kind="arena", size=4096)]
    calls = [SimpleNamespace(binding={"w": (0, 1000)}), SimpleNamespace(binding={"w": (1, 2000)}),
             SimpleNamespace(binding={"w": (2, 0)})]
    b = SimpleNamespace(
        steps=[SimpleNamespace(jobs=[JobRef(0, shared, 1), JobRef(1, shared, 1)]),
               SimpleNamespace(jobs=[JobRef(1, shared, 2), JobRef(2, shared, 2),
                                     JobRef(0, shared, 0)])],
        calls=calls, bufs=bufs, _shapes={})
    spans = context_spans(b)
    assert spans == {(1, 0): (1256, 1501), (1, 1): (2256, 2501), (2, 1): (2256, 2501)}, spans
