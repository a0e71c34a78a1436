"""Whisper encoder (tiny, base) vs transformers' WhisperEncoder (random weights, fp32, eager)."""
from __future__ import annotations

import os
from functools import partial

os.environ["HF_HUB_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
import torch
from models_testutil import TOL, Timer, max_rel_err, perturb_vectors_, report, save_state_dict

from models import whisper

pytestmark = pytest.mark.reference

# HF (like OpenAI's original) builds the table in float32: an angle near t = 1499 rad carries
# t * ulp(inv_ts)/2 + ulp(1499)/2 ~ 9e-5 + 6e-5 of rounding, so its sin/cos are only good to
# ~1.5e-4 absolute; our float64 formula is rounded once at the end.
SINUSOID_TOL = 2.5e-4

CONFIGS = {"tiny": whisper.WhisperEncoderConfig.tiny(), "base": whisper.WhisperEncoderConfig.base()}


def _hf_encoder(cfg: whisper.WhisperEncoderConfig, seed: int):
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(seed)
    return WhisperEncoder(cfg.to_hf()).eval()


@pytest.fixture(scope="module", params=["tiny", "base"])
def case(request, tmp_path_factory):
    name = request.param
    cfg = CONFIGS[name]
    with Timer(f"whisper {name}: build HF model"):
        model = _hf_encoder(cfg, seed=0)
        hf_positions = model.embed_positions.weight.detach().numpy().copy()
        perturb_vectors_(model, 0, skip=("embed_positions",))
    path = tmp_path_factory.mktemp("whisper") / f"whisper_{name}.safetensors"
    save_state_dict(model, path)
    feats = torch.randn(1, cfg.num_mel_bins, cfg.num_frames, generator=torch.Generator().manual_seed(2))
    with Timer(f"whisper {name}: HF forward"), torch.no_grad():
        ref = model(input_features=feats).last_hidden_state.numpy()
    del model
    params = whisper.load_params(path, cfg)
    fn = jax.jit(partial(whisper.forward, config=cfg))
    with Timer(f"whisper {name}: JAX jit+forward"):
        ours = np.asarray(fn(params, feats.numpy()))
    return name, cfg, params, hf_positions, ours, ref


def test_whisper_encoder_matches_hf(case):
    name, cfg, _, _, ours, ref = case
    assert ours.shape == (1, 1500, cfg.d_model)
    err = max_rel_err(ours, ref)
    report(f"whisper {name} last_hidden_state", err)
    assert err <= TOL


def test_whisper_sinusoid_formula_matches_hf_init(case):
    """Our formula vs the table HF's init writes (and that the checkpoint carries)."""
    name, cfg, params, hf_positions, _, _ = case
    table = whisper.sinusoids(cfg.max_source_positions, cfg.d_model)
    err_hf = float(np.max(np.abs(table - hf_positions)))
    err_file = float(np.max(np.abs(table - params["embed_positions.weight"])))
    print(f"\n[max abs err] whisper {name} sinusoids vs HF init: {err_hf:.3e}, vs file: {err_file:.3e}")
    assert err_hf <= SINUSOID_TOL and err_file <= SINUSOID_TOL


def test_whisper_sinusoid_formula_matches_hf_function():
    from transformers.models.whisper.modeling_whisper import sinusoids as hf_sinusoids

    # Short tables have small angles, where float32 is exact to ~1e-7: a tight check.
    for length, channels, tol in ((1500, 384, SINUSOID_TOL), (1500, 512, SINUSOID_TOL),
                                  (7, 10, 1e-6), (64, 32, 1e-5)):
        ref = hf_sinusoids(length, channels).numpy()
        ours = whisper.sinusoids(length, channels)
        assert ours.shape == ref.shape
        assert np.max(np.abs(ours - ref)) <= tol, (length, channels)
    with pytest.raises(ValueError, match="even"):
        whisper.sinusoids(4, 7)


def test_whisper_wrong_frame_count_is_reported():
    cfg = whisper.WhisperEncoderConfig.tiny()
    params = {k: np.zeros(s, np.float32) for k, s in whisper.expected_shapes(cfg).items()}
    with pytest.raises(ValueError, match="3000 frames"):
        whisper.forward(params, np.zeros((1, 80, 2999), np.float32), cfg)
