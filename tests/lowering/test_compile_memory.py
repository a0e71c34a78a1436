"""What a finished compile still holds (issue 9, memory): the lowering's intermediates (the
Lowerer with its folded fp32 constants and tensor map) must be freed by reference counting
when the compile returns, not left in a reference cycle for a full collection of the cyclic
collector, which the compile pauses (gc_pause.py) and which then runs rarely: a whole SigLIP
at 1024 tokens left ~3 GB that way between two tests.

Both tests run with the collector disabled, so a cycle keeps its objects and the weakref
stays alive."""
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
