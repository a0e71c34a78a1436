"""Golden lowering of one whole SigLIP encoder layer (design.md convention 8, issue 11 "pin
first"): every regcmd word of every task of every NPU call, with its relocations, and every
host step, for a small-but-real config (hidden 64, 2 heads, MLP 128, 36 tokens, 1 layer).

The whole text is ~0.5 MB, so the golden file stores its sha256 and one short hash per call
plus a readable excerpt (the first call of each emitter kind); a mismatch names the first call
whose hash differs (or, within the excerpt, the first differing line). Regenerate with ROCKJIT_UPDATE_GOLDEN=1 and commit with the reason.
Each call's buffers get fixed fake addresses (golden_testutil.render), so the file pins the
emitters and the lowering decisions, not the memory placement."""
from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import rockjit
from models import siglip
from models.specs import configure
from rockjit import debugflags
from rockjit.lowering.pipeline import lower_graph

from golden_testutil import first_difference, render

GOLDEN = Path(__file__).resolve().parent / "golden" / "siglip_layer_d64_h2_t36.txt"
CFG = configure(siglip.SiglipVisionConfig(), {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "image_size": 48, "patch_size": 8})


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    out = {}
    for name, shape in sorted(siglip.expected_shapes(CFG).items()):
        w = rng.standard_normal(shape).astype(np.float32) * 0.05
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "layernorm.weight" in name:
            w += 1.0
        out[name] = w
    return out


def _layer(params, pixels):
    """Patch embedding + the one encoder layer (no pooling head)."""
    x = siglip._patch_embed(params, pixels, CFG)
    return siglip._encoder_layer(params, 0, x, CFG)


@cache
def program_text() -> str:
    params = _params()
    pixels = np.random.default_rng(12).standard_normal((1, 3, 48, 48)).astype(np.float32)
    # the interpreter backend traces and binds without lowering; the lowering is this call
    compiled = rockjit.compile(_layer, resident_argnums=0, backend="interpreter").lower(
        params, pixels).compile()
    lowered = lower_graph(compiled.graph, compiled.params, profile="rk3588")
    parts = []
    for i, pc in enumerate(lowered.calls):
        call = pc.call
        parts.append(f"## call {i} {call.where} {call.emitter} {call.label}\n")
        parts.append(render(call.lowering))
    return "".join(parts)


def _excerpt(text: str) -> list[str]:
    """The first call of each emitter kind, whole."""
    calls = text.split("## call ")[1:]
    seen, keep = set(), []
    for c in calls:
        kind = " ".join(c.split("\n", 1)[0].split()[1:3])
        if kind not in seen:
            seen.add(kind)
            keep.append("## call " + c)
    return keep


def golden_text(text: str) -> str:
    head = (f"# sha256 {hashlib.sha256(text.encode()).hexdigest()}\n"
            f"# lines {len(text.splitlines())}\n"
            f"# calls {text.count('## call ')}\n")
    # one short hash per call, so a mismatch names the first call that changed
    per_call = "".join(f"# {hashlib.sha256(c.encode()).hexdigest()[:16]} {c.split(chr(10), 1)[0]}\n"
                       for c in text.split("## call ")[1:])
    return head + per_call + "".join(_excerpt(text))


def test_golden_siglip_layer() -> None:
    got = golden_text(program_text())
    if debugflags.enabled("ROCKJIT_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
        pytest.skip(reason=f"ROCKJIT_UPDATE_GOLDEN is set: rewrote {GOLDEN.name}; commit it with the reason")
    assert GOLDEN.exists(), f"no golden file {GOLDEN}; generate it with ROCKJIT_UPDATE_GOLDEN=1"
    want = GOLDEN.read_text()
    if got != want:

        raise AssertionError(
            f"the SigLIP layer's regcmd differs from {GOLDEN.name} at "
            f"{first_difference(want, got)}\nIf deliberate, rerun with "
            f"ROCKJIT_UPDATE_GOLDEN=1 and commit the new file with the reason.")
