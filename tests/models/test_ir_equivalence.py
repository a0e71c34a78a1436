"""rockjit's IR interpreter run of each traced encoder vs the same function under jax.jit.

Small configs that still use every feature: SigLIP's conv patch embedding, attention and
pooling head; ModernBERT's layer-0 identity norm, global and sliding layers (window smaller than
the sequence), both RoPE thetas and padding; Whisper's two convs (stride 2) and bias-free k_proj.
"""
from __future__ import annotations

import time
from functools import partial

import jax
import numpy as np
import pytest
from models_testutil import max_rel_err, report

import rockjit
from models import modernbert, siglip, whisper

IR_TOL = 1e-5


def _random_params(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    # Scales large enough that attention is far from uniform and every weight matters.
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in shapes.items():
        if len(s) == 1 and k.endswith("weight"):
            out[k] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            out[k] = (0.1 * rng.standard_normal(s)).astype(np.float32)
    return out


def _siglip_case():
    cfg = siglip.SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, image_size=48, patch_size=16)
    params = _random_params(siglip.expected_shapes(cfg), 0)
    x = np.random.default_rng(1).standard_normal((2, 3, 48, 48)).astype(np.float32)
    return partial(siglip.forward, config=cfg), params, (x,)


def _modernbert_case():
    cfg = modernbert.ModernBertConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      local_attention=8, pad_token_id=0)
    params = _random_params(modernbert.expected_shapes(cfg), 2)
    rng = np.random.default_rng(3)
    ids = rng.integers(1, 97, (2, 24)).astype(np.int32)
    mask = np.ones((2, 24), np.int32)
    mask[1, 15:] = 0
    ids[1, 15:] = 0
    return partial(modernbert.forward, config=cfg), params, (ids, mask)


def _whisper_case():
    cfg = whisper.WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                       encoder_ffn_dim=128, num_mel_bins=16,
                                       max_source_positions=40)
    params = _random_params(whisper.expected_shapes(cfg), 4)
    params["embed_positions.weight"] = whisper.sinusoids(40, 64)
    x = np.random.default_rng(5).standard_normal((1, 16, 80)).astype(np.float32)
    return partial(whisper.forward, config=cfg), params, (x,)


CASES = {"siglip": _siglip_case, "modernbert": _modernbert_case, "whisper": _whisper_case}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ir_interpreter_matches_jax(name):
    fn, params, inputs = CASES[name]()
    want = jax.tree_util.tree_leaves(jax.jit(fn)(params, *inputs))

    compiled_fn = rockjit.compile(fn, resident_argnums=(0,), backend="interpreter")
    t0 = time.perf_counter()
    compiled = compiled_fn.lower(params, *inputs).compile()
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = jax.tree_util.tree_leaves(compiled(params, *inputs))
    t_run = time.perf_counter() - t0

    counts: dict[str, int] = {}
    for node in compiled.graph.nodes:
        counts[node.op.text] = counts.get(node.op.text, 0) + 1
    print(f"\n[ir] {name}: trace+import {t_trace:.2f} s, interpret {t_run:.2f} s, "
          f"{len(compiled.graph.nodes)} nodes: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))

    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        if name == "modernbert":  # padded rows carry no meaning; compare real tokens only
            valid = inputs[1].astype(bool)
            g, w = g[valid], w[valid]
        err = max_rel_err(g, w)
        report(f"IR interpreter vs JAX, {name} output {i}", err)
        assert err <= IR_TOL
