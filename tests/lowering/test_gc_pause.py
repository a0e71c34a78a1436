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


class _Node:
    def __init__(self) -> None:
        self.me = self          # a reference cycle: only the cyclic collector frees it


def test_survivors_skip_the_young_generations_and_cycles_are_still_collected() -> None:
    import weakref

    made = gc_paused(lambda: [_Node() for _ in range(3)])()
    young = {id(o) for o in gc.get_objects(0)} | {id(o) for o in gc.get_objects(1)}
    assert not any(id(n) in young for n in made)
    assert any(o is made[0] for o in gc.get_objects(2))
    ref = weakref.ref(made[0])
    del made
    assert ref() is not None    # a cycle: reference counting alone does not free it
    gc.collect()
    assert ref() is None


def test_objects_the_process_froze_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        gc_paused(lambda: [_Node() for _ in range(3)])()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
