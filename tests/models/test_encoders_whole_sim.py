"""SigLIP-B/16 (224 and 512) and Whisper-base (30 s) WHOLE on the strict simulator, against JAX
on CPU and against transformers in fp32, final output and every layer (issues 13 and 7).

One simulator run per config: ``forward(..., output_hidden_states=True)`` returns HF's
``hidden_states`` (the embeddings and each layer's output) with the final outputs, so the run
that gives the final cosine also gives every layer's. References are independent: HF
transformers in fp32 (eager attention) on the same random weights (models_testutil.random_fill_,
saved and loaded through safetensors), and the same JAX function on CPU.

Each model runs clean at batch 2 and with planted outliers at batch 1 (issue 7: "of the kind
real checkpoints have"):
* a residual-stream channel of ~400 (SigLIP) / ~600 (Whisper; real whisper-base carries ~620)
  in every row, through the position table;
* LayerNorm gains of 10-50 on four channels of every LayerNorm;
* one layer's q and k weights scaled by 150-275: its scaled attention logits reach 2-3e4, near
  fp16's 65504 (q k^T before the 1/8 scale would be 8x that: it overflowed until
  score_scales.rewrite_score_scales).
The test asserts each planted activation is present in HF's run, so it cannot pass vacuously.

Checks: final cosine >= 0.9999 against JAX and against HF (per batch element too), mean
per-layer cosine >= 0.99999 against HF, and every row of every layer >= 0.999 (a row turned
into a LayerNorm's bias cannot hide). With outliers, the cosine over all channels is dominated
by the outlier channel, so each cosine is also taken without it and both must pass.
Printed (-s): every layer's cosine and max |ours - ref| / max |ref|, and the wall times.

Cost, measured on the shared 2-core machine at load average ~7.5 (CPU seconds of HF + JAX +
simulator, then wall): SigLIP 224 b2 16 s / 46 s (with the 100x call), 224 outliers 16 s /
40 s, 512 b2 84 s / 210 s, 512 outliers 46 s / 109 s, Whisper b2 43 s / 92 s, Whisper outliers
24 s / 56 s: about 4 CPU minutes for the file.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

os.environ["HF_HUB_OFFLINE"] = "1"

import jax
import numpy as np
import pytest
import torch
from models_testutil import random_fill_, save_state_dict

import rockjit
from models import siglip, whisper

pytestmark = [pytest.mark.reference, pytest.mark.slow]

FINAL_COS = 0.9999
MEAN_LAYER_COS = 0.99999
ROW_COS = 0.999
# the large-logit layer's q and k weights, times this (per model, for max |logit| ~2-3e4 with
# these seeds; _check_planted asserts what HF's run really has)
QK_SCALE = {"siglip": 150.0, "whisper": 275.0}
HEAD_DIM = 64               # SigLIP-B/16 768 / 12, Whisper-base 512 / 8


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _worst_row_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64).reshape(-1, a.shape[-1])
    b = np.asarray(b, np.float64).reshape(-1, b.shape[-1])
    return float(np.min(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) *
                                           np.linalg.norm(b, axis=1))))


def _ordinary(r: np.ndarray) -> np.ndarray:
    """Channels that are not planted outliers (largest |value| within 20x of the median
    channel's)."""
    peak = np.abs(r.reshape(-1, r.shape[-1])).max(axis=0)
    return peak <= 20 * np.median(peak)


@dataclass
class Reference:
    hidden_states: list[np.ndarray]     # HF's output_hidden_states
    finals: list[np.ndarray]            # HF's last_hidden_state (and SigLIP's pooler_output)
    max_logit: float                    # the large-logit layer's max |q k^T * scale|
    ln_gain_ratio: float                # over all LayerNorms' gained channels, the median of
                                        # (the channel's peak |out| / the median channel's)


def _hooked_forward(model, attn, norms, gained, x) -> Reference:
    """HF forward with hooks on the planted layer's q/k projections and every LayerNorm
    (``gained``: per norm, the channels given a large gain; empty when none were)."""
    seen: dict[str, torch.Tensor] = {}
    ratios: list[float] = []

    def ln_hook(idx):
        def hook(m, i, o):
            peak = o.detach().abs().flatten(0, -2).amax(0)
            ratios.extend((peak[idx] / peak.median()).tolist())
        return hook

    hooks = [attn.q_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o)),
             attn.k_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o))]
    for ln, idx in zip(norms, gained):
        if len(idx):
            hooks.append(ln.register_forward_hook(ln_hook(idx)))
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
    for h in hooks:
        h.remove()
    b, s, _ = seen["q"].shape
    hd = HEAD_DIM
    q = seen["q"].double().view(b, s, -1, hd).transpose(1, 2)
    k = seen["k"].double().view(b, s, -1, hd).transpose(1, 2)
    logits = (q @ k.transpose(-1, -2)) * hd ** -0.5
    finals = [out.last_hidden_state.numpy()]
    if getattr(out, "pooler_output", None) is not None:
        finals.append(out.pooler_output.numpy())
    return Reference([h.numpy() for h in out.hidden_states], finals,
                     float(logits.abs().max()), float(np.median(ratios)) if ratios else 0.0)


# ---------------------------------------------------------------------------------------------
# the two models: HF module with random weights (planted outliers optional), our config
# ---------------------------------------------------------------------------------------------

def _siglip(image_size: int, batch: int, outliers: bool, path):
    from transformers import SiglipVisionModel
    from transformers.initialization import no_init_weights

    cfg = siglip.SiglipVisionConfig(image_size=image_size)
    hf_cfg = cfg.to_hf()
    with no_init_weights():
        model = SiglipVisionModel(hf_cfg).eval()
    random_fill_(model, 0)
    g = torch.Generator().manual_seed(2)
    layers, emb = model.encoder.layers, model.embeddings   # transformers 5: no vision_model
    norms = [ln for lyr in layers for ln in (lyr.layer_norm1, lyr.layer_norm2)]
    gained = [torch.randint(4, cfg.hidden_size, (4,), generator=g) if outliers else []
              for _ in norms]
    if outliers:
        with torch.no_grad():
            emb.position_embedding.weight[:, 3] += 400.0
            for ln, idx in zip(norms, gained):
                ln.weight[idx] = 10 + 40 * torch.rand(4, generator=g)
            layers[5].self_attn.q_proj.weight.mul_(QK_SCALE["siglip"])
            layers[5].self_attn.k_proj.weight.mul_(QK_SCALE["siglip"])
    save_state_dict(model, path)
    x = torch.randn(batch, 3, image_size, image_size, generator=g)
    ref = _hooked_forward(model, layers[5].self_attn, norms, gained, x)
    fn = partial(siglip.forward, config=cfg, output_hidden_states=True)
    return fn, siglip.load_params(path, cfg), x.numpy(), ref


def _whisper(batch: int, outliers: bool, path):
    from transformers.initialization import no_init_weights
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = whisper.WhisperEncoderConfig.base()
    hf_cfg = cfg.to_hf()
    with no_init_weights():
        model = WhisperEncoder(hf_cfg).eval()
    random_fill_(model, 0)
    g = torch.Generator().manual_seed(1)
    norms = [ln for lyr in model.layers for ln in (lyr.self_attn_layer_norm, lyr.final_layer_norm)]
    gained = [torch.randint(8, cfg.d_model, (4,), generator=g) if outliers else []
              for _ in norms]
    with torch.no_grad():
        model.embed_positions.weight.copy_(torch.tensor(whisper.sinusoids(
            cfg.max_source_positions, cfg.d_model)))
        if outliers:
            model.embed_positions.weight[:, 7] += 600.0
            for ln, idx in zip(norms, gained):
                ln.weight[idx] = 10 + 40 * torch.rand(4, generator=g)
            model.layers[3].self_attn.q_proj.weight.mul_(QK_SCALE["whisper"])
            model.layers[3].self_attn.k_proj.weight.mul_(QK_SCALE["whisper"])
    save_state_dict(model, path)
    x = torch.randn(batch, cfg.num_mel_bins, cfg.num_frames, generator=g)
    ref = _hooked_forward(model, model.layers[3].self_attn, norms, gained, x)
    fn = partial(whisper.forward, config=cfg, output_hidden_states=True)
    return fn, whisper.load_params(path, cfg), x.numpy(), ref


def _split(outs, n_final: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """forward's flat outputs -> (finals, hidden_states)."""
    leaves = [np.asarray(o) for o in jax.tree_util.tree_leaves(outs)]
    return leaves[:n_final], leaves[n_final:]


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------

def _check_final(label: str, ours: np.ndarray, ref: np.ndarray, against: str) -> None:
    keep = _ordinary(ref)
    c, ck = _cos(ours, ref), _cos(ours[..., keep], ref[..., keep])
    print(f"[{label}] {against}: cosine {c:.7f} (w/o outlier channels {ck:.7f}), "
          f"max rel err {_rel(ours, ref):.3e}")
    assert min(c, ck) >= FINAL_COS, f"{label} vs {against}: cosine {c:.7f} / {ck:.7f}"
    for b in range(ours.shape[0]):
        cb = _cos(ours[b][..., keep], ref[b][..., keep])
        assert cb >= FINAL_COS, f"{label} vs {against}: batch element {b}: cosine {cb:.7f}"


def _check_layers(label: str, ours: list[np.ndarray], refs: list[np.ndarray]) -> None:
    assert len(ours) == len(refs), (len(ours), len(refs))
    full, plain = [], []
    for i, (o, r) in enumerate(zip(ours, refs)):
        assert o.shape == r.shape, (i, o.shape, r.shape)
        assert np.isfinite(o).all(), f"{label}: hidden state {i} has non-finite values"
        keep = _ordinary(r)
        full.append(_cos(o, r))
        plain.append(_cos(o[..., keep], r[..., keep]))
        worst = min(_worst_row_cos(o, r), _worst_row_cos(o[..., keep], r[..., keep]))
        print(f"[{label}] hidden {i:2d}: max|hf| {np.abs(r).max():7.1f}  cos {full[-1]:.8f}  "
              f"w/o {int((~keep).sum())} outlier ch {plain[-1]:.8f}  worst row {worst:.6f}  "
              f"max rel err {_rel(o, r):.2e}")
        assert worst >= ROW_COS, f"{label}: hidden state {i}: a row has cosine {worst:.6f}"
    print(f"[{label}] vs HF per layer: mean cos {np.mean(full):.8f} (worst {min(full):.8f}), "
          f"w/o outlier channels mean {np.mean(plain):.8f} (worst {min(plain):.8f})")
    assert min(np.mean(full), np.mean(plain)) >= MEAN_LAYER_COS, \
        f"{label}: mean per-layer cosine {np.mean(full):.8f} / {np.mean(plain):.8f}"


def _check_planted(label: str, ref: Reference, stream_states: list[np.ndarray]) -> None:
    stream = min(float(np.abs(h).max()) for h in stream_states)
    print(f"[{label}] planted: residual peak >= {stream:.0f} in every state, max |logit| "
          f"{ref.max_logit:.0f}, gained LayerNorm channels' peaks {ref.ln_gain_ratio:.1f}x the "
          f"median channel's (median over them)")
    assert stream > 300, "the residual outlier channel is missing"
    assert ref.max_logit > 2 * 8192, "the large attention logits are missing"
    assert ref.ln_gain_ratio > 5, "the large LayerNorm gains do not show in the outputs"


def _run(label: str, build: Callable, n_final: int, outliers: bool, tmp_path):
    c0, t0 = time.process_time(), time.perf_counter()
    fn, params, x, ref = build(tmp_path / "weights.safetensors")
    t1 = time.perf_counter()
    want_final, want_states = _split(jax.jit(fn)(params, x), n_final)
    t2 = time.perf_counter()
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    got_final, got_states = _split(f(params, x), n_final)
    t3 = time.perf_counter()
    print(f"\n[{label}] wall: HF build+forward {t1 - t0:.1f} s, JAX {t2 - t1:.1f} s, "
          f"simulator lower+run {t3 - t2:.1f} s; CPU time of all three "
          f"{time.process_time() - c0:.1f} s")
    if outliers:
        stream = ref.hidden_states if n_final == 2 else ref.hidden_states[:-1]
        _check_planted(label, ref, stream)
    names = ("last_hidden_state", "pooler_output")
    for name, g, w, h in zip(names, got_final, want_final, ref.finals):
        assert g.shape == w.shape == h.shape, (name, g.shape, w.shape, h.shape)
        assert np.isfinite(g).all(), f"{label} {name}: non-finite values"
        _check_final(f"{label} {name}", g, w, "JAX")
        _check_final(f"{label} {name}", g, h, "HF fp32")
    _check_layers(label, got_states, ref.hidden_states)
    vs_jax = [_cos(g, w) for g, w in zip(got_states, want_states)]
    print(f"[{label}] vs JAX per layer: mean cos {np.mean(vs_jax):.8f}, worst {min(vs_jax):.8f}")
    assert min(vs_jax) >= FINAL_COS, f"{label}: a hidden state's cosine to JAX {min(vs_jax)}"
    return f, fn, params, x


CONFIGS = {
    "siglip224_b2": (lambda p: _siglip(224, 2, False, p), 2, False),
    "siglip224_outliers": (lambda p: _siglip(224, 1, True, p), 2, True),
    "siglip512_b2": (lambda p: _siglip(512, 2, False, p), 2, False),
    "siglip512_outliers": (lambda p: _siglip(512, 1, True, p), 2, True),
    "whisper_base_30s_b2": (lambda p: _whisper(2, False, p), 1, False),
    "whisper_base_30s_outliers": (lambda p: _whisper(1, True, p), 1, True),
}


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "siglip224_b2"])
def test_whole_encoder_matches_jax_and_hf(name: str, tmp_path) -> None:
    build, n_final, outliers = CONFIGS[name]
    _run(name, build, n_final, outliers, tmp_path)


def test_siglip224_b2_and_the_same_function_on_100x_wider_pixels(tmp_path) -> None:
    """The 224 b2 check, then the compiled function called again on pixels 100x wider than the
    first call's. The program depends on no input data; a value that left fp16 would raise
    NumericsError instead of returning, but nothing here has to (the stream grows 100x to
    ~10^3 and every LayerNorm undoes it), so the call must return and match JAX."""
    f, fn, params, x = _run("siglip224_b2", *CONFIGS["siglip224_b2"], tmp_path)
    wide = 100.0 * x
    t0 = time.perf_counter()
    got, _ = _split(f(params, wide), 2)
    want, _ = _split(jax.jit(fn)(params, wide), 2)
    print(f"[siglip224_b2 x100] second call {time.perf_counter() - t0:.1f} s")
    for name, g, w in zip(("last_hidden_state", "pooler_output"), got, want):
        _check_final(f"siglip224_b2 x100 {name}", g, w, "JAX")
