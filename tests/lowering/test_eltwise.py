"""Element-wise emitters on the simulator (strict) vs numpy, and vs conformance 06 word by word."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.oracle import tolerance as T
from rockjit.lowering.emitters.eltwise import (EW_VIEW_CHANNELS, build_binary,
                                               build_binary_channel, build_binary_scalar,
                                               emit_conv_dpu)
from rockjit.lowering.emitters.eltwise_row import (build_binary_channel_runtime, build_binary_row,
                                                   build_row_scale_wide, LO_SCALE,
                                                   pack_row_vector, row_vector_layout)
from rockjit.lowering.layouts import output_layout, weight_layout
from rockjit.lowering.layouts import CubeLayout, feature_layout
from rockjit.lowering.regcmd import LoweringError, Reloc, link

from test_eltwise_harness import (P, assert_register_agreement, blob, case_addresses, needs_sim,
                                  run_program)

F16 = DType.F16
NP_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
          "min": np.minimum}


def cube(h: int, w: int, c: int) -> CubeLayout:
    return feature_layout(P, F16, h, w, c)


def pack_padded(lay: CubeLayout, x: np.ndarray, nbytes: int, rng) -> np.ndarray:
    """Pack x and put finite garbage in every padding lane and past the cube, so a leak of
    padding into the valid region would show."""
    raw = np.zeros(nbytes, np.uint8)
    raw[:lay.nbytes] = lay.pack(x)
    junk = rng.uniform(-100, 100, lay.padded_channels * lay.height * lay.width).astype(np.float16)
    full = lay.unpack(raw).copy()
    pad = np.zeros((lay.height, lay.width, lay.padded_channels), np.float16)
    pad[..., :lay.channels] = full
    if lay.padded_channels > lay.channels:
        pad[..., lay.channels:] = junk.reshape(pad.shape)[..., lay.channels:]
    padded = CubeLayout(lay.height, lay.width, lay.padded_channels, lay.c2, lay.dtype)
    raw[:lay.nbytes] = padded.pack(pad)
    tail = rng.uniform(-100, 100, (nbytes - lay.nbytes) // 2).astype(np.float16)
    raw[lay.nbytes:lay.nbytes + tail.nbytes] = tail.view(np.uint8)
    return raw


def data(shape, rng, lo=-8.0, hi=8.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float16)


def fp16_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return NP_OPS[op](a.astype(np.float64), b.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# conformance 06: the same shape, register by register
# ---------------------------------------------------------------------------------------------

# No field may differ from the foreign program (conformance 06 is A (x) B over [16, 32]): an
# entry here must say why.
DIFF_06: dict[tuple[str, str], str] = {}


def test_conformance_06_words_and_weights() -> None:
    """The conv-fed EW task (an identity 1x1 conv of A, the EW stage multiplying by B read
    through ERDMA): the per-row and per-channel one-pass forms' datapath (eltwise_row.py).
    build_binary itself runs the DPU-only two-operand EW now (no conv)."""
    w = weight_layout(P, F16, EW_VIEW_CHANNELS, EW_VIEW_CHANNELS).pack(
        np.eye(EW_VIEW_CHANNELS, dtype=np.float16))
    pitch = 16 * P.atom_bytes
    task = emit_conv_dpu("ew0", P, feature=Reloc("a"), rows=16, feature_surf_pitch=pitch,
                         weights=Reloc("weights"), kernels=EW_VIEW_CHANNELS, out=Reloc("out"),
                         out_channels=EW_VIEW_CHANNELS, out_surf_stride=pitch,
                         ew=("mul", Reloc("b")))
    kick = link([task], P, "regcmd", 0)
    assert kick.task_number == 1
    a = case_addresses("06")
    words = kick.array({"a": a["input"], "b": a["operand"], "out": a["output"],
                        "weights": a["weight"], "regcmd": a["regcmd"]})
    assert_register_agreement(words, "06", DIFF_06)
    assert w.tobytes() == blob("06", "weight")[:w.size]


def test_binary_runs_without_macs() -> None:
    """Two full cubes combine on the DPU-only two-operand EW: no CNA/CORE task, no MACs."""
    prog = build_binary("sub", cube(250, 1, 136), P)
    assert prog.macs == 0
    assert {b.name for b in prog.buffers} == {"a", "b", "out", "regcmd"}


# ---------------------------------------------------------------------------------------------
# the op table
# ---------------------------------------------------------------------------------------------

SHAPES = [
    (1, 1, 1),          # minimal
    (1, 1, 8),
    (1, 1, 45),         # one row, channels not a multiple of the atom
    (3, 1, 5),
    (16, 1, 32),        # conformance 06's shape
    (37, 1, 45),
    (7, 5, 19),         # a 2-D map
    (4, 3, 130),
    (250, 1, 136),      # several EW tasks
    (1500, 1, 384),     # Whisper T x d_model
]
FULL_RECORDS = [(op, s) for op in ("add", "sub", "mul", "max", "min") for s in SHAPES[:6]] + \
    [("add", SHAPES[6]), ("sub", SHAPES[7]), ("mul", SHAPES[8]), ("max", SHAPES[9]),
     ("add", (1500, 1, 1536))]


@needs_sim
@pytest.mark.parametrize("op,shape", FULL_RECORDS, ids=[f"{o}-{'x'.join(map(str, s))}" for o, s in FULL_RECORDS])
def test_binary_full(op, shape) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((op, shape)).encode()))
    lay = cube(*shape)
    a, b = data(shape, rng), data(shape, rng)
    prog = build_binary(op, lay, P)
    span = prog.buffer("a").nbytes
    mem = run_program(prog, {"a": pack_padded(lay, a, span, rng), "b": pack_padded(lay, b, span, rng)})
    got = lay.unpack(mem["out"])
    ref = fp16_ref(op, a, b)
    T.check(got, ref, T.elementwise_bound(ref, a, b, rounds=1), f"{op} {shape}")
    if op in ("max", "min", "sub"):
        assert np.array_equal(got, ref.astype(np.float16)), "max/min/sub round once: exact"
    if np.prod(shape) >= 250 * 136:
        assert prog.steps[0].jobs[0].kicks[0].task_number > 1


SCALAR_RECORDS = [
    ("add", 0.75, False, (1, 1, 1)), ("sub", 2.5, False, (3, 1, 5)), ("sub", 2.5, True, (37, 1, 45)),
    ("mul", -1.5, False, (1, 1, 45)), ("max", 0.0, False, (7, 5, 19)), ("min", 1.0, False, (16, 1, 32)),
    ("add", 0.1, False, (1500, 1, 384)), ("mul", 3.0, False, (600, 1, 136)),
]


@needs_sim
@pytest.mark.parametrize("op,c,rev,shape", SCALAR_RECORDS)
def test_binary_scalar(op, c, rev, shape) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((op, c, shape)).encode()))
    lay = cube(*shape)
    x = data(shape, rng)
    prog = build_binary_scalar(op, lay, c, reverse=rev, profile=P)
    mem = run_program(prog, {"x": pack_padded(lay, x, lay.nbytes, rng)})
    got = lay.unpack(mem["out"])
    cv = np.full(shape, np.float16(c))
    ref = fp16_ref(op, cv, x) if rev else fp16_ref(op, x, cv)
    T.check(got, ref, T.elementwise_bound(ref, x, cv, rounds=1), f"{op} scalar {shape}")


CHANNEL_RECORDS = [("add", (1, 1, 1), False), ("sub", (3, 1, 5), True), ("mul", (37, 1, 45), False),
                   ("max", (7, 5, 19), False), ("add", (1500, 1, 384), False)]


@needs_sim
@pytest.mark.parametrize("op,shape,rev", CHANNEL_RECORDS)
def test_binary_per_channel(op, shape, rev) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((op, shape, rev)).encode()))
    lay = cube(*shape)
    x, v = data(shape, rng), data((shape[2],), rng)
    prog = build_binary_channel(op, lay, v, reverse=rev, profile=P)
    mem = run_program(prog, {"x": pack_padded(lay, x, prog.buffer("x").nbytes, rng)})
    got = lay.unpack(mem["out"])
    vb = np.broadcast_to(v, shape)
    ref = fp16_ref(op, vb, x) if rev else fp16_ref(op, x, vb)
    T.check(got, ref, T.elementwise_bound(ref, x, vb, rounds=1), f"{op} per-channel {shape}")


ROW_RECORDS = [("mul", (4, 1, 8), False), ("sub", (37, 1, 45), False), ("sub", (13, 1, 20), True),
               ("add", (6, 3, 19), False), ("max", (1030, 1, 40), False), ("mul", (1500, 1, 384), False),
               # one pass over positions folded into lines (1024 = 512 x 2, 2048 = 512 x 4),
               # a score-sized cube in kernel tiles; 1031 is prime past a task's rows: two passes
               ("sub", (1024, 1, 1024), False), ("min", (2048, 1, 72), False),
               ("add", (1031, 1, 24), False), ("mul", (64, 1, 24), True)]
# which records take the one-pass form (emitters/eltwise_row._one_pass): no broadcast scratch
ONE_PASS = {(4, 1, 8): False, (37, 1, 45): True, (13, 1, 20): False, (6, 3, 19): True,
            (1030, 1, 40): True, (1500, 1, 384): True, (1024, 1, 1024): True, (2048, 1, 72): True,
            (1031, 1, 24): False, (64, 1, 24): True}


@needs_sim
@pytest.mark.parametrize("op,shape,rev", ROW_RECORDS)
def test_binary_per_row(op, shape, rev) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((op, shape, rev)).encode()))
    lay = cube(*shape)
    rows = shape[0] * shape[1]
    x, s = data(shape, rng), data((rows,), rng)
    prog = build_binary_row(op, lay, reverse=rev, profile=P)
    assert ("bcast" not in {b.name for b in prog.buffers}) == ONE_PASS[shape]
    s_raw = pack_row_vector(s, P)
    # only channel 0 of the row-vector cube is real input: garbage elsewhere must not matter
    junk = rng.uniform(-50, 50, s_raw.size // 2).astype(np.float16).view(np.uint8)
    mask = np.ones(s_raw.size, bool)
    for r in range(rows):
        mask[16 * r:16 * r + 2] = False
    s_raw = np.where(mask, junk, s_raw)
    mem = run_program(prog, {"x": pack_padded(lay, x, prog.buffer("x").nbytes, rng), "s": s_raw})
    got = lay.unpack(mem["out"])
    sb = np.broadcast_to(s.reshape(shape[0], shape[1], 1), shape)
    ref = fp16_ref(op, sb, x) if rev else fp16_ref(op, x, sb)
    T.check(got, ref, T.elementwise_bound(ref, x, sb, rounds=1), f"{op} per-row {shape}")


RUNTIME_CHANNEL_RECORDS = [("add", (512, 1, 512), False), ("sub", (37, 1, 45), False),
                           ("mul", (1024, 1, 72), True), ("max", (6, 3, 19), False),
                           ("min", (1500, 1, 24), True)]


@needs_sim
@pytest.mark.parametrize("op,shape,rev", RUNTIME_CHANNEL_RECORDS)
def test_binary_runtime_channel_vector(op, shape, rev) -> None:
    """x OP v[c] with v read at run time in the weight layout [C, 1] (an attention mask's
    per-key bias), one pass; padding lanes of x hold garbage that must not leak."""
    rng = np.random.default_rng(zlib.crc32(repr(("rtc", op, shape, rev)).encode()))
    lay = cube(*shape)
    x, v = data(shape, rng), data((shape[2],), rng)
    prog = build_binary_channel_runtime(op, lay, reverse=rev, profile=P)
    c_raw = weight_layout(P, F16, shape[2], 1).pack(v.astype(np.float16)[:, None])
    mem = run_program(prog, {"x": pack_padded(lay, x, prog.buffer("x").nbytes, rng), "c": c_raw})
    got = lay.unpack(mem["out"])
    vb = np.broadcast_to(v, shape)
    ref = fp16_ref(op, vb, x) if rev else fp16_ref(op, x, vb)
    T.check(got, ref, T.elementwise_bound(ref, x, vb, rounds=1), f"{op} runtime channel {shape}")


@needs_sim
@pytest.mark.parametrize("shape", [(1024, 1, 64), (1500, 1, 64), (36, 1, 24), (2048, 1, 136)])
def test_row_scale_of_an_fp32_cube(shape) -> None:
    """A deferred softmax's normalisation: x fp32 (past fp16's range: e @ v of a uniform row)
    times a per-row factor split hi + lo in two fp16 channels, rounded once into fp16."""
    rng = np.random.default_rng(zlib.crc32(repr(("wide", shape)).encode()))
    rows, _, c = shape
    lay = cube(*shape)
    s = rng.uniform(1.0, 1500.0, rows)                       # row sums of exp(x - max x)
    x = rng.standard_normal(shape) * s[:, None, None] * 300.0   # |x| up to ~1e6
    r = 1.0 / s
    hi = r.astype(np.float16)
    lo = ((r - hi.astype(np.float64)) / LO_SCALE).astype(np.float16)
    prog = build_row_scale_wide(lay, P)
    x_lay = output_layout(P, DType.F16, DType.F32, *shape)
    raw = np.zeros(prog.buffer("x").nbytes, np.uint8)
    raw[:x_lay.nbytes] = x_lay.pack(x.astype(np.float32))
    vec = np.zeros((rows, 1, 32), np.float16)
    vec[:, 0, 0], vec[:, 0, 1] = hi, lo
    mem = run_program(prog, {"x": raw, "s": row_vector_layout(rows, P).pack(vec)})
    got = lay.unpack(mem["out"]).astype(np.float64)
    want = x.astype(np.float32).astype(np.float64) * r[:, None, None]
    # one fp16 rounding of the product, plus the split factor's ~2^-22 and fp32's 2^-24
    bound = np.abs(want) * (2.0 ** -11 + 2.0 ** -20) + 2.0 ** -24
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    # the lo channel matters: the factor's fp16 rounding alone is off by up to 2^-12 relative
    assert np.max(np.abs(x * hi[:, None, None] - want) / np.abs(want)) > 2.0 ** -13


def test_runtime_channel_vector_refusals() -> None:
    with pytest.raises(LoweringError, match="v - x"):
        build_binary_channel_runtime("sub", cube(64, 1, 8), reverse=True, profile=P)
    with pytest.raises(LoweringError, match="no one-pass form"):
        build_binary_channel_runtime("add", cube(1031, 1, 8), profile=P)   # prime rows > 1022


def test_per_row_under_four_rows_is_refused_with_advice() -> None:
    with pytest.raises(LoweringError, match="scalar form"):
        build_binary_row("mul", cube(2, 1, 8), profile=P)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(LoweringError, match="not one of"):
        build_binary("div", cube(4, 1, 8), P)
    with pytest.raises(LoweringError, match="fp16"):
        build_binary("add", feature_layout(P, DType.I8, 4, 1, 16), P)
    with pytest.raises(LoweringError, match="shape"):
        build_binary_channel("add", cube(4, 1, 8), np.zeros(9, np.float16), profile=P)
