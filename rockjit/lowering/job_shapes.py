"""What the image builder reads off a scheduled job, once per distinct job.

An image's layers share their jobs (compile_cache.py: the calls of every layer hold the same
NpuJob objects, only their bindings differ), so the parts of a job that do not depend on the
call -- its DMA streams as plain tuples, its runtime jobs' task lists relative to the kick's
regcmd buffer, its declared byte counts -- are taken apart once per job (``JobShape``), and the
builder only resolves buffer names per call and context. The caches are keyed by ``id`` of the
job and hold the job, so an id is never reused while its entry lives.
"""
from __future__ import annotations

from dataclasses import dataclass

from .op_lowering import NpuJob
from .schedule import runtime_jobs

# (buffer name, offset, pieces, pitch, chunk): one DMA stream of a task (regcmd.Access)
Stream = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class JobShape:
    """A job apart from its call: ``reads``/``writes``: every task's DMA streams in kick order
    (repeats kept: callers that count bytes per stream see each one); ``named_reads`` /
    ``named_writes``: the names the job declares it reads and writes; ``reloc_names``: the
    names its address words point into; ``runtime``: per runtime job (schedule.runtime_jobs),
    whether it is chained and its tasks as (regcmd buffer name, byte offset in that buffer,
    register count); ``merge``: per runtime job, what job_merge.py asks of it (whether its
    tasks may self-chain with other work, and the byte hull of each DMA stream it reads and
    writes, relative to its buffer); ``dev_read``/``dev_written``:
    the declared DMA bytes of all its tasks."""

    job: NpuJob
    reads: tuple[Stream, ...]
    writes: tuple[Stream, ...]
    named_reads: tuple[str, ...]
    named_writes: tuple[str, ...]
    reloc_names: tuple[str, ...]
    runtime: tuple[tuple[bool, tuple[tuple[str, int, int], ...]], ...]
    dev_read: int
    dev_written: int
    merge: tuple[tuple[bool, tuple[tuple[str, int, int], ...],
                       tuple[tuple[str, int, int], ...]], ...]


def _hull(a) -> tuple[str, int, int]:
    """(buffer name, first byte, end) of an access's strided run, relative to the buffer."""
    far = a.offset + (a.pieces - 1) * a.pitch
    return a.buffer, min(a.offset, far), max(a.offset, far) + a.chunk


def _streams(accesses) -> tuple[Stream, ...]:
    return tuple((a.buffer, a.offset, a.pieces, a.pitch, a.chunk) for a in accesses)


def job_shape(cache: dict[int, JobShape], job: NpuJob) -> JobShape:
    """``job``'s shape, from ``cache`` when it was taken apart before."""
    hit = cache.get(id(job))
    if hit is not None:
        return hit
    kicks = job.kicks
    rjobs = runtime_jobs(job)
    runtime = tuple((bool(chained), tuple(
        (k.regcmd_buffer, k.base_offset + 8 * toff, cnt)
        for k in rks for toff, cnt in zip(k.task_offsets, k.task_counts)))
        for rks, chained in rjobs)
    # an integer job's tasks never share a kick (the CACC clears per kick), nor do the tasks of
    # a gapped runtime job (its kicks are apart on purpose)
    merge = tuple((not job.integer and all(k.chainable for k in rks)
                   and (chained or sum(k.task_number for k in rks) == 1),
                   tuple(_hull(a) for k in rks for a in k.reads),
                   tuple(_hull(a) for k in rks for a in k.writes)) for rks, chained in rjobs)
    hit = cache[id(job)] = JobShape(
        job, tuple(s for k in kicks for s in _streams(k.reads)),
        tuple(s for k in kicks for s in _streams(k.writes)), tuple(job.reads), tuple(job.writes),
        tuple(dict.fromkeys(rel.buffer for k in kicks for rel in k.relocs.values())), runtime,
        sum(a.nbytes for k in kicks for a in k.reads),
        sum(a.nbytes for k in kicks for a in k.writes), merge)
    return hit


def job_span(cache: dict[int, tuple[int, int]], job: NpuJob, regcmd: str) -> tuple[int, int]:
    """The byte span [lo, hi) of ``job``'s kicks in its call's regcmd buffer ``regcmd``. The
    image builder moves it as a whole (image_builder._lay_out_regcmd), which is faithful only
    when every regcmd address the kicks hold (chain links) stays inside it: checked here, once
    per distinct job."""
    hit = cache.get(id(job))
    if hit is not None and hit[0] is job:
        return hit[1]
    kicks = job.kicks
    if not kicks:
        raise ValueError("an NPU job without kicks has no regcmd span")
    for k in kicks:
        if k.regcmd_buffer != regcmd:
            raise ValueError(f"a job's kick is in {k.regcmd_buffer!r}, not its call's regcmd "
                             f"buffer {regcmd!r}")
    lo = min(k.base_offset for k in kicks)
    hi = max(k.base_offset + k.nbytes for k in kicks)
    for k in kicks:
        for wi, rel in k.relocs.items():
            if rel.buffer == regcmd and not lo <= rel.offset < hi:
                raise ValueError(f"kick at {k.base_offset:#x} word {wi} points at {regcmd!r} "
                                 f"{rel.offset:#x}, outside its job's span [{lo:#x}, {hi:#x})")
    cache[id(job)] = (job, (lo, hi))
    return lo, hi
