"""SigLIP-B/16 vision tower vs transformers' SiglipVisionModel (random weights, fp32)."""
from __future__ import annotations

import os
from functools import partial

os.environ["HF_HUB_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
import torch
from models_testutil import TOL, Timer, max_rel_err, random_fill_, report, save_state_dict

from models import siglip

pytestmark = pytest.mark.reference


def _run_case(tmp_path_factory, image_size: int, batch: int, seed: int, layers: int = 12):
    from transformers import SiglipVisionModel
    from transformers.initialization import no_init_weights

    cfg = siglip.SiglipVisionConfig(image_size=image_size, num_hidden_layers=layers)
    hf_cfg = cfg.to_hf()
    torch.manual_seed(seed)
    with Timer(f"siglip {image_size}: build HF model"), no_init_weights():
        model = SiglipVisionModel(hf_cfg).eval()
    random_fill_(model, seed)
    path = tmp_path_factory.mktemp("siglip") / f"siglip_{image_size}.safetensors"
    save_state_dict(model, path)
    pixels = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    with Timer(f"siglip {image_size}: HF forward"), torch.no_grad():
        out = model(pixel_values=pixels)
    ref = (out.last_hidden_state.numpy(), out.pooler_output.numpy())
    del model
    params = siglip.load_params(path, cfg)
    fn = jax.jit(partial(siglip.forward, config=cfg))
    with Timer(f"siglip {image_size}: JAX jit+forward"):
        ours = jax.block_until_ready(fn(params, pixels.numpy()))
    return cfg, ours, ref


@pytest.fixture(scope="module")
def case224(tmp_path_factory):
    return _run_case(tmp_path_factory, 224, batch=2, seed=0)


def test_siglip224_last_hidden_state(case224):
    cfg, (hidden, _), (ref_hidden, _) = case224
    assert hidden.shape == (2, 196, 768)
    err = max_rel_err(hidden, ref_hidden)
    report("siglip 224 last_hidden_state", err)
    assert err <= TOL


def test_siglip224_pooler_output(case224):
    cfg, (_, pooled), (_, ref_pooled) = case224
    assert pooled.shape == (2, 768)
    err = max_rel_err(pooled, ref_pooled)
    report("siglip 224 pooler_output", err)
    assert err <= TOL


def test_siglip512(tmp_path_factory):
    # The image size is the parameter under test (1024 tokens, a 1024-row position table);
    # the 12-layer stack is already covered at 224, so 2 layers keep this case cheap.
    cfg, (hidden, pooled), (ref_hidden, ref_pooled) = _run_case(tmp_path_factory, 512, 1, seed=1,
                                                                layers=2)
    assert hidden.shape == (1, 1024, 768)
    e_h, e_p = max_rel_err(hidden, ref_hidden), max_rel_err(pooled, ref_pooled)
    report("siglip 512 last_hidden_state", e_h)
    report("siglip 512 pooler_output", e_p)
    assert e_h <= TOL and e_p <= TOL


def test_siglip_wrong_image_size_is_reported():
    cfg = siglip.SiglipVisionConfig(num_hidden_layers=1)
    params = {k: np.zeros(s, np.float32) for k, s in siglip.expected_shapes(cfg).items()}
    with pytest.raises(ValueError, match="image_size=512"):
        siglip.forward(params, np.zeros((1, 3, 512, 512), np.float32), cfg)
