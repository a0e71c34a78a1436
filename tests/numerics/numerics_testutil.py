"""Shared by the numerics tests: a program fingerprint and the bound check of a compiled
function against JAX on the CPU."""
from __future__ import annotations

import hashlib

import numpy as np

from models.harness import bound_ratio
from rockjit.oracle import tolerance as T


def program_fingerprint(program) -> str:
    """``program``: anything holding the ``lowered`` graph (the NPU runner, a LoadedGraph).
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
        for spec in pc.call.lowering.buffers:
            h.update(repr((spec.name, spec.role, spec.nbytes)).encode())
            if spec.data is not None:
                h.update(np.ascontiguousarray(spec.data).tobytes())
        for st in pc.call.lowering.steps:
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
    ratio = bound_ratio(got, ref, T.graph_bound(compiled.graph, compiled.params, list(inputs))[0])
    return ratio <= 1.0, ratio
