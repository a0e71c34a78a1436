"""Helpers for comparing our JAX encoders with HF transformers on random weights."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np

from models import harness

if TYPE_CHECKING:  # torch is imported lazily: the IR tests use this module without it
    import torch

TOL = 1e-4


def max_rel_err(ours, ref) -> float:
    """max|ours - ref| / max|ref| over the whole tensor."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != reference {ref.shape}"
    assert np.isfinite(ours).all(), "non-finite values in our output"
    return harness.max_rel_err(ours, ref)


def report(label: str, err: float) -> None:
    print(f"\n[max rel err] {label}: {err:.3e}")


def seeded_params(module, config, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights for ``module``'s shapes at ``config`` from a fixed seed, as examples/run_model.py
    ships them: norm scales 1 + N(0, 0.05), every other tensor N(0, 1 / fan_in)."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in module.expected_shapes(config).items():
        if key.endswith(("norm.weight", "layer_norm.weight", "layernorm.weight")):
            out[key] = (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            out[key] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def perturb_vectors_(model: "torch.nn.Module", seed: int, skip: tuple[str, ...] = ()) -> None:
    """Add noise to every 1-D parameter (norm scales/shifts, biases).

    HF initialises them to exactly 1 and 0, which would hide a swapped or dropped bias or norm
    weight; with noise every one of them changes the output.
    """
    import torch  # lazily: the IR tests use this module without torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and not any(s in name for s in skip):
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def random_fill_(model: "torch.nn.Module", seed: int, std: float = 0.02) -> None:
    """Fill every parameter with fresh noise: matrices N(0, std), 1-D tensors named *.weight
    (norm scales) 1 + N(0, 0.1), other 1-D tensors (biases) N(0, 0.1).

    Used with transformers.initialization.no_init_weights(), which skips HF's slow truncated-
    normal init (15 s for ModernBERT-base on this machine); buffers (RoPE inv_freq) are still
    computed by the modules' constructors.
    """
    import torch  # lazily: the IR tests use this module without torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=g)
            elif name.endswith("weight"):
                p.normal_(1.0, 0.1, generator=g)
            else:
                p.normal_(0.0, 0.1, generator=g)


def save_state_dict(model: "torch.nn.Module", path) -> None:
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(path))


class Timer:
    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        print(f"\n[time] {self.label}: {self.seconds:.2f} s")
