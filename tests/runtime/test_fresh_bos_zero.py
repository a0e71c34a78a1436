"""A program's BOs read as zero when created, on every backend: LoadedImage skips the image's
zero fills of BOs nothing else is written into (runtime/program.py) on that ground. A backend
that recycled BOs (a pool) or handed out dirty memory would fail here, after a first program
has filled the same sizes with non-zero bytes and been closed. With RJ_POISON_BOS (new BOs
filled with 0xAA) the fills are written, and the image's zero regions read zero after load.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit

from rockjit.runtime import NullDevice, ProgramBuilder, RocketDevice, SimDevice
from rockjit.runtime.program import LoadedImage

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


@pytest.mark.parametrize("poison", [False, True])
def test_an_images_zero_regions_read_zero_after_load(poison, monkeypatch) -> None:
    monkeypatch.setenv("RJ_POISON_BOS", "1" if poison else "0")
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((20, 7)).astype(np.float32)}
    x = rng.standard_normal((5, 20)).astype(np.float32)
    img = rockjit.compile(lambda p, x: jnp.tanh(x @ p["w"]) * 2.0, resident_argnums=0,
                          backend="sim").lower(w, x).compile().image
    assert img.zero_fills, "the example no longer has a zero fill: pick one that has"
    with SimDevice(cores=img.contexts) as dev:
        li = LoadedImage(img, dev)
        try:
            for z in img.zero_fills:
                assert li.program.read(z.bo, z.size, z.offset) == bytes(z.size), z
            arena = next(k for k, bo in enumerate(img.bos) if bo.role == "arena")
            # the bytes past the arena plan: 0xAA exactly when poisoned (the switch reached
            # the runtime, so the fills above were needed and written)
            end = img.bos[arena].size
            assert li.program.read(arena, 8, end - 8) == (b"\xaa" * 8 if poison else bytes(8))
        finally:
            li.close()
