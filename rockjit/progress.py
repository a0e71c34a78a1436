"""Progress bars for the long stages of whole models (lowering, which packs the weights, and
the image layout): tqdm on an interactive stderr, nothing otherwise (CI logs, pipes, tests).
ROCKJIT_PROGRESS=0/1 forces them off/on (debugflags.PROGRESS)."""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

from . import debugflags

T = TypeVar("T")

# below this many items a bar is noise
_MIN_ITEMS = 200


def enabled() -> bool:
    v = debugflags.value(debugflags.PROGRESS.name).strip().lower()
    if v:
        return debugflags.enabled(debugflags.PROGRESS.name)
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """``items``, with a bar when enabled and there are enough of them."""
    n = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    if not enabled() or (n is not None and n < _MIN_ITEMS):
        return iter(items)
    from tqdm import tqdm

    return iter(tqdm(items, desc=f"rockjit: {desc}", total=n, leave=False, unit="op",
                     file=sys.stderr, dynamic_ncols=True))
