"""Python's cyclic garbage collector paused while a compile runs.

A compile allocates hundreds of thousands of small objects (IR nodes, buffer specs, tasks),
and every few thousand allocations CPython's collector scans them, and each full (oldest
generation) pass also scans every object the process already holds (JAX's modules, the
traced graph): about a fifth of a SigLIP-B compile went to those passes (issue 9,
bench/compile_vs_xla.py). A compile's objects are freed by reference counting; the cycles it
leaves behind are a few thousand small objects, collected by the next automatic pass after
the compile. So the collector is disabled for the compile's duration and re-enabled after,
only if it was enabled before (a nested or concurrent compile that finds it disabled leaves
it alone).
"""
from __future__ import annotations

import functools
import gc
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
        try:
            return fn(*args, **kwargs)
        finally:
            if paused:
                gc.enable()
    return wrapper
