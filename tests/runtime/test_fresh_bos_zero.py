"""A program's BOs read as zero when created, on every backend: LoadedImage skips the image's
zero fills of BOs nothing else is written into (runtime/program.py) on that ground. A backend
that recycled BOs (a pool) or handed out dirty memory would fail here, after a first program
has filled the same sizes with non-zero bytes and been closed.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from rockjit.runtime import NullDevice, ProgramBuilder, RocketDevice, SimDevice

_SIZES = (64, 4096 + 8, 3 << 20)       # sub-page, just past a page, several MB
_DEVICES = {"null": lambda: NullDevice(cores=2), "sim": lambda: SimDevice(cores=2),
            "fake rocket": lambda: RocketDevice(fake=True, cores=2)}
if os.path.exists("/dev/accel/accel0"):
    _DEVICES["rocket"] = lambda: RocketDevice(cores=2)


def _bos(dev):
    b = ProgramBuilder(dev)
    return b, [(b.add_bo(size, role, core), size) for size in _SIZES
               for role in ("arena", "weights", "regcmd") for core in (0, 1)]


@pytest.mark.parametrize("kind", sorted(_DEVICES))
def test_a_fresh_bo_reads_as_zero(kind, fake) -> None:
    with _DEVICES[kind]() as dev:
        b, bos = _bos(dev)
        for bo, size in bos:
            b.write(bo, np.full(size, 0xA5, np.uint8))
        prog = b.build()
        assert all(prog.read(bo, size) == b"\xa5" * size for bo, size in bos)
        prog.close()
        b, bos = _bos(dev)
        for bo, size in bos:
            got = np.frombuffer(b.read(bo, size), np.uint8)
            assert not got.any(), (kind, bo, size, int(np.flatnonzero(got)[0]))
        b.build().close()
