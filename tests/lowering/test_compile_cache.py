"""The per-compile memo (rockjit/lowering/compile_cache.py) changes compile time only: a
2-layer SigLIP and a 4-layer ModernBERT (one global/local period) compile to the same program
image -- regcmd words, relocations, uploaded weights and constants, jobs, steps -- with the
memo on and off (ROCKJIT_NO_COMPILE_CACHE=1). The second layer reuses the first layer's tile
plans, element-wise programs and matmul programs (with its own weights and biases packed), so a
reused program that kept the first layer's bytes fails here. Small configs: a few seconds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rockjit
from models.presets import MODELS
from models.weights import seeded_weights
from rockjit.lowering import compile_cache

SIGLIP = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 48, "patch_size": 8}
MODERNBERT = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 4, "num_attention_heads": 2, "local_attention": 16}


def _image(preset: str, overrides: dict, seq_len: int):
    entry = MODELS[preset]
    cfg = entry.configure(overrides)
    params = seeded_weights(entry.module.expected_shapes(cfg))
    inputs = entry.make_inputs(np.random.default_rng(1), cfg, seq_len)
    f = rockjit.compile(entry.forward(cfg), resident_argnums=0, backend="null")
    return f.lower(params, *inputs).compile().image


def _fields(image) -> dict:
    return {f.name: getattr(image, f.name) for f in dataclasses.fields(image)
            if f.name != "arrays"}


@pytest.mark.parametrize("preset,overrides,seq_len", [
    ("siglip", SIGLIP, 0), ("modernbert", MODERNBERT, 40)], ids=["siglip-2", "modernbert-4"])
def test_same_image_with_and_without_the_memo(monkeypatch, preset, overrides, seq_len):
    monkeypatch.delenv("ROCKJIT_NO_COMPILE_CACHE", raising=False)
    hits = []
    real_memo = compile_cache.memo

    def counting_memo(key, compute):
        cache = compile_cache._scope.get()
        hits.append(cache is not None and key in cache)
        return real_memo(key, compute)

    monkeypatch.setattr(compile_cache, "memo", counting_memo)
    import rockjit.lowering.tiling as tiling
    import rockjit.lowering.emitters.eltwise as eltwise
    monkeypatch.setattr(tiling, "memo", counting_memo)
    monkeypatch.setattr(eltwise, "memo", counting_memo)
    cached = _image(preset, overrides, seq_len)
    assert any(hits), "the memo was never hit: the test no longer exercises it"
    monkeypatch.setenv("ROCKJIT_NO_COMPILE_CACHE", "1")
    hits.clear()
    plain = _image(preset, overrides, seq_len)
    assert not any(hits), "ROCKJIT_NO_COMPILE_CACHE=1 left the memo on"
    assert _fields(cached) == _fields(plain)
    assert sorted(cached.arrays) == sorted(plain.arrays)
    for k in cached.arrays:
        assert np.array_equal(cached.arrays[k], plain.arrays[k]), k


def test_memo_reraises_and_is_scoped():
    calls = []

    def boom():
        calls.append(1)
        raise ValueError("no tiling", 3)

    with compile_cache.compile_scope():
        for _ in range(2):
            with pytest.raises(ValueError) as e:
                compile_cache.memo(("k",), boom)
            assert e.value.args == ("no tiling", 3)
        assert compile_cache.memo(("x",), lambda: 5) == 5
        assert compile_cache.memo(("x",), lambda: 6) == 5
    assert len(calls) == 1
    # outside a scope nothing is kept
    assert compile_cache.memo(("x",), lambda: 7) == 7


def test_memoized_tells_apart_what_equality_would_merge():
    seen = []

    @compile_cache.memoized
    def emit(value, layout=None):
        seen.append(value)
        return (repr(value), layout)

    with compile_cache.compile_scope():
        for v in (0.0, -0.0, 1, 1.0, True, 0.0, (0.0,), (-0.0,)):
            assert emit(v) == (repr(v), None)
        # an array argument is not a key: computed every time
        emit(np.zeros(2))
        emit(np.zeros(2))
    assert [repr(v) for v in seen[:7]] == ["0.0", "-0.0", "1", "1.0", "True", "(0.0,)", "(-0.0,)"]
    assert len(seen) == 9
