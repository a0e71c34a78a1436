"""The three encoders by preset name, for the examples and ``rockjit compile <preset>``: the
model module, its published config, example inputs, and the shipped default weights (seeded,
in HF tensor names, saved as safetensors so they go through the same checked loader a real
checkpoint does)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from . import modernbert, siglip, whisper
from .specs import configure
from .weights import seeded_weights


@dataclass(frozen=True)
class ModelEntry:
    module: Any
    config: Any
    make_inputs: Callable[[np.random.Generator, Any, int], tuple]

    def configure(self, overrides: Mapping[str, Any]) -> Any:
        """The published config with ``overrides`` (ValueError names a bad field or value)."""
        return configure(self.config, overrides)

    def forward(self, config: Any) -> Callable[..., Any]:
        """``forward(params, *inputs)`` at ``config``."""
        return partial(self.module.forward, config=config)

    def input_specs(self, config: Any, seq_len: int) -> tuple:
        """The inputs as (shape, dtype) pairs, without data."""
        return tuple((x.shape, x.dtype) for x in self.make_inputs(np.random.default_rng(0),
                                                                   config, seq_len))


def _whisper_inputs(rng: np.random.Generator, cfg: Any, seq_len: int) -> tuple:
    return (rng.standard_normal((1, cfg.num_mel_bins, cfg.num_frames), dtype=np.float32),)


def _siglip_inputs(rng: np.random.Generator, cfg: Any, seq_len: int) -> tuple:
    return (rng.standard_normal((1, cfg.num_channels, cfg.image_size, cfg.image_size),
                                dtype=np.float32),)


def _modernbert_inputs(rng: np.random.Generator, cfg: Any, seq_len: int) -> tuple:
    ids = rng.integers(0, cfg.vocab_size, (1, seq_len), dtype=np.int32)
    return ids, np.ones((1, seq_len), np.int32)


MODELS = {
    "whisper-tiny": ModelEntry(whisper, whisper.WhisperEncoderConfig.tiny(), _whisper_inputs),
    "whisper-base": ModelEntry(whisper, whisper.WhisperEncoderConfig.base(), _whisper_inputs),
    "siglip": ModelEntry(siglip, siglip.SiglipVisionConfig(), _siglip_inputs),
    "modernbert": ModelEntry(modernbert, modernbert.ModernBertConfig(), _modernbert_inputs),
}


def default_weights(name: str, module: Any, config: Any, out_dir: Path,
                    overrides: Mapping[str, Any]) -> Path:
    """The shipped default: seeded weights in HF tensor names, saved as safetensors (one file
    per model and set of config overrides)."""
    from safetensors.numpy import save_file

    tag = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    path = Path(out_dir) / f"{name}{tag}-seed0.safetensors"
    if path.exists():
        return path
    tensors = seeded_weights(module.expected_shapes(config))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{id(tensors)}")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path
