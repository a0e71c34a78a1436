"""Python's cyclic garbage collector paused while a compile runs.

A compile allocates hundreds of thousands of small objects (IR nodes, buffer specs, tasks),
and every few thousand allocations CPython's collector scans them, and each full (oldest
generation) pass also scans every object the process already holds (JAX's modules, the
traced graph): about a fifth of a SigLIP-B compile went to those passes (issue 9,
bench/compile_vs_xla.py). A compile's objects are freed by reference counting; the cycles it
leaves behind are a few thousand small objects, collected by the next automatic pass after
the compile. So the collector is disabled for the compile's duration and re-enabled after,
only if it was enabled before (a nested or concurrent compile that finds it disabled leaves
it alone), with the compile's survivors moved into the oldest generation (_promote_survivors).
Because of that, nothing a compile leaves behind may sit in a reference cycle: it would stay
until a full collection (tests/lowering/test_compile_memory.py). The outermost paused call
also hands the C heap's free pages back to the kernel when it starts and ends
(``return_free_heap``).
"""
from __future__ import annotations

import ctypes
import functools
import gc
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()


def gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with the cyclic collector disabled (restored afterwards, also on error)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _lock:
            paused = gc.isenabled()
            if paused:
                gc.disable()
        if paused:
            return_free_heap()      # what the process freed before (another thread's arena too)
        try:
            return fn(*args, **kwargs)
        finally:
            if paused:
                _promote_survivors()
                gc.enable()
                return_free_heap()
    return wrapper


_trim: list = []


def return_free_heap() -> None:
    """The C heap's free pages handed back to the kernel (glibc ``malloc_trim``). A compile
    frees most of what it allocated (the lowering's tensors, tasks and temporary arrays, GBs
    for a whole encoder), but glibc keeps freed heap pages mapped, and what comes next -- the
    device's BOs, a forward's arrays -- is mapped afresh (large blocks), so the kept pages
    added to the process's peak (bench/compile_rss.py). A no-op where the C library has no
    ``malloc_trim``. Called when the outermost paused call starts (what the process freed
    before, in any thread's arena -- a reference model's forward, a dropped program -- cannot
    be reused by the compile's own thread) and when it ends."""
    if not _trim:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = getattr(ctypes.CDLL(None), "malloc_trim", None)
            except OSError:
                fn = None
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        _trim.append(fn)
    if _trim[0] is not None:
        _trim[0](0)


def _promote_survivors() -> None:
    """The objects the compile leaves alive (its graph, program, image: hundreds of thousands)
    moved straight into the oldest generation. Left in the youngest, the first allocation
    after ``gc.enable()`` would scan every one of them (and a later pass again in the middle
    generation): about a tenth of a 22-layer ModernBERT compile, paid by the first call.
    ``gc.freeze()`` + ``gc.unfreeze()`` moves every tracked object into the oldest generation
    unscanned; a cycle among them is still collected by the next full pass. Skipped when the
    process froze objects itself (unfreeze would thaw them)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
