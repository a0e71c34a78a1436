"""Per-layer cosine of the Whisper encoder compiled by rockjit against transformers' fp32
WhisperEncoder on a real checkpoint (HF tensor names; a whole-model file's encoder is read
under ``--prefix``), on the log-mel of a WAV file (any speech; 16 kHz after resampling).

    python bench/whisper_real_cosine.py --weights whisper_base.safetensors --wav speech.wav \
        [--preset base] [--prefix model.encoder.] [--isolated] [--backend sim]

Prints, per hidden state (HF's output_hidden_states order: the embeddings, each layer, the
last one after the final LayerNorm), max |ref|, the cosine over the whole tensor and
max|err| / max|ref|; with ``--isolated`` each layer is also run alone on HF's own input to it,
so its cosine is that layer's error only (not the error carried in from earlier layers).
The range plan's counts are printed too.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import rockjit  # noqa: E402
from models import whisper  # noqa: E402


def _layer(params, x, i, config):
    return whisper._encoder_layer(params, i, x, config)


def _cos(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _line(label: str, ours, ref) -> float:
    c = _cos(ours, ref)
    err = float(np.abs(np.asarray(ours, np.float64) - ref).max() / np.abs(ref).max())
    print(f"{label:<22} max|ref| {np.abs(ref).max():8.1f}  cos {c:.7f}  max|err|/max|ref| "
          f"{err:.3e}  non-finite {int((~np.isfinite(ours)).sum())}")
    return c


def _log_mel(path: str) -> np.ndarray:
    from scipy.io import wavfile
    from scipy.signal import resample_poly
    from transformers import WhisperFeatureExtractor

    sr, a = wavfile.read(path)
    a = np.asarray(a, np.float32)
    if a.ndim > 1:
        a = a.mean(axis=1)
    if np.abs(a).max() > 1.5:
        a = a / 32768.0
    a = resample_poly(a, 16000, sr).astype(np.float32)
    return WhisperFeatureExtractor(feature_size=80)(a, sampling_rate=16000,
                                                    return_tensors="np").input_features


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--wav", required=True)
    ap.add_argument("--preset", default="base", choices=sorted(whisper.PRESETS))
    ap.add_argument("--prefix", default="model.encoder.")
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--isolated", action="store_true")
    args = ap.parse_args()

    import torch
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = whisper.PRESETS[args.preset]()
    params = whisper.load_params(args.weights, cfg, prefix=args.prefix)
    feats = _log_mel(args.wav).astype(np.float32)
    hf = WhisperEncoder(cfg.to_hf()).eval()
    hf.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in params.items()}, strict=True)
    with torch.no_grad():
        refs = [h.numpy() for h in hf(input_features=torch.tensor(feats),
                                      output_hidden_states=True).hidden_states]

    t0 = time.perf_counter()
    f = rockjit.compile(partial(whisper.forward, config=cfg, output_hidden_states=True),
                        resident_argnums=0, backend=args.backend)
    _, states = f(params, feats)
    ours = [np.asarray(o) for o in states]
    print(f"compile + run: {time.perf_counter() - t0:.1f} s")
    st = f.compiled(params, feats).stats()
    print({k: v for k, v in st.items() if k.startswith("range_")})
    coss = [_line(f"hidden {i} (cumulative)", o, r) for i, (o, r) in enumerate(zip(ours, refs))]
    print(f"mean cos over the layers (cumulative): {np.mean(coss[1:]):.7f}; final {coss[-1]:.7f}")
    if args.isolated:
        iso = []
        for i in range(cfg.encoder_layers):
            g = rockjit.compile(partial(_layer, i=i, config=cfg), resident_argnums=0,
                                backend=args.backend)
            want = refs[i + 1] if i + 1 < cfg.encoder_layers else _layer(params, refs[i], i, cfg)
            iso.append(_line(f"layer {i} (isolated)", np.asarray(g(params, refs[i])),
                             np.asarray(want, np.float64)))
        print(f"mean per-layer cos (isolated): {np.mean(iso):.7f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
