"""Shared by the encoder benchmarks: the encoders at bench sizes, seeded weights in memory, and
program stats per layer (from two reduced-depth compiles) and per forward.

Per layer = (stats(n2) - stats(n1)) / (n2 - n1): every counter (steps, jobs, kicks, bytes,
MACs, modelled ms) is a sum over steps, and the layers of an encoder are the same program up to
ModernBERT's global/local alternation (every third layer global), so its ``n2 - n1`` spans one
whole period. The forward is the full-depth compile (seconds now: ModernBERT-base x22 in ~12 s
on the null backend). ``extrapolate`` gives stats(n1) + (L - n1) * per layer instead, which is
exact only when nothing runs once per forward past layer ``n1``: ModernBERT's local-attention
bias is made once, with the first local layer, and the extrapolation counted it in every layer
(modelled 792.90 ms against 741.38 ms at full depth, before that bias stopped being replicated).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.presets import MODELS, ModelEntry  # noqa: E402
from models.weights import seeded_weights  # noqa: E402


@dataclass(frozen=True)
class Encoder:
    """A preset of ``models.presets.MODELS`` at a bench size, and the two depths its per-layer
    stats are taken from."""
    name: str
    preset: str
    layers_field: str
    n1: int
    n2: int
    overrides: tuple[tuple[str, Any], ...] = ()
    seq_len: int = 512          # ModernBERT's tokens; the others' inputs are fixed by the config

    @property
    def entry(self) -> ModelEntry:
        return MODELS[self.preset]

    @property
    def config(self) -> Any:
        return self.entry.configure(dict(self.overrides))

    @property
    def layers(self) -> int:
        return getattr(self.config, self.layers_field)

    def at_depth(self, n: int) -> Any:
        return self.entry.configure({**dict(self.overrides), self.layers_field: n})


ENCODERS = {
    "siglip-224": Encoder("SigLIP-B/16 224 (196 tokens)", "siglip", "num_hidden_layers", 1, 2),
    "siglip-1024": Encoder("SigLIP-B/16 512 (1024 tokens)", "siglip", "num_hidden_layers", 1, 2,
                           overrides=(("image_size", 512),)),
    "modernbert-512": Encoder("ModernBERT-base 512 tokens", "modernbert", "num_hidden_layers",
                              1, 4),
    "whisper-base": Encoder("Whisper-base encoder (1500 frames)", "whisper-base",
                            "encoder_layers", 1, 2),
    "whisper-tiny": Encoder("Whisper-tiny encoder (1500 frames)", "whisper-tiny",
                            "encoder_layers", 1, 2),
}


def setup(enc: Encoder, depth: int):
    """(fn, params, inputs) for the encoder at ``depth`` layers: the repo's seeded default
    weights (in memory) and the preset's example inputs."""
    cfg = enc.at_depth(depth)
    params = seeded_weights(enc.entry.module.expected_shapes(cfg))
    inputs = enc.entry.make_inputs(np.random.default_rng(1), cfg, enc.seq_len)
    return enc.entry.forward(cfg), params, inputs


def compile_stats(enc: Encoder, depth: int, backend: str = "null",
                  contexts: int | None = None) -> tuple[dict, float]:
    """Program.stats() of the encoder at ``depth`` layers and the wall time of its first call
    (trace + lowering + program build + one run). ``contexts``: the program laid out for that
    many of the chip's cores (``rockjit.compile(..., cores=)``; one: no job spreads, no
    cross-core copies) instead of all of them."""
    import rockjit

    fn, params, inputs = setup(enc, depth)
    f = rockjit.compile(fn, resident_argnums=0, backend=backend, cores=contexts)
    t0 = time.perf_counter()
    f(params, *inputs)
    dt = time.perf_counter() - t0
    return f.compiled(params, *inputs).stats(), dt


def per_layer_and_forward(enc: Encoder, full: bool, log=print,
                          contexts: int | None = None) -> tuple[dict, dict, str]:
    """(per-layer stats, per-forward stats, how the forward was obtained)."""
    s1, t1 = compile_stats(enc, enc.n1, contexts=contexts)
    log(f"  [{enc.name}: {enc.n1} layer(s) lowered in {t1:.1f} s]")
    s2, t2 = compile_stats(enc, enc.n2, contexts=contexts)
    log(f"  [{enc.name}: {enc.n2} layer(s) lowered in {t2:.1f} s]")
    keys = [k for k in s1 if isinstance(s1[k], (int, float)) and not k.startswith(("rt_", "jobs_core"))]
    span = enc.n2 - enc.n1
    per = {k: (s2[k] - s1[k]) / span for k in keys}
    if full:
        sf, tf = compile_stats(enc, enc.layers, contexts=contexts)
        log(f"  [{enc.name}: {enc.layers} layers lowered in {tf:.1f} s]")
        return per, {k: sf[k] for k in keys}, f"compiled at full depth ({enc.layers} layers)"
    fwd = {k: s1[k] + (enc.layers - enc.n1) * per[k] for k in keys}
    return per, fwd, (f"extrapolated to {enc.layers} layers from {enc.n1} and {enc.n2} "
                      f"(without --extrapolate: all {enc.layers} compiled)")
