"""Which bytes of each resident weight buffer a context other than 0 is given at load.

Every used context has its own weights BO with the same layout of the buffers its jobs use
(image_builder._lay_out_weights), so a job's relocations differ only in the BO. A matmul dealt
over the cores by output columns reads only its columns' slice of the packed weights on each
core, yet the whole buffer used to be uploaded to every context that runs any of its jobs: a
SigLIP-B image held its 170 MB of fp16 weights nearly three times over. A context > 0 now gets
the span of each buffer between the lowest byte its jobs address (a relocation into it) or
read (a declared DMA stream, regcmd.Access) and the highest byte they read -- the whole
buffer where a job addresses it with no declared stream; the BO keeps its
size and layout (no address changes: the regcmd words and relocations are the same), and the
bytes outside the span are never written -- the simulator's BO pages there are never touched,
and on silicon they read as the kernel's zero-filled pages, which no job of that context reads.
Context 0 keeps every buffer whole (host steps read descriptors there).

The spans are stored as pieces of each buffer cut at every context's span boundaries, so one
image array per piece serves every context that needs it and a bundle stores each byte once.
"""
from __future__ import annotations

from typing import Any

from .job_shapes import job_shape


def context_spans(b: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """(context, weights buffer id) -> (lo, hi): the byte span of the buffer that context's
    jobs address or read, for contexts > 0."""
    spans: dict[tuple[int, int], tuple[int, int]] = {}

    def cover(key: tuple[int, int], lo: int, hi: int) -> None:
        old = spans.get(key)
        spans[key] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    # per job (the layers' calls share their jobs, compile_cache.py; only bindings differ):
    # each name's hull of what it reads or addresses relative to the name, or None where
    # it is addressed with no declared stream; a hull of hulls is the hull of the pieces
    hulls: dict[int, tuple[Any, dict[str, tuple[int, int] | None]]] = {}
    for st in b.steps:
        for jr in st.jobs:
            if jr.core == 0:
                continue
            hit = hulls.get(id(jr.job))
            if hit is None:
                hit = hulls[id(jr.job)] = (jr.job, _job_hulls(b, jr.job))
            binding = b.calls[jr.call].binding
            for name, rel in hit[1].items():
                at = binding.get(name)
                if at is None or b.bufs[at[0]].kind != "weights":
                    continue
                if rel is None:
                    # addressed with no declared stream: how far the hardware reads from
                    # there is not known here, so the context gets the whole buffer (as
                    # coalesce counts such a name as all of it)
                    cover((jr.core, at[0]), 0, b.bufs[at[0]].size)
                else:
                    cover((jr.core, at[0]), at[1] + rel[0], at[1] + rel[1])
    return spans


def _job_hulls(b: Any, job: Any) -> dict[str, tuple[int, int] | None]:
    """A job's names -> the hull of the bytes it reads (declared streams) or addresses
    (relocations) relative to the name; None: a relocation with no declared stream."""
    out: dict[str, tuple[int, int] | None] = {}

    def add(name: str, lo: int, hi: int) -> None:
        old = out.get(name, (lo, hi))
        if old is not None:
            out[name] = (min(old[0], lo), max(old[1], hi))

    declared = set()
    for name, off, pieces, pitch, chunk in job_shape(b._shapes, job).reads:
        if pieces <= 0 or chunk <= 0:
            continue
        declared.add(name)
        add(name, off, off + (pieces - 1) * pitch + chunk)
    for kick in job.kicks:
        for rel in kick.relocs.values():
            if rel.buffer in declared:
                add(rel.buffer, rel.offset, rel.offset + 1)
            else:
                out[rel.buffer] = None
    return out


def buffer_pieces(size: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[0, size) cut at every span's ends (clipped to the buffer), in order."""
    cuts = {0, size}
    for lo, hi in spans:
        cuts.update((min(max(lo, 0), size), min(max(hi, 0), size)))
    c = sorted(cuts)
    return list(zip(c[:-1], c[1:]))
