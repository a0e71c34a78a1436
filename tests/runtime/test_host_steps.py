"""Host steps against numpy (and the conformance weight blob for the layout steps)."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.runtime import (AddressError, NullDevice, Operand, ProgramBuilder, ProgramError,
                             SimDevice, SimUnsupportedError, host_steps)

from .conftest import case_dir

RNG = np.random.default_rng(7)


def make_prog(*sizes):
    dev = NullDevice()
    b = ProgramBuilder(dev)
    bos = [b.add_bo(s, "arena") for s in sizes]
    return dev, b, bos


def test_pack_unpack_cube_matches_layout_formula():
    h, w, c, c2 = 3, 5, 20, 8
    x = RNG.integers(0, 60000, (h, w, c)).astype(np.uint16)
    line, surf = w * c2 * 2, h * w * c2 * 2
    groups = -(-c // c2)
    dev, b, (src, cube, back) = make_prog(x.nbytes, groups * surf, x.nbytes)
    b.upload(src, x)
    layout = dict(height=h, width=w, channels=c, c2=c2, esize=2)
    b.add_host_step(host_steps.pack_cube(Operand(src), Operand(cube), **layout))
    b.add_host_step(host_steps.unpack_cube(Operand(cube), Operand(back), **layout))
    prog = b.build()
    prog.run()
    got = np.frombuffer(prog.read(cube, groups * surf), np.uint16)
    # notes encodings/tile-layouts.md: byte(h,w,c) = (c//c2)*surf + h*line + w*c2*2 + (c%c2)*2
    hh, ww, cc = np.meshgrid(range(h), range(w), range(c), indexing="ij")
    pos = ((cc // c2) * surf + hh * line + ww * c2 * 2 + (cc % c2) * 2) // 2
    np.testing.assert_array_equal(got[pos], x)
    pad = np.ones(got.size, bool)
    pad[pos.ravel()] = False
    assert not got[pad].any()  # padding channels are zero
    np.testing.assert_array_equal(prog.read_array(back, np.uint16, (h, w, c)), x)
    prog.close()
    dev.close()


def test_pack_weight_reproduces_conformance_blob():
    """Case 01's weight.bin is B[32,64] fp16 in [N/16][K/32][16][32] blocks (case.md); unpack
    it with numpy from that formula, then pack it with the host step: the bytes must match."""
    d = case_dir("01_matmul_fp16")
    blob = (d / "program" / "blobs" / "weight.bin").read_bytes()
    n_, k_ = 32, 64
    raw = np.frombuffer(blob, np.uint16)
    nn, kk = np.meshgrid(range(n_), range(k_), indexing="ij")
    pos = ((nn // 16) * (k_ // 32) + kk // 32) * 512 + (nn % 16) * 32 + kk % 32
    bmat = raw[pos]
    dev, b, (src, dst) = make_prog(bmat.nbytes, len(blob))
    b.upload(src, bmat)
    b.add_host_step(host_steps.pack_weight(Operand(src), Operand(dst), kernels=n_, channels=k_,
                                           kh=1, kw=1, n_group=16, k_group=32, esize=2))
    prog = b.build()
    prog.run()
    assert prog.read(dst, len(blob)) == blob
    prog.close()
    dev.close()


def test_host_step_checks_at_add_time():
    dev, b, (a, c) = make_prog(256, 256)
    cube = dict(height=2, width=2, channels=4, c2=8, esize=2)  # 32 dense bytes, 64 cube bytes
    with pytest.raises(AddressError, match="needs"):
        b.add_host_step(host_steps.pack_cube(Operand(a), Operand(c, 200), **cube))
    with pytest.raises(ProgramError, match="program has 2 BOs"):
        b.add_host_step(host_steps.pack_cube(Operand(7), Operand(c), **cube))
    with pytest.raises(ProgramError, match="unknown kind 1"):
        step = host_steps.pack_cube(Operand(a), Operand(c), **cube)
        step.kind = 1  # a retired kind
        b.add_host_step(step)
    with pytest.raises(ProgramError, match="not a layout kind"):
        step = host_steps.pack_cube(Operand(a), Operand(c), height=1, width=1, channels=1, c2=8,
                                    esize=2)
        step.param[0] = 9
        b.add_host_step(step)
    b.build().close()
    dev.close()


def test_registry_covers_every_kind():
    # the kinds the compiler emits, and no other: a kind nothing emits is dead code
    assert set(host_steps.HOST_STEPS) == {"pack_cube", "unpack_cube",
                                          "pack_weight"} | set(host_steps.HOST_OP_KINDS)
    assert SimUnsupportedError.code == -5 and SimDevice.kind == "sim"


def test_trace_steps_flag(monkeypatch, capfd):
    monkeypatch.setenv("RJ_TRACE_STEPS", "1")
    dev, b, (a, c) = make_prog(256, 256)
    b.add_host_step(host_steps.pack_cube(Operand(a), Operand(c), height=2, width=2, channels=4,
                                         c2=8, esize=2))
    prog = b.build()
    prog.run()
    assert "rockjit: step 0: host pack, 96 bytes" in capfd.readouterr().err
    prog.close()
    dev.close()
