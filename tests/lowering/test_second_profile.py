"""A second chip profile is addable without touching the planners (issue 4, "The chip profile").

A derived test machine, "test-small", is registered for the duration of each test: the RK3588
with half its CBUF (6 banks instead of 12) and 2 cores instead of 3. It is a *subset* of the
real chip on purpose: the simulator models the 12-bank, 3-core RK3588, so a program planned for
the smaller machine must still run there (strict mode on) and give the numpy answer.

Expectations are computed here, not read from the planner: the CBUF bank need of every emitted
task is recomputed from the register fields the task writes (CNA_DATA_SIZE0/1, CNA_WEIGHT_SIZE0)
and the layout formulas (a feature row fills whole 64-byte entries, notes:
encodings/tile-layouts.md; int8 feature DMA needs one extra bank, notes:
encodings/cbuf-bank-slack.md; a bank is 32 KiB, notes: hardware-overview.md).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import rockjit.lowering.profile as profile_module
from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.conv import ConvSpec, conv_shape, build_conv2d
from rockjit.lowering.emitters.matmul import build_matmul, plan_matmul
from rockjit.lowering.profile import get_profile, profile_names, register_profile
from rockjit.lowering.tile_choice import plan_conv

from fuzz_graphs import half_rk3588
from op_lowering_sim import MISSING, run_conv, run_matmul

F16, F32, I8, I32 = DType.F16, DType.F32, DType.I8, DType.I32
sim = pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")

NAME = "test-small"
# Independent facts for the bank arithmetic below (not read from the profile under test).
BANK_BYTES = 32 * 1024     # notes: hardware-overview.md "CBUF 12 banks x 32 KB"
ENTRY_BYTES = 64           # notes: encodings/tile-layouts.md, DATA_ENTRIES counts 64-byte entries
SMALL_BANKS = 6            # the test machine's CBUF
SMALL_CORES = 2            # the test machine's core count
ESIZE = {F16: 2, I8: 1}    # bytes per input element (notes: datatypes.md)
SLACK = {F16: 0, I8: 1}    # notes: encodings/cbuf-bank-slack.md, int8 data_bank = fd_banks + 1
PRECISION_CODE = {2: F16, 0: I8}   # CNA_CONV_CON1.IN_PRECISION (notes: precision-field.md)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@pytest.fixture
def small():
    """Register the derived profile, hand it to the test, and unregister it afterwards so the
    process-wide registry is as it was."""
    prof = half_rk3588(NAME)
    assert NAME not in profile_names()
    register_profile(prof)
    try:
        yield get_profile(NAME)
    finally:
        profile_module._PROFILES.pop(NAME, None)
    assert NAME not in profile_names()


# ---- registry ------------------------------------------------------------------------------

def test_registered_profile_is_found_by_name(small) -> None:
    assert small.name == NAME and get_profile(NAME.upper()) is small
    assert small.cbuf_banks == SMALL_BANKS and small.cores == SMALL_CORES
    assert small.cbuf_bytes == SMALL_BANKS * BANK_BYTES
    assert get_profile("rk3588").cbuf_banks == 12      # the real chip is untouched


# ---- the planner's tiles fit the smaller CBUF ------------------------------------------------

def _task_banks(prog):
    """For every conv/matmul task of an OpLowering: (DATA_BANK, WEIGHT_BANK, feature banks
    needed, weight banks needed), the needs recomputed from the task's own geometry fields."""
    out = []
    for job in prog.jobs():
        for kick in job.kicks:
            # a chained kick holds several tasks, each its own word span
            for off, cnt in zip(kick.task_offsets, kick.task_counts):
                regs: dict[str, dict[str, int]] = {}
                for w in kick.words[off:off + cnt]:
                    op, value, roff = R.decode(w)
                    reg = R.lookup(op & 0xFF00, roff) if op & 0xFF == R.OP_WRITE else None
                    if reg is not None:
                        regs[reg.full_name] = reg.unpack(value)
                if "CNA_CBUF_CON0" in regs:
                    out.append(_need(regs))
    return out


def _need(regs: dict[str, dict[str, int]]) -> tuple[int, int, int, int]:
    dt = PRECISION_CODE[regs["CNA_CONV_CON1"]["IN_PRECISION"]]
    h, w = regs["CNA_DATA_SIZE0"]["DATAIN_HEIGHT"], regs["CNA_DATA_SIZE0"]["DATAIN_WIDTH"]
    c = regs["CNA_DATA_SIZE1"]["DATAIN_CHANNEL"]
    row = _ceil(w * c * ESIZE[dt], ENTRY_BYTES) * ENTRY_BYTES
    feature = _ceil(h * row, BANK_BYTES) + SLACK[dt]
    weight = _ceil(regs["CNA_WEIGHT_SIZE0"]["WEIGHT_BYTES"], BANK_BYTES)
    cb = regs["CNA_CBUF_CON0"]
    return cb["DATA_BANK"], cb["WEIGHT_BANK"], feature, weight


MATMULS = [  # (M, K, N, in, out): each needs more than 6 banks untiled (checked below)
    (200, 384, 320, F16, F16),
    (64, 4096, 48, F16, F16),       # K split on the DPU
    (150, 700, 96, I8, I32),        # int8: slack bank + host K sum
]


@pytest.mark.parametrize("m,k,n,i,o", MATMULS)
def test_matmul_tiles_fit_six_banks(small, m, k, n, i, o) -> None:
    # untiled, the padded problem does not fit the small CBUF (so the planner had to cut it)
    kp, npad, mp = _ceil(k, 32) * 32, _ceil(n, 16 if i == F16 else 32) * (16 if i == F16 else 32), \
        _ceil(max(m, 4), 4) * 4
    whole = _ceil(mp * _ceil(kp * ESIZE[i], ENTRY_BYTES) * ENTRY_BYTES, BANK_BYTES) + SLACK[i] + \
        _ceil(npad * kp * ESIZE[i], BANK_BYTES)
    assert whole > SMALL_BANKS
    prog = build_matmul(m, k, n, i, o, small, b=np.zeros((n, k), i.to_numpy()))
    tasks = _task_banks(prog)
    assert tasks, "no conv/matmul task emitted"
    for data, weight, need_f, need_w in tasks:
        assert data + weight == SMALL_BANKS          # the whole (small) CBUF is partitioned
        assert data >= need_f and weight >= need_w   # and each operand fits its share
    plan, _ = plan_matmul(m, k, n, i, o, small)
    assert plan.tasks == len(tasks)


CONVS = [  # (spec, caps): fp16 direct convs that exceed 6 banks untiled
    ConvSpec(1, 64, 40, 40, 96, 3, 3, padding=((1, 1), (1, 1))),
    ConvSpec(1, 128, 24, 20, 64, 3, 3, stride=(2, 2), padding=((1, 1), (1, 1))),
]


@pytest.mark.parametrize("spec", CONVS, ids=["3x3 p1", "3x3 s2 p1"])
def test_conv_tiles_fit_six_banks(small, spec) -> None:
    feature = spec.height * _ceil(spec.width * spec.in_c * 2, ENTRY_BYTES) * ENTRY_BYTES
    weights = spec.out_c * spec.in_c * spec.kh * spec.kw * 2
    assert _ceil(feature, BANK_BYTES) + _ceil(weights, BANK_BYTES) > SMALL_BANKS
    w = np.zeros((spec.out_c, spec.in_c, spec.kh, spec.kw), np.float16)
    prog = build_conv2d(spec, F16, F16, small, w, patchify="direct")
    tasks = _task_banks(prog)
    assert len(tasks) > 1
    for data, weight, need_f, need_w in tasks:
        assert data + weight == SMALL_BANKS
        assert data >= need_f and weight >= need_w
    # the same conv on the full chip is cut into no more tasks than on the half-CBUF one
    big = plan_conv(conv_shape(spec, F16, F16, get_profile("rk3588")), get_profile("rk3588"))
    assert big.tasks <= len(tasks)


# ---- the small-CBUF programs still compute the right thing on the (12-bank) simulator -------

@sim
@pytest.mark.parametrize("m,k,n,i,o", MATMULS)
def test_small_profile_matmul_on_simulator(small, m, k, n, i, o) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{m}x{k}x{n}{i.value}".encode()))
    if i == I8:
        a = rng.integers(-128, 127, (m, k), endpoint=True).astype(np.int8)
        b = rng.integers(-128, 127, (n, k), endpoint=True).astype(np.int8)
    else:
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((n, k)).astype(np.float16)
    prog = build_matmul(m, k, n, i, o, small, b=b)
    got, _ = run_matmul(prog, a)
    if i == I8:
        ref = a.astype(np.int64) @ b.T.astype(np.int64)
        assert got.dtype == np.int32 and np.array_equal(got, ref)
    else:
        ref = a.astype(np.float64) @ b.T.astype(np.float64)
        T.check(got, ref, T.matmul_bound(a, b, fp16_out=o == F16), f"{NAME} matmul {m}x{k}x{n}")


def _conv_ref(x: np.ndarray, w: np.ndarray, spec: ConvSpec) -> tuple[np.ndarray, np.ndarray]:
    """Direct NCHW conv in float64 via explicit patches, and its tolerance (a conv is the matmul
    patches . W^T, so tolerance.matmul_bound applies)."""
    (pt, pb), (pl, pr) = spec.padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = spec.out_h, spec.out_w
    sy, sx = spec.stride
    pat = np.empty((oh * ow, spec.in_c * spec.kh * spec.kw))
    for oy in range(oh):
        for ox in range(ow):
            pat[oy * ow + ox] = xp[0, :, oy * sy:oy * sy + spec.kh, ox * sx:ox * sx + spec.kw].reshape(-1)
    wm = w.reshape(spec.out_c, -1).astype(np.float64)
    ref = (pat @ wm.T).T.reshape(1, spec.out_c, oh, ow)
    bnd = T.matmul_bound(pat, wm).T.reshape(1, spec.out_c, oh, ow)
    return ref, bnd


@sim
@pytest.mark.parametrize("spec", CONVS, ids=["3x3 p1", "3x3 s2 p1"])
def test_small_profile_conv_on_simulator(small, spec) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, spec.in_c, spec.height, spec.width)).astype(np.float16)
    w = rng.standard_normal((spec.out_c, spec.in_c, spec.kh, spec.kw)).astype(np.float16)
    prog = build_conv2d(spec, F16, F16, small, w, patchify="direct")
    got, _ = run_conv(prog, x)
    ref, bnd = _conv_ref(x, w, spec)
    assert got.dtype == np.float16
    T.check(got, ref, bnd, f"{NAME} conv {spec}")


# ---- the pipeline: a compiled graph spreads its jobs over the profile's cores --------------

RK3588_CORES = 3    # notes: hardware-overview.md "Three cores"


@sim
def test_graph_jobs_spread_over_profile_cores(small) -> None:
    """The same graph on a 3-context simulator: planned for the RK3588 its jobs use 3 contexts,
    planned for the 2-core test machine only 2 (the count comes from the profile, not the
    device)."""
    import jax.numpy as jnp

    import rockjit
    from rockjit.lowering.pipeline import lower_graph
    from rockjit.lowering.loaded_graph import LoadedGraph
    from rockjit.runtime import SimDevice

    def fn(w, x):
        return jnp.tanh(x @ w)

    rng = np.random.default_rng(12)
    # 1536 fp16 columns x 256 K = 768 KiB of weights: N tiles on either CBUF, independent jobs
    w = (rng.standard_normal((256, 1536)) / 16).astype(np.float32)
    x = rng.standard_normal((40, 256)).astype(np.float32)
    c = rockjit.compile(fn, resident_argnums=0).compiled(w, x)
    ref = np.asarray(fn(w, x), np.float64)
    bound = T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref)
    stats = {}
    for name in ("rk3588", NAME):
        dev = SimDevice(cores=RK3588_CORES, strict=True)
        try:
            lowered = lower_graph(c.graph, c.params, profile=name)
            assert lowered.profile is get_profile(name)
            prog = LoadedGraph(lowered, dev)
            y, = prog.run([x])
            stats[name] = prog.stats()
        finally:
            dev.close()
        T.check(y, ref, bound, f"tanh(x @ w) planned for {name}")
    big, st = stats["rk3588"], stats[NAME]
    assert big["cores_used"] == RK3588_CORES
    assert st["jobs"] >= SMALL_CORES
    assert st["cores_used"] == SMALL_CORES
    assert all(st[f"jobs_core{k}"] > 0 for k in range(SMALL_CORES))
    assert st.get(f"jobs_core{SMALL_CORES}", 0) == 0


def test_compile_backend_names_the_profile(small) -> None:
    """``rockjit.compile(..., backend="sim:<chip>")`` compiles for that chip: the same graph
    spreads over 3 contexts as "sim" (the RK3588) and over the test machine's 2 as
    "sim:test-small", and both match JAX."""
    import jax.numpy as jnp

    import rockjit

    def fn(w, x):
        return jnp.tanh(x @ w)

    rng = np.random.default_rng(13)
    w = (rng.standard_normal((256, 1536)) / 16).astype(np.float32)
    x = rng.standard_normal((40, 256)).astype(np.float32)
    ref = np.asarray(fn(w, x), np.float64)
    cores = {}
    for backend in ("sim", f"sim:{NAME}"):
        f = rockjit.compile(fn, resident_argnums=0, backend=backend)
        y = np.asarray(f(w, x))
        c = f.compiled(w, x)
        T.check(y, ref, T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref),
                backend)
        cores[backend] = c.stats()["cores_used"]
    assert cores == {"sim": RK3588_CORES, f"sim:{NAME}": 2}
    with pytest.raises(Exception, match="no chip profile named 'rk9999'"):
        rockjit.compile(fn, resident_argnums=0, backend="sim:rk9999")
