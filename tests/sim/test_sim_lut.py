"""DPU LUT (sim B): the LE/LO hybrid tables of conformance 05, tables built here (tanh,
HardSwish), the documented interpolation/extrapolation/mux rules, and the LUT hazards.

Case 05 layout (regcmd words): 2 = LUT_ACCESS_CFG (LE), 3..515 = 513 LE entries,
516 = LUT_ACCESS_CFG (LO), 517..1029 = 513 LO entries. Input/output: 128 fp16 values, flat."""
from __future__ import annotations

import numpy as np

from rockjit.lowering.registers import emit
from test_dpu_helpers import (RJ_EHAZARD, RJ_EUNSUPP, blob, f32_bits, insert_before_trailer, run_case,
                              set_fields, set_raw)

N = 128
SCALE = 2596.0            # BN_MUL_OPERAND 0x6912 = fp16(2596): x -> table index
STEP = 32                 # LUT_INFO index select 5 -> 2^5 index units per segment
LE0, LO0 = 3, 517         # first LE / LO data word


def x_in() -> np.ndarray:
    return np.frombuffer(blob("05", "input")[:2 * N], dtype=np.float16).astype(np.float64)


def y_out(r) -> np.ndarray:
    return np.frombuffer(bytes(r.buf("output")[:2 * N]), dtype=np.float16).astype(np.float64)


def tables_from(f, lo: float, span: float, qmin: int = 1):
    """Unsigned Q0.15 tables of g = (f(x) - lo) / span on the case-05 grid (notes:
    dpu-lut-activation.md "The two tables", "Bias trick")."""
    step_x = STEP / SCALE
    i = np.arange(513)
    le = f(-(512 - i) * step_x)
    lo_ = f(i * step_x)
    q = lambda y: np.clip(np.round((y - lo) / span * 32768), qmin, 32767).astype(np.int64)  # noqa: E731
    return q(le), q(lo_)


def with_tables(words, le, lo):
    for k in range(513):
        words[LE0 + k] = np.uint64(emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(le[k]) & 0xFFFF))
        words[LO0 + k] = np.uint64(emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(lo[k]) & 0xFFFF))
    return words


def uploaded_tables():
    w = np.fromfile("/work/shared/conformance/05_lut_sigmoid_fp16/program/j0_t000.regcmd", dtype="<u8")
    v = ((w >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.int64)
    return v[LE0:LE0 + 513], v[LO0:LO0 + 513]


def test_case05_sigmoid_within_tolerance():
    r = run_case("05")
    assert r.rc == 0, r.msg
    x = x_in()
    assert np.max(np.abs(y_out(r) - 1 / (1 + np.exp(-x)))) <= 0.005


def test_documented_interpolation_and_extrapolation():
    """Inside the tables: linear interpolation between entries; below LE_START: LE[0] +
    (X - START) * 23107 / 2^22; above LO_END: LO[512] (LO slope 0); output (q + 1) * 2^-15
    (notes: dpu-lut-activation.md). Reference written here in numpy."""
    le, lo = uploaded_tables()
    x = x_in()
    idx = x.astype(np.float32) * np.float32(SCALE)
    grid_le = -16384 + STEP * np.arange(513)
    grid_lo = STEP * np.arange(513)
    q = np.where(idx < 0, np.interp(idx, grid_le, le), np.interp(idx, grid_lo, lo))
    q = np.where(idx < -16384, le[0] + (idx + 16384) * 23107 / 2 ** 22, q)
    q = np.where(idx > 16384, lo[512], q)
    want = (q + 1) / 32768
    r = run_case("05")
    assert r.rc == 0, r.msg
    assert np.max(np.abs(y_out(r) - want)) <= 3e-4  # fp16 rounding of values <= 1


def test_tanh_table_built_in_test():
    """tanh with the signed decode: table (tanh + 1) / 2, OUT_CVT_OFFSET = -16384, MINUS_EXP = 14
    (notes: dpu-lut-activation.md "Signed / wide output"); entries floored to q >= 1."""
    le, lo = tables_from(np.tanh, -1.0, 2.0)

    def mut(j, t, w):
        w = with_tables(w, le, lo)
        w = set_raw(w, "DPU_OUT_CVT_OFFSET", -16384)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", MINUS_EXP=14)
    r = run_case("05", mutate=mut)
    assert r.rc == 0, r.msg
    assert np.max(np.abs(y_out(r) - np.tanh(x_in()))) <= 0.005


def test_mux_follows_sign_of_x_not_the_biased_index():
    """With a BN ALU bias the LE/LO choice still follows sign(x*BN_MUL) (notes:
    dpu-lut-activation.md "the mux selects on sign(x)"): x in (-4096/2596, 0) lands past LE_END
    and reads LE[512] (LE overflow slope 0) instead of the LO table."""
    bias = 4096.0
    r = run_case("05", mutate=lambda j, t, w: set_raw(w, "DPU_BN_ALU_CFG", f32_bits(bias)))
    assert r.rc == 0, r.msg
    le, lo = uploaded_tables()
    x = x_in()
    idx = x * SCALE + bias
    grid = STEP * np.arange(513)
    q_le = np.where(idx > 0, le[512], np.interp(idx, grid - 16384, le))
    q_le = np.where(idx < -16384, le[0] + (idx + 16384) * 23107 / 2 ** 22, q_le)
    q_lo = np.where(idx > 16384, lo[512], np.interp(idx, grid, lo))
    want = (np.where(x < 0, q_le, q_lo) + 1) / 32768
    assert ((x < 0) & (idx > 0)).sum() >= 10
    assert np.max(np.abs(y_out(r) - want)) <= 3e-4


def test_lut_read_mode_data_write_keeps_the_table():
    """Regression: a LUT_ACCESS_DATA write while LUT_ACCESS_TYPE = 0 (Mesa's plain-conv program
    writes ACCESS_CFG = 0, ACCESS_DATA = 0) must not store an entry; storing it would zero LE[0]."""
    extra = [emit("DPU_LUT_ACCESS_CFG"), emit("DPU_LUT_ACCESS_DATA")]
    r = run_case("05", mutate=lambda j, t, w: insert_before_trailer(w, extra))
    assert r.rc == 0, r.msg
    assert np.max(np.abs(y_out(r) - 1 / (1 + np.exp(-x_in())))) <= 0.005


def test_lut_upload_past_513_entries_is_refused():
    extra = [emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=5)]
    r = run_case("05", mutate=lambda j, t, w: insert_before_trailer(w, extra))
    assert r.rc == RJ_EUNSUPP and "DPU_LUT_ACCESS_DATA" in r.msg and "513" in r.msg, r.msg


# ---- hazards --------------------------------------------------------------------------------------

def test_quirk4_zero_entry_is_a_hazard():
    def mut(j, t, w):
        w[LE0 + 100] = np.uint64(emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=0))
        return w
    r = run_case("05", mutate=mut)
    assert r.rc == RJ_EHAZARD and "QUIRK 4" in r.msg and "entry 100" in r.msg, r.msg
    assert run_case("05", mutate=mut, strict=False).rc == 0


def test_quirk2_signed_decode_near_zero_is_a_hazard():
    le, lo = tables_from(np.tanh, -1.0, 2.0)

    def mut(j, t, w):
        w = with_tables(w, le, lo)
        w = set_raw(w, "DPU_OUT_CVT_OFFSET", -16384)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", MINUS_EXP=14)

    def zero_input(mem):
        mem["input"][1][10:12] = np.float16(0.0).tobytes()
    r = run_case("05", mutate=mut, patch=zero_input)
    assert r.rc == RJ_EHAZARD and "QUIRK 2" in r.msg and "element 5" in r.msg, r.msg
    # sigmoid decodes with a non-negative offset: x = 0 is clean there (same notes section)
    r = run_case("05", patch=zero_input)
    assert r.rc == 0, r.msg
    assert abs(y_out(r)[5] - 0.5) <= 0.005


def test_quirk1_flat_in_table_run_is_a_hazard():
    """HardSwish over a wide table: exactly flat for x <= -3, an in-table flat run that
    mis-toggles the mux on hardware (notes: dpu-lut-activation.md, QUIRK 1)."""
    hswish = lambda v: v * np.clip(v + 3, 0, 6) / 6  # noqa: E731
    le, lo = tables_from(hswish, -0.375, 8.0)

    def mut(j, t, w):
        w = with_tables(w, le, lo)
        w = set_raw(w, "DPU_OUT_CVT_OFFSET", -1536)  # round(-0.375 * 32768 / 8)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", MINUS_EXP=12)
    r = run_case("05", mutate=mut)
    assert r.rc == RJ_EHAZARD and "QUIRK 1" in r.msg, r.msg
    r = run_case("05", mutate=mut, strict=False)
    assert r.rc == 0, r.msg
    x = x_in()
    inside = np.abs(x) <= 6.3
    assert np.max(np.abs(y_out(r) - hswish(x))[inside]) <= 0.01


def test_quirk3_flying_max_width_is_a_hazard():
    r = run_case("05", mutate=lambda j, t, w: set_fields(w, "DPU_DATA_CUBE_WIDTH", WIDTH=8191))
    assert r.rc == RJ_EHAZARD and "QUIRK 3" in r.msg, r.msg


def test_flying_two_operand_ew_is_a_hazard():
    """An ERDMA operand with a flying main feed reads 0 on hardware (notes:
    dpu-lut-activation.md "Two-operand EW")."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_EW_CFG", 0x108003C4)
        return set_raw(w, "DPU_RDMA_RDMA_ERDMA_CFG", 0x40000008)
    r = run_case("05", mutate=mut)
    assert r.rc == RJ_EHAZARD and "flying two-operand EW" in r.msg, r.msg


def test_other_lut_cfg_is_refused():
    r = run_case("05", mutate=lambda j, t, w: set_raw(w, "DPU_LUT_CFG", 0x08))
    assert r.rc == RJ_EUNSUPP and "DPU_LUT_CFG" in r.msg, r.msg


def test_lut_without_an_upload_is_refused():
    """Running the LUT on a fresh simulator whose tables were never uploaded is a program error."""
    r = run_case("05", mutate=lambda j, t, w: np.concatenate([w[:2], w[1030:]]))
    assert r.rc == -1 and "no LE table was ever uploaded" in r.msg, r.msg
