"""How many CPU threads the C runtime's host steps run on (csrc/runtime/rj_host_pool.h).

    set_host_threads(2)        # process-wide; None: back to RJ_HOST_THREADS / the default
    host_threads()             # the count in effect
    image_host_threads(image)  # per host step of an image: the threads the runtime gives it

A host step that moves at least ``SPLIT_MIN_BYTES`` is cut into ranges of its outer loop and
run by the calling thread plus a process-wide pool of workers; each range writes its own part
of the output, so the results are the same bits on any number of threads. The numbers here are
the C library's own (read through the binding), and ``image_host_threads`` asks the C function
the runtime decides with, so the cost model charges each step at the thread count it runs on.
"""
from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache
from typing import Any

import numpy as np

from ._ffi import call, ffi, lib
from .errors import ProgramError

# the board's default (4 A76 cores, 3 de-tile); a host with fewer CPUs defaults to its CPUs
# but one (host_default()), the cost model always charges the board's
DEFAULT_HOST_THREADS = int(lib.RJ_HOST_THREADS_DEFAULT)
MAX_HOST_THREADS = int(lib.RJ_HOST_THREADS_MAX)
SPLIT_MIN_BYTES = int(lib.RJ_HOST_SPLIT_MIN_BYTES)
_DESC_BYTES = ffi.sizeof("rj_host_op")


def set_host_threads(n: int | None) -> None:
    """Run host steps on up to ``n`` threads (1: one thread, no workers), for every program of
    this process from its next run; ``None`` goes back to ``RJ_HOST_THREADS`` or the default."""
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"set_host_threads: {n!r} is not a thread count (an int from 1 to "
                         f"{MAX_HOST_THREADS}, or None for RJ_HOST_THREADS / the default "
                         f"{DEFAULT_HOST_THREADS})")
    call(lib.rj_host_threads_set, 0 if n is None else n)


def host_threads() -> int:
    """The thread count host steps run on now (raises if ``RJ_HOST_THREADS`` is malformed)."""
    out = ffi.new("uint32_t *")
    call(lib.rj_host_threads_get, out)
    return int(out[0])


def host_default() -> int:
    """The count when neither set_host_threads nor RJ_HOST_THREADS says: min(3, CPUs - 1)."""
    return int(lib.rj_host_threads_default())


def pool_workers() -> int:
    """Worker threads alive in the pool now (the callers are not counted)."""
    return int(lib.rj_host_pool_workers())


def shutdown_pool() -> None:
    """Join the pool's workers now (they start again on the next split step)."""
    lib.rj_host_pool_shutdown()


class ImageUploads:
    """An image's uploaded bytes by (BO, offset): where a host step's descriptor lives."""

    def __init__(self, image: Any) -> None:
        self._by_bo: dict[int, tuple[list[int], list[Any]]] = {}
        for u in sorted(image.uploads, key=lambda u: (u.bo, u.offset)):
            starts, ups = self._by_bo.setdefault(u.bo, ([], []))
            starts.append(u.offset)
            ups.append(u)
        self._arrays = image.arrays

    def read(self, bo: int, offset: int, size: int) -> bytes | None:
        """``size`` uploaded bytes from ``offset``, across adjacent uploads (a weights buffer
        may be uploaded in pieces: lowering/weight_spans.py); None where a byte is not
        uploaded."""
        starts, ups = self._by_bo.get(bo, ([], []))
        i = bisect_right(starts, offset) - 1
        out, pos = b"", offset
        while len(out) < size:
            if i < 0 or i >= len(ups) or starts[i] > pos:
                return None
            data = self._arrays[ups[i].array]
            lo = pos - starts[i]
            if lo >= data.size:
                return None
            take = data[lo:lo + size - len(out)].tobytes()
            out, pos, i = out + take, pos + len(take), i + 1
        return out


def step_descriptor(uploads: ImageUploads, spec: Any) -> bytes | None:
    """The host-op descriptor bytes an image host step (``HostStepSpec``) names, or None for a
    layout step."""
    if "desc" not in spec.operands:
        return None
    bo, off = spec.operands["desc"][:2]
    raw = uploads.read(int(bo), int(off), _DESC_BYTES)
    if raw is None:
        raise ProgramError(f"host step {spec.kind!r}: no uploaded descriptor at BO {bo} offset "
                           f"{off} in the image")
    return raw


def plan_threads(spec: Any, desc: bytes | None, threads: int) -> int:
    """The threads the runtime runs one image host step on when ``threads`` are available
    (rj_host_step_plan_threads: the runtime's own decision)."""
    from .program import _host_step_from_spec

    step = _host_step_from_spec(spec)
    d = ffi.NULL
    if desc is not None:
        d = ffi.new("rj_host_op *")
        ffi.memmove(d, desc, _DESC_BYTES)
    n = int(lib.rj_host_step_plan_threads(step, d, threads))
    if n == 0:
        raise ProgramError(f"host step {spec.kind!r}: the runtime refuses its parameters or "
                           f"descriptor (rj_host_step_plan_threads)")
    return n


def image_host_threads(image: Any, threads: int = DEFAULT_HOST_THREADS,
                       uploads: ImageUploads | None = None) -> list[int | None]:
    """Per step of ``image`` (a ProgramImage): the threads the runtime gives a host step when
    ``threads`` are available, None for an NPU step. ``uploads``: the image's, when the
    caller has them already."""
    ups = uploads if uploads is not None else ImageUploads(image)
    out: list[int | None] = []
    for st in image.steps:
        if st.kind != "host":
            out.append(None)
            continue
        out.append(plan_threads(st.host, step_descriptor(ups, st.host), threads))
    return out


def descriptor_bytes_moved(desc: bytes) -> int:
    """The elements of a copy descriptor's output times its element size: the bytes a
    cross-context copy moves (its pieces x chunk)."""
    from .host_abi import DESC_DTYPE

    d = np.frombuffer(desc, DESC_DTYPE, count=1)[0]
    rank = int(d["rank"])
    return int(np.prod([int(x) for x in d["shape"][:rank]], dtype=np.int64)) * \
        _dtype_sizes()[int(d["view"][0]["dtype"])]


@lru_cache(maxsize=1)
def _dtype_sizes() -> dict[int, int]:
    """Element size of every host-op dtype code (the C library's, asked once)."""
    from .host_abi import DTYPES

    return {DTYPES[k]: int(lib.rj_host_dtype_size(DTYPES[k])) for k in DTYPES}
