"""Which bytes of each resident weight buffer each context is given at load.

Every used context has its own weights BO (rocket: one IOVA space per fd), and rocket pins and
maps every page of a BO when it is created (drivers/accel/rocket/rocket_gem.c,
rocket_ioctl_create_bo). A matmul dealt over the cores by output columns reads only its
columns' slice of the packed weights on each core, yet every context used to lay out (and
context 0 to upload) each buffer it touched whole: a SigLIP-B image held its fp16 weights about
three times over in device memory. A context now holds the span of each buffer between the
lowest byte its jobs address (a relocation into it) or read (a declared DMA stream,
regcmd.Access) and the highest byte they read -- the whole buffer where a job addresses it with
no declared stream, and in context 0 the whole of every buffer a host step reads (host steps
resolve their names there) or a graph boundary is held in (``host_read_buffers``).
image_builder._lay_out_weights packs those spans one after another in each context's BO.

The spans are stored as pieces of each buffer cut at every context's span boundaries, so one
image array per piece serves every context that needs it and a bundle stores each byte once.
"""
from __future__ import annotations

from typing import Any

from .arith import round_up
from .job_shapes import job_shape
from .op_lowering import HostStep


def context_spans(b: Any, first_context: int = 1) -> dict[tuple[int, int], tuple[int, int]]:
    """(context, weights buffer id) -> (lo, hi): the byte span of the buffer that context's
    jobs address or read, for contexts from ``first_context`` on."""
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
            if jr.core < first_context:
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


def host_read_buffers(b: Any) -> set[int]:
    """Weights buffers that something other than a job reads in context 0, so it holds them
    whole: a host step's operands (descriptors, constants; host steps resolve their names
    there) and a graph input or output held in one."""
    out = set()
    for pc in b.calls:
        for st in pc.call.lowering.steps:
            if isinstance(st, HostStep):
                for sl in st.operands.values():
                    at = pc.binding.get(sl.buffer)
                    if at is not None and b.bufs[at[0]].kind == "weights":
                        out.add(at[0])
    for bd in (*b.lowered.inputs, *b.lowered.outputs):
        if b.bufs[bd.tensor.buf].kind == "weights":
            out.add(bd.tensor.buf)
    return out


def lay_out_weights(b: Any) -> tuple[dict[tuple[int, int], tuple[int, int]],
                                      dict[tuple[int, int], int], dict[int, int], int]:
    """Each context's weights BO: the span of each buffer it holds (``context_spans`` from
    context 0 on, ``host_read_buffers`` whole in context 0), one after another. A span starts
    at a multiple of its buffer's alignment, so every address into it keeps its alignment.
    Returns (context, buffer id) -> its span (lo, hi); -> where the buffer's byte 0 would be
    in the BO (below the span's start, possibly negative: only addresses inside the span are
    relocated, and a relocation below 0 is refused, regcmd_image.py); context -> BO bytes;
    and the bytes of every buffer laid out once (the weights themselves, for stats)."""
    spans = context_spans(b, first_context=0)
    for bid in host_read_buffers(b):
        spans[(0, bid)] = (0, b.bufs[bid].size)
    wspan: dict[tuple[int, int], tuple[int, int]] = {}
    woff: dict[tuple[int, int], int] = {}
    wsize: dict[int, int] = {}
    for c in range(b.ncores):
        pos = 0
        for bf in b.wbufs:
            sp = spans.get((c, bf.id))
            if sp is None:
                continue
            align = max(bf.align, 64)
            lo = sp[0] // align * align
            pos = round_up(pos, align)
            woff[(c, bf.id)] = pos - lo
            wspan[(c, bf.id)] = (lo, sp[1])
            pos += sp[1] - lo
        wsize[c] = pos
    once = 0
    for bf in b.wbufs:
        once = round_up(once, max(bf.align, 64)) + bf.size
    return wspan, woff, wsize, once


def buffer_pieces(size: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[0, size) cut at every span's ends (clipped to the buffer), in order."""
    cuts = {0, size}
    for lo, hi in spans:
        cuts.update((min(max(lo, 0), size), min(max(hi, 0), size)))
    c = sorted(cuts)
    return list(zip(c[:-1], c[1:]))
