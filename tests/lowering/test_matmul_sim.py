"""Emitted matmul tasks run on the C functional simulator and are checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.emitters.matmul import MatmulTile, emit_matmul, plan_matmul_tile
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import Reloc, EmittedTask, link

from lowering_testutil import SIM_MISSING, Memory, case_dir

pytestmark = pytest.mark.skipif(bool(SIM_MISSING), reason=SIM_MISSING or "simulator available")

P = get_profile("rk3588")


def _run_single(tile: MatmulTile, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    mem = Memory()
    mem.add("a", tile.a_bytes, tile.pack_a(a))
    mem.add("b", tile.b_bytes, tile.pack_b(b))
    mem.add("c", tile.c_bytes, fill=0xAA)          # sentinel: every byte must be written
    prog: EmittedTask = emit_matmul(tile, P, Reloc("a"), Reloc("b"), Reloc("c"))
    mem.add("regcmd", 8 * len(prog))
    words = prog.array(mem.addresses())
    mem["regcmd"][:words.nbytes] = words.view(np.uint8)
    mem.run([(mem.addresses()["regcmd"], len(prog))])
    assert not np.all(mem["c"][:tile.c_bytes] == 0xAA), "the output was never written"
    return tile.unpack_c(mem["c"])


def test_simulator_runs_conformance_01() -> None:
    # the gate for everything below: the foreign program on the simulator
    import json
    d = case_dir("01")
    m = json.loads((d / "program" / "buffers.json").read_text())
    mem = Memory()
    for b in m["buffers"]:
        data = (d / "program" / b["file"]).read_bytes() if b["file"] else None
        mem._next = b["iova"]
        mem.add(b["name"], b["size"], data)
    t = m["jobs"][0]["tasks"][0]
    words = np.fromfile(d / "program" / t["file"], "<u8")
    off = t["regcmd_iova"] - mem.addresses()["regcmd"]
    mem["regcmd"][off:off + words.nbytes] = words.view(np.uint8)
    mem.run([(t["regcmd_iova"], t["words"])])
    exp = (d / "expected_output.bin").read_bytes()
    assert mem["output"][:len(exp)].tobytes() == exp


def _ints(shape, lo, hi, dtype, rng):
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (6, 40, 20), (13, 100, 50), (8, 64, 32)])
def test_fp16_exact_small_integers(m, k, n) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = _ints((m, k), -4, 4, np.float16, rng), _ints((n, k), -4, 4, np.float16, rng)
    tile = plan_matmul_tile(m, k, n, DType.F16, DType.F16, P)
    got = _run_single(tile, a, b)
    ref = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16)  # |C| <= 1600: exact
    assert np.array_equal(got, ref)


def test_fp16_random_normal_fp16_and_fp32_out() -> None:
    rng = np.random.default_rng(7)
    m, k, n = 5, 70, 24
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    got32 = _run_single(plan_matmul_tile(m, k, n, DType.F16, DType.F32, P), a, b)
    assert got32.dtype == np.float32
    # fp16 products are exact in fp32; only the fp32 summation order rounds
    assert np.all(np.abs(got32 - ref) <= k * 2.0**-24 * bound + 1e-30)
    got16 = _run_single(plan_matmul_tile(m, k, n, DType.F16, DType.F16, P), a, b)
    err = np.abs(got16.astype(np.float64) - ref)
    assert np.all(err <= np.abs(ref) * 2.0**-11 + k * 2.0**-24 * bound + 2.0**-24)


@pytest.mark.parametrize("m,k,n", [(7, 50, 40), (8, 64, 64), (1, 32, 32)])
def test_int8_to_int32_exact(m, k, n) -> None:
    rng = np.random.default_rng(m + k + n)
    a, b = _ints((m, k), -128, 127, np.int8, rng), _ints((n, k), -128, 127, np.int8, rng)
    got = _run_single(plan_matmul_tile(m, k, n, DType.I8, DType.I32, P), a, b)
    assert got.dtype == np.int32
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)


def test_self_chained_kick_of_n_tiles() -> None:
    # C = A . B^T with N split in three 16-wide tiles, one task each, linked into one kick
    rng = np.random.default_rng(3)
    m, k, nt, tiles = 12, 64, 16, 3
    a = _ints((m, k), -3, 3, np.float16, rng)
    b = _ints((nt * tiles, k), -3, 3, np.float16, rng)
    tile = plan_matmul_tile(m, k, nt, DType.F16, DType.F16, P)
    mem = Memory()
    mem.add("a", tile.a_bytes, tile.pack_a(a))
    mem.add("b", tile.b_bytes * tiles, np.concatenate(
        [tile.pack_b(b[j * nt:(j + 1) * nt]) for j in range(tiles)]))
    mem.add("c", tile.c_bytes * tiles, fill=0xAA)
    progs = [emit_matmul(tile, P, Reloc("a"), Reloc("b", j * tile.b_bytes),
                         Reloc("c", j * tile.c_bytes), name=f"n{j}") for j in range(tiles)]
    kick = link(progs, P, "regcmd")
    mem.add("regcmd", kick.nbytes)
    words = kick.array(mem.addresses())
    mem["regcmd"][:words.nbytes] = words.view(np.uint8)
    mem.run(kick.job_tasks(mem.addresses()["regcmd"]))
    got = np.concatenate([tile.unpack_c(mem["c"][j * tile.c_bytes:]) for j in range(tiles)], axis=1)
    ref = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16)
    assert np.array_equal(got, ref)
