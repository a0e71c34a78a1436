"""Shared by the numerics tests: seeded encoder weights, a program fingerprint, and the bound
check of a compiled function against JAX on the CPU."""
from __future__ import annotations

import hashlib

import numpy as np

from rockjit.oracle import tolerance as T


def seeded_weights(shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights like a trained checkpoint's scale: N(0, 1/fan_in) matrices, norm scales near 1,
    small biases (the rule examples/run_model.py uses for its default model)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, shape in shapes.items():
        if k.endswith(("norm.weight", "layer_norm.weight", "layernorm.weight")):
            out[k] = (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            out[k] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def program_fingerprint(program) -> str:
    """``program``: anything holding the ``lowered`` graph (the NPU runner, an NpuProgram).
    A digest of everything a lowered program is made of: where each op ran, every placed
    call's buffer binding, every kick's regcmd words and relocations, every host step and
    every compile-time byte. Two programs with equal digests run the same words on the same
    data."""
    h = hashlib.sha256()
    lw = program.lowered
    for d in lw.decisions:
        h.update(repr((d.node, d.where, d.how)).encode())
    for pc in lw.calls:
        h.update(repr((pc.call.label, pc.call.emitter, sorted(pc.binding.items()))).encode())
        for spec in pc.call.program.buffers:
            h.update(repr((spec.name, spec.role, spec.nbytes)).encode())
            if spec.data is not None:
                h.update(np.ascontiguousarray(spec.data).tobytes())
        for st in pc.call.program.steps:
            for job in getattr(st, "jobs", ()):
                for k in job.kicks:
                    h.update(np.asarray(k.words, np.uint64).tobytes())
                    h.update(repr(sorted(k.relocs.items())).encode())
            if hasattr(st, "kind"):
                h.update(repr((st.kind, sorted(st.operands.items()),
                               sorted((k, repr(v)) for k, v in st.params.items()))).encode())
    for b in lw.bufs:
        h.update(repr((b.id, b.size, b.kind, b.name)).encode())
        if b.data is not None:
            h.update(np.ascontiguousarray(b.data).tobytes())
    return h.hexdigest()


def within_bound(compiled, got, ref, inputs) -> tuple[bool, float]:
    """(every element within tolerance.graph_bound plus JAX's own f32 rounding, worst
    |err| / bound)."""
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    bound = T.graph_bound(compiled.graph, compiled.params, list(inputs))[0] \
        + 2.0 ** -23 * np.abs(ref)
    if not np.isfinite(got).all():
        return False, float("inf")
    ratio = float(np.max(np.abs(got - ref) / bound))
    return ratio <= 1.0, ratio
