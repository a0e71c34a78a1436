"""The cyclic collector is paused for a compile and restored after it, also on an error."""
from __future__ import annotations

import gc

import pytest

from rockjit.gc_pause import gc_paused


def test_paused_inside_and_restored_after() -> None:
    seen = []
    f = gc_paused(lambda: seen.append(gc.isenabled()) or 7)
    assert gc.isenabled()
    assert f() == 7
    assert seen == [False] and gc.isenabled()


def test_restored_after_an_error() -> None:
    @gc_paused
    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        gc_paused(lambda: None)()
        assert not gc.isenabled()
    finally:
        gc.enable()
