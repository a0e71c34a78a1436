"""Tiled matmul lowering (build_matmul) on the simulator, table-driven, against numpy.

fp16 results are checked with rockjit.oracle.tolerance (the one tolerance rule), int8 results
bit-exactly. Data are random normal fp16 values (small integers would hide rounding and layout
errors, matmul-as-conv.md), int8 uniform over the full range. Every program runs in the
simulator's strict mode, so any hazard (CBUF over-subscription, int8 chaining, height < 4, EW
under 12 positions, ...) fails the test."""
from __future__ import annotations

import dataclasses
import zlib
from typing import NamedTuple

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.matmul import build_matmul, plan_matmul
from rockjit.lowering.op_lowering import HostStep, NpuStep
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import LoweringError

from op_lowering_sim import MISSING, run_matmul

P = get_profile("rk3588")
F16, F32, I8, I32 = DType.F16, DType.F32, DType.I8, DType.I32
sim = pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")


class MM(NamedTuple):
    why: str
    m: int
    k: int
    n: int
    i: DType = F16
    o: DType = F16
    caps: tuple[int | None, int | None, int | None] = (None, None, None)   # max M, K, N tile
    batch: int = 0                 # 0: plain 2-D; > 0: batched
    b_input: bool = False          # B is an activation (bind 1) instead of a constant
    b_shared: bool = False         # batched with one constant B for every element


OPS = [
    MM("minimal", 4, 32, 16),
    MM("M=1 (padded to 4 rows)", 1, 32, 16),
    MM("M=1, two N groups", 1, 64, 32),
    MM("nothing aligned", 3, 40, 20),
    MM("M%4, K%32, N%16", 13, 100, 50),
    MM("conformance 02 tiling (K and N)", 16, 192, 32, caps=(None, 64, 16)),
    MM("tiles in M, N and K at once", 100, 300, 90, caps=(32, 96, 32)),
    MM("ragged tails in M, N and K", 37, 129, 47, caps=(16, 64, 16)),
    MM("K=16384, M=1 (K split, M padded to 12 for the EW partial)", 1, 16384, 32),
    MM("K=8192", 8, 8192, 16),
    MM("K>8192 unaligned, M=2", 2, 12000, 48),
    MM("K=10240 (notes' large-K check)", 64, 10240, 256),
    MM("Whisper fc1 T=1500", 1500, 384, 1536),
    MM("Whisper fc2 T=1500", 1500, 1536, 384),
    MM("SigLIP-size projection", 512, 768, 768),
    MM("one task at the row limit", 1020, 64, 32),
    MM("just past the row limit", 1023, 64, 32),
    MM("many row tiles", 2600, 32, 16),
    MM("N past the DPU cube limit", 8, 32, 8208),
    MM("wide N, K in one step (fp32 partials priced)", 64, 768, 2048),
    MM("fp32 out", 5, 70, 24, o=F32),
    MM("fp32 out, K split (32-bit EW partial)", 20, 300, 90, o=F32, caps=(None, 96, 32)),
    MM("fp32 out, K=16384", 4, 16384, 32, o=F32),
    MM("int8 minimal", 7, 50, 40, I8, I32),
    MM("int8 M=1", 1, 32, 32, I8, I32),
    MM("int8 N%32", 5, 70, 33, I8, I32),
    MM("int8 tiles in M, N and K (host K sum)", 100, 300, 90, I8, I32, caps=(32, 96, 32)),
    MM("int8 K=16384", 1, 16384, 32, I8, I32),
    MM("int8 bank-slack resonance tile (144 x 672)", 144, 672, 64, I8, I32),
    MM("int8 Whisper fc2 rows", 300, 1536, 384, I8, I32),
    MM("attention QK^T: 12 heads, B an activation", 64, 64, 64, batch=12, b_input=True),
    MM("attention PV, T=100 keys (K unaligned)", 100, 100, 64, batch=2, b_input=True),
    MM("batched, constant B per element", 20, 64, 40, batch=3),
    MM("batched, one shared B", 20, 300, 40, batch=2, b_shared=True, caps=(None, 96, None)),
    MM("int8 batched, B an activation", 12, 64, 32, I8, I32, batch=2, b_input=True),
]


def _data(op: MM, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    bs = (op.batch,) if op.batch else ()
    bb = () if op.b_shared else bs
    if op.i == I8:
        return (rng.integers(-128, 127, bs + (op.m, op.k), endpoint=True).astype(np.int8),
                rng.integers(-128, 127, bb + (op.n, op.k), endpoint=True).astype(np.int8))
    return (rng.standard_normal(bs + (op.m, op.k)).astype(np.float16),
            rng.standard_normal(bb + (op.n, op.k)).astype(np.float16))


@sim
@pytest.mark.parametrize("op", OPS, ids=[o.why for o in OPS])
def test_matmul_on_simulator(op: MM) -> None:
    rng = np.random.default_rng(zlib.crc32(op.why.encode()))
    a, b = _data(op, rng)
    mm, mk, mn = op.caps
    prog = build_matmul(op.m, op.k, op.n, op.i, op.o, P, batch=op.batch or 1,
                        b=None if op.b_input else b, max_m=mm, max_k=mk, max_n=mn)
    got, run = run_matmul(prog, a, b if op.b_input else None)
    bt = np.swapaxes(b, -1, -2)
    if op.i == I8:
        ref = a.astype(np.int64) @ bt.astype(np.int64)
        assert got.dtype == np.int32
        assert np.array_equal(got, ref)
    else:
        ref = a.astype(np.float64) @ bt.astype(np.float64)
        bnd = T.matmul_bound(a, np.broadcast_to(b, a.shape[:-2] + b.shape[-2:]), fp16_out=op.o == F16)
        assert got.dtype == op.o.to_numpy()
        T.check(got, ref, bnd, op.why)


# ---- structure of the emitted programs --------------------------------------------------------

def _cbuf_fields(prog):
    for job in prog.jobs():
        for k in job.kicks:
            for w in k.words:
                op, value, off = R.decode(w)
                reg = R.lookup(op & 0xFF00, off) if op & 0xFF == R.OP_WRITE else None
                if reg is not None and reg.full_name == "CNA_CBUF_CON0":
                    yield reg.unpack(value)


def test_kick_structure_fp16_chains_k_steps_int8_does_not() -> None:
    f = build_matmul(100, 300, 90, F16, F16, P, b=np.zeros((90, 300), np.float16),
                     max_m=32, max_k=96, max_n=32)
    jobs = f.jobs()
    # M tiles x N tiles x K steps, in independent jobs of one self-chained kick each (tiles
    # that share an operand share a job: test_tiles_sharing_an_operand_keep_it_in_the_cbuf)
    assert P.cores <= len(jobs) <= 4 * 3
    assert all(len(j.kicks) == 1 for j in jobs)
    assert sum(j.kicks[0].task_number for j in jobs) == 4 * 3 * 4
    assert len(f.steps) == 1 and isinstance(f.steps[0], NpuStep)
    i = build_matmul(100, 300, 90, I8, I32, P, b=np.zeros((90, 300), np.int8),
                     max_m=32, max_k=96, max_n=32)
    assert all(j.integer and len(j.kicks) == 4 and all(k.task_number == 1 for k in j.kicks)
               for j in i.jobs())
    host = [s for s in i.steps if isinstance(s, HostStep)]
    # K partials 2..4 are added into the output by host-op binary adds (int32 views)
    assert [h.kind for h in host] == ["binary"] * 3


def test_every_task_fits_the_cbuf() -> None:
    for i, o in ((F16, F16), (I8, I32)):
        prog = build_matmul(1500, 1536, 384, i, o, P, b=np.zeros((384, 1536), i.to_numpy()))
        for f in _cbuf_fields(prog):
            assert f["DATA_BANK"] + f["WEIGHT_BANK"] == P.cbuf_banks
            assert f["FC_DATA_BANK"] == 0


def test_output_cube_is_the_canonical_whole_cube() -> None:
    prog = build_matmul(37, 129, 47, F16, F16, P, b=np.zeros((47, 129), np.float16),
                        max_m=16, max_k=64, max_n=16)
    c = prog.buffer("c")
    assert (c.layout.height, c.layout.width, c.layout.channels, c.layout.c2) == (40, 1, 48, 8)
    assert c.shape == (37, 47) and c.bind == 0
    a = prog.buffer("a")
    assert (a.layout.height, a.layout.channels) == (40, 160) and a.shape == (37, 129)


def test_out_channel_align_matches_next_matmul_k() -> None:
    # cross-op-chaining.md: an fp16 output cube is the next matmul's input cube when N pads
    # like K does
    prog = build_matmul(8, 64, 48, F16, F16, P, b=np.zeros((48, 64), np.float16), out_channel_align=32)
    nxt = build_matmul(8, 48, 16, F16, F16, P, b=np.zeros((16, 48), np.float16))
    assert prog.buffer("c").layout == nxt.buffer("a").layout


def test_planner_rules() -> None:
    plan, lay = plan_matmul(1, 16384, 32, F16, F16, P)
    assert plan.kacc == "dpu" and lay.m_pad == P.ew_min_positions    # EW partial needs 12 rows
    plan, lay = plan_matmul(1, 16384, 32, I8, I32, P)
    assert plan.kacc == "host" and lay.m_pad == P.min_feature_rows
    plan, _ = plan_matmul(1023, 64, 32, F16, F16, P)
    assert all(r.in_rows <= P.max_feature_rows and r.out_rows % P.row_align == 0 for r in plan.rows)
    plan, _ = plan_matmul(64, 10240, 256, F16, F16, P)
    assert all(c.size % 32 == 0 for c in plan.channels)
    plan, _ = plan_matmul(8, 32, 8208, F16, F16, P)
    assert all(k.size <= P.cube_dim_limit for k in plan.kernels)


def test_planner_prices_k_partials_at_32_bits() -> None:
    """Every K step but the last writes an fp32 partial the next reads back (k-accumulation.md):
    4 bytes an element whatever the output's size. Priced at the fp16 output's 2 bytes, this
    wide matmul was cut into 3 K steps; priced right, re-reading its 64-row feature per N tile
    is cheaper and K stays in one step."""
    plan, _ = plan_matmul(64, 768, 2048, F16, F16, P)
    assert len(plan.channels) == 1 and plan.kacc == "none", plan


def test_planner_reads_the_profile() -> None:
    small = dataclasses.replace(P, name="small-cbuf", cbuf_banks=4)
    big, _ = plan_matmul(256, 256, 256, F16, F16, P)
    little, _ = plan_matmul(256, 256, 256, F16, F16, small)
    # the rule keeps the whole matmul in one task where the CBUF holds it (the cost model may
    # still split it to use more cores: tile_choice.py)
    assert big.choice.rule_plan.startswith("1 row tile(s) of <= 256 output rows, 1 x 256")
    assert little.tasks > 1


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(LoweringError, match="not supported"):
        build_matmul(4, 32, 16, DType.BF16, F16, P, b=np.zeros((16, 32)))
    with pytest.raises(LoweringError, match=r"B must be \[16, 32\]"):
        build_matmul(4, 32, 16, F16, F16, P, b=np.zeros((32, 16), np.float16))
    with pytest.raises(LoweringError, match="no tiling"):
        # B as an activation must be read in one K step; K this large cannot be
        build_matmul(4, 40000, 16, F16, F16, P)
    with pytest.raises(LoweringError, match="cast before lowering"):
        build_matmul(4, 32, 16, F16, F16, P, b=np.zeros((16, 32), np.float32))


def test_job_buffer_lists_keep_intra_kick_buffers_out_of_reads() -> None:
    # regcmd-task-model.md: a BO both read and written inside one kick must be listed as written
    # only, or the kernel completes the job without running it
    prog = build_matmul(16, 192, 32, F16, F16, P, b=np.zeros((32, 192), np.float16), max_k=64, max_n=16)
    for job in prog.jobs():
        assert set(job.writes) == {"c", "kacc"} and set(job.reads) == {"a", "b"}


@sim
@pytest.mark.parametrize("m, n, bit, once", [
    (96, 96, "DATA_REUSE", "a"),       # 3 M x 3 N tiles: one M tile per job, its A fetched once
    (192, 96, "WEIGHT_REUSE", "b"),    # 6 M x 3 N tiles: one N tile per job, its B fetched once
])
def test_tiles_sharing_an_operand_keep_it_in_the_cbuf(m: int, n: int, bit: str, once: str) -> None:
    k = 64
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    prog = build_matmul(m, k, n, F16, F16, P, b=b, max_m=32, max_n=32)
    jobs = prog.jobs()
    assert sum(kk.task_number for j in jobs for kk in j.kicks) == (m // 32) * (n // 32)
    assert len(jobs) < (m // 32) * (n // 32)
    fields = list(_cbuf_fields(prog))
    # every task but the first of its job keeps the shared operand, with one bank split per job
    assert sum(f[bit] for f in fields) == len(fields) - len(jobs)
    assert len({(f["DATA_BANK"], f["WEIGHT_BANK"]) for f in fields}) == 1
    # the declared DMA: the shared operand's bytes once in all, the other once per tile
    read = {"a": 0, "b": 0}
    for j in jobs:
        for kk in j.kicks:
            for acc in kk.reads:
                read[acc.buffer] += acc.nbytes
    other = "b" if once == "a" else "a"
    tiles_other = m // 32 if once == "a" else n // 32
    assert read[once] == (m if once == "a" else n) * k * 2
    assert read[other] == tiles_other * (n if once == "a" else m) * k * 2
    got, _ = run_matmul(prog, a)
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    T.check(got, ref, T.matmul_bound(a, b, fp16_out=True), "CBUF reuse")
