"""ModernBERT-base encoder vs transformers' ModernBertModel (random weights, fp32, eager).

A batch of two sequences padded to 200 tokens: longer than the 129-token local window, so
sliding-window layers differ from global ones, and one row is padded, so the key mask matters.
"""
from __future__ import annotations

import os
from functools import partial

os.environ["HF_HUB_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
import torch
from models_testutil import TOL, Timer, max_rel_err, random_fill_, report, save_state_dict

from models import modernbert

pytestmark = pytest.mark.reference

SEQ = 200
LENGTHS = (200, 137)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from transformers import ModernBertModel
    from transformers.initialization import no_init_weights

    cfg = modernbert.ModernBertConfig()
    hf_cfg = cfg.to_hf()
    torch.manual_seed(0)
    with Timer("modernbert: build HF model"), no_init_weights():
        model = ModernBertModel(hf_cfg).eval()
    random_fill_(model, 0)
    assert model.config._attn_implementation == "eager"
    path = tmp_path_factory.mktemp("modernbert") / "modernbert.safetensors"
    save_state_dict(model, path)

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50000, (len(LENGTHS), SEQ), generator=g)
    mask = torch.zeros(len(LENGTHS), SEQ, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        ids[row, n:] = cfg.pad_token_id
    with Timer("modernbert: HF forward"), torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        n = LENGTHS[1]
        ref_alone = model(input_ids=ids[1:2, :n]).last_hidden_state.numpy()[0]
    del model
    params = modernbert.load_params(path, cfg)
    fn = jax.jit(partial(modernbert.forward, config=cfg))
    with Timer("modernbert: JAX jit+forward"):
        ours = np.asarray(fn(params, ids.numpy().astype(np.int32), mask.numpy().astype(np.int32)))
    return cfg, ours, ref, mask.numpy().astype(bool), ref_alone


def test_modernbert_unpadded_positions_match_hf(case):
    cfg, ours, ref, valid, _ = case
    assert ours.shape == (2, SEQ, 768)
    err = max_rel_err(ours[valid], ref[valid])
    report("modernbert last_hidden_state (non-padded)", err)
    assert err <= TOL


def test_modernbert_padded_row_matches_hf(case):
    # The padded row alone: its tokens must ignore the padding keys exactly as HF does.
    cfg, ours, ref, valid, _ = case
    err = max_rel_err(ours[1][valid[1]], ref[1][valid[1]])
    report("modernbert padded row (137 tokens)", err)
    assert err <= TOL


def test_modernbert_padding_does_not_leak(case):
    """Our padded 137-token row vs HF run on that row alone, unpadded and without a mask."""
    cfg, ours, _, _, ref_alone = case
    n = LENGTHS[1]
    err = max_rel_err(ours[1, :n], ref_alone)
    report("modernbert row 1 padded (ours) vs unpadded (HF)", err)
    assert err <= TOL


def test_modernbert_layer_pattern_and_window():
    cfg = modernbert.ModernBertConfig()
    assert [i for i in range(cfg.num_hidden_layers) if cfg.is_global(i)] == [0, 3, 6, 9, 12, 15, 18, 21]
    shapes = modernbert.expected_shapes(cfg)
    assert "layers.0.attn_norm.weight" not in shapes and "layers.1.attn_norm.weight" in shapes
    g, l = modernbert.attention_biases(np.ones((1, 140), np.int32), cfg)
    allowed = np.asarray(l[0, 0]) == 0
    # +-64 tokens: row 70 sees 6..134, not 5 or 135.
    assert allowed[70, 6] and allowed[70, 134] and not allowed[70, 5] and not allowed[70, 135]
    assert (np.asarray(g) == 0).all()


def test_modernbert_mismatched_mask_is_reported():
    cfg = modernbert.ModernBertConfig(num_hidden_layers=1, vocab_size=16)
    params = {k: np.zeros(s, np.float32) for k, s in modernbert.expected_shapes(cfg).items()}
    with pytest.raises(ValueError, match="same"):
        modernbert.forward(params, np.zeros((1, 8), np.int32), np.ones((1, 7), np.int32), cfg)
