"""BOs and arena placement on every device."""
from __future__ import annotations

import pytest

from rockjit.runtime import NullDevice, ProgramBuilder, ProgramError, RocketDevice, SimDevice

PAGE = 4096


@pytest.mark.parametrize("make", [SimDevice, NullDevice])
def test_bo_addresses_pages_and_guard(make):
    with make(cores=2) as dev:
        a, b = dev.create_bo(5000), dev.create_bo(100)
        c = dev.create_bo(100, core=1)
        assert a.iova % PAGE == 0 and b.iova % PAGE == 0
        # 5000 bytes occupy two pages; one unmapped guard page separates BOs.
        assert b.iova >= a.iova + 2 * PAGE + PAGE
        assert b.iova + b.size <= 1 << 32
        assert c.info.ctx == 1 and c.iova == a.iova  # each context has its own IOVA window
        mem = a.memory()
        mem[:4] = b"\x01\x02\x03\x04"
        assert bytes(a.memory()[:4]) == b"\x01\x02\x03\x04"
        assert dev.stats()["bos_live"] == 3
        for bo in (c, b, a):
            bo.close()
        assert dev.stats()["bos_live"] == 0


def test_bo_errors_name_the_problem():
    with SimDevice() as dev:
        with pytest.raises(ProgramError, match="context 1 does not exist"):
            dev.create_bo(64, core=1)
        with pytest.raises(ProgramError, match="size 0"):
            dev.create_bo(0)


def test_rocket_fake_bo_iovas(fake):
    with RocketDevice(fake=True, cores=2) as dev:
        a, b = dev.create_bo(5000), dev.create_bo(10)
        c = dev.create_bo(10, core=1)
        # The kernel's per-fd allocator: page aligned, first fit from 0 (no guard page).
        assert (a.iova, b.iova, c.iova) == (0, 2 * PAGE, 0)
        assert fake.stats()["live_bos"] == 3
        for bo in (c, b, a):
            bo.close()
        assert fake.stats()["live_bos"] == 0


def test_arena_placement():
    with NullDevice() as dev:
        b = ProgramBuilder(dev)
        arena = b.add_bo(4096, "arena")
        assert b.place(arena, 100, align=64) == 0
        assert b.place(arena, 10, align=256) == 256
        assert b.place(arena, 64, align=8, offset=1024) == 1024
        assert b.place(arena, 32, align=16, offset=0) == 0  # liveness reuse may overlap
        assert b.place(arena, 8, align=8) == 1088          # bump continues past the highest end
        with pytest.raises(ProgramError, match="alignment"):
            b.place(arena, 8, align=8, offset=1001)
        with pytest.raises(ProgramError, match="does not fit"):
            b.place(arena, 200, align=8, offset=4000)
        with pytest.raises(ProgramError, match="power of two"):
            b.place(arena, 8, align=3)
        with pytest.raises(ProgramError, match="BO index 5 does not exist"):
            b.place(5, 8)
        b.build().close()


def test_upload_and_read_back_roundtrip():
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        w = b.add_bo(1000, "weights")
        payload = bytes(range(256)) * 3
        b.upload(w, payload, offset=100)
        prog = b.build()
        assert prog.read(w, len(payload), offset=100) == payload
        with pytest.raises(ProgramError, match="outside BO"):
            prog.read(w, 8, offset=996)
        st = prog.stats()
        assert st["upload_bytes"] == len(payload) and st["readback_bytes"] == len(payload)
