"""DPU LUT (sim B): the LE/LO hybrid tables of conformance 05, tables built here (tanh,
HardSwish), the documented interpolation/extrapolation rules, NVDLA's table choice, and the LUT hazards.

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


def nvdla_hybrid(idx, le, lo, cfg=0x68, le_geom=(-16384, 0), lo_geom=(0, 16384),
                 le_slope=(23107, 22, 0, 0), lo_slope=(0, 0, 0, 0)):
    """Independent numpy model of NVDLA's hybrid LUT (nvdla/hw cmod lookup_lut): both tables
    look the index up (x <= START underflow, x >= END overflow, else interpolate); one hit ->
    that table; both under -> UFLOW_PRIORITY, both over -> OFLOW_PRIORITY, else
    HYBRID_PRIORITY (0 = LE, 1 = LO). Slopes are (uflow scale, uflow shift, oflow scale,
    oflow shift)."""
    idx = np.asarray(idx, np.float64)
    res, reg = [], []
    for tab, (start, end), (us, ush, os_, osh) in ((le, le_geom, le_slope), (lo, lo_geom, lo_slope)):
        grid = np.linspace(start, end, 513)
        v = np.interp(idx, grid, tab)
        v = np.where(idx <= start, tab[0] + (idx - start) * us / 2.0 ** ush, v)
        v = np.where(idx >= end, tab[512] + (idx - end) * os_ / 2.0 ** osh, v)
        res.append(v)
        reg.append(np.where(idx <= start, -1, np.where(idx >= end, 1, 0)))
    (vle, vlo), (rle, rlo) = res, reg
    uflow, oflow, hybrid = (cfg >> 4) & 1, (cfg >> 5) & 1, (cfg >> 6) & 1
    use_lo = np.where((rle < 0) & (rlo < 0), uflow,
                      np.where((rle > 0) & (rlo > 0), oflow,
                               np.where((rle == 0) != (rlo == 0), rlo == 0, hybrid)))
    return np.where(use_lo.astype(bool), vlo, vle)


def test_table_is_chosen_from_the_biased_index():
    """With a BN ALU bias the table follows the index (after the bias), as the hybrid
    priorities decide, not sign(x): x in (-4096/2596, 0) now has index > 0 and reads LO.
    Regression: the simulator used to pick LE there from sign(x) (issue 12)."""
    bias = 4096.0
    r = run_case("05", mutate=lambda j, t, w: set_raw(w, "DPU_BN_ALU_CFG", f32_bits(bias)))
    assert r.rc == 0, r.msg
    le, lo = uploaded_tables()
    x = x_in()
    idx = x.astype(np.float32) * np.float32(SCALE) + np.float32(bias)
    want = (nvdla_hybrid(idx, le, lo) + 1) / 32768
    assert ((x < 0) & (idx > 0)).sum() >= 10
    assert np.max(np.abs(y_out(r) - want)) <= 3e-4
    # the crossing inputs read LO's start, i.e. sigmoid of the *index*, not the LE tail
    cross = (x < 0) & (idx > 0)
    assert np.all(y_out(r)[cross] >= 0.5 - 1e-3)


def test_lut_priorities_choose_the_table():
    """LUT_CFG's three NVDLA priorities (bits 4..6, 0 = LE / 1 = LO): with all three LE
    (0x08), an index past LO_END (both tables overflow) extrapolates from LE[512] with LE's
    overflow slope, and index 0 (LE overflows, LO underflows) reads LE."""
    x = x_in()
    le, lo = uploaded_tables()
    for cfg in (0x08, 0x18, 0x28, 0x48, 0x78):
        def mut(j, t, w, cfg=cfg):
            w = set_raw(w, "DPU_LUT_CFG", cfg)
            return set_raw(w, "DPU_LUT_LE_SLOPE_SCALE", (300 << 16) | 23107)
        r = run_case("05", mutate=mut)
        assert r.rc == 0, (hex(cfg), r.msg)
        idx = x.astype(np.float32) * np.float32(SCALE)
        want = (nvdla_hybrid(idx, le, lo, cfg=cfg, le_slope=(23107, 22, 300, 0)) + 1) / 32768
        got = y_out(r)
        ok = np.abs(want) < 60000   # fp16 range of the output
        assert np.allclose(got[ok], want[ok], rtol=1e-3, atol=3e-4), hex(cfg)
    # the all-LE setting really differs from 0x68 above LO_END (LE's overflow slope 300)
    assert (x * SCALE > 16384).sum() >= 5


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

def test_quirk4_zero_entry_in_an_unbiased_table_computes():
    """QUIRK 4 is documented on the BN-ALU-biased (shifted) path only; unbiased hybrid tables
    with read zero entries (HardSigmoid's LE tail) run correctly on silicon, so a zero entry
    read here is computed as 0, not refused (issue 12)."""
    x = x_in()
    le, lo = uploaded_tables()
    le = le.copy()
    le[300:340] = 0   # 40 zero entries (a run shorter than the QUIRK 1 heuristic's 64)

    def mut(j, t, w):
        return with_tables(w, le, lo)
    r = run_case("05", mutate=mut)
    assert r.rc == 0, r.msg
    idx = x.astype(np.float32) * np.float32(SCALE)
    hit = (idx >= -16384 + 300 * STEP) & (idx <= -16384 + 339 * STEP)
    assert hit.sum() >= 1
    want = (nvdla_hybrid(idx, le, lo) + 1) / 32768
    assert np.max(np.abs(y_out(r) - want)) <= 3e-4
    assert np.all(y_out(r)[hit] <= 1e-4)


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


def test_flying_two_operand_ew_outside_the_measured_program_is_refused():
    """A DPU-only EW operand is modelled only for the measured program (notes:
    sdp-stage-precision.md "A two-buffer EW op needs no conv main feed": COMB_USE 4, ORIG_CHANNEL =
    CHANNEL, the converter bypass by op); case 05 keeps COMB_USE 0, which no source measured.
    The modelled program and its hazards: test_per_channel_operands.py."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_EW_CFG", 0x108003C4)
        return set_raw(w, "DPU_RDMA_RDMA_ERDMA_CFG", 0x40000008)
    r = run_case("05", mutate=mut)
    assert r.rc == RJ_EUNSUPP and "only the measured program" in r.msg, r.msg


def test_other_lut_cfg_is_refused():
    """LO_LE_MUX other than 2 and EXPAND_EN / ROAD_SEL / CAL_SEL are undocumented."""
    for cfg in (0x6C, 0x64, 0x69, 0x6A, 0xE8):
        r = run_case("05", mutate=lambda j, t, w, cfg=cfg: set_raw(w, "DPU_LUT_CFG", cfg))
        assert r.rc == RJ_EUNSUPP and "DPU_LUT_CFG" in r.msg, (hex(cfg), r.msg)


def test_lut_without_an_upload_is_refused():
    """Running the LUT on a fresh simulator whose tables were never uploaded is a program error."""
    r = run_case("05", mutate=lambda j, t, w: np.concatenate([w[:2], w[1030:]]))
    assert r.rc == -1 and "no LE table was ever uploaded" in r.msg, r.msg


def test_hardsigmoid_unfloored_table_runs():
    """rocket-userspace's HardSigmoid (build_lut_unit: q clamped to [0, 32767], no floor) on the
    case-05 geometry: ~270 LE entries of exactly 0 (x <= -3), read, and a run of 32767 (x >= 3).
    It runs on silicon to max_abs 0.00049 (notes: dpu-lut-activation.md), so neither QUIRK 4
    (unbiased index) nor QUIRK 1 (a partial zero run) refuses it (issue 12)."""
    hsig = lambda v: np.clip(v / 6 + 0.5, 0, 1)  # noqa: E731
    le, lo = tables_from(hsig, 0.0, 1.0, qmin=0)
    assert (le == 0).sum() > 200
    r = run_case("05", mutate=lambda j, t, w: with_tables(w, le, lo))
    assert r.rc == 0, r.msg
    x = x_in()
    inside = np.abs(x) * SCALE <= 16384
    assert np.max(np.abs(y_out(r) - hsig(x))[inside]) <= 2e-3


def test_gelu_gate_and_leaky_relu_tables_with_read_zero_entries_run():
    """Unbiased hybrid tables whose zero entries are read: the GELU gate Phi (build_lut_unit clamps
    its deep LE tail to q = 0; 31 of case 05's inputs read it) and LeakyReLU on the natural LE/LO
    split (LE[0] = 0 at x = -R with out_lo = -R*alpha, the base every x < -R extrapolates from),
    both run correctly on silicon (notes: dpu-lut-activation.md "GELU",
    "Mitigation"), so neither QUIRK 4 nor QUIRK 1 refuses them (issue 12). Inputs stay away from
    x = 0, where LeakyReLU's signed decode meets QUIRK 2."""
    from scipy.special import ndtr
    x = x_in()
    keep_off_zero = lambda mem: None  # noqa: E731
    if np.any(np.abs(x) < 0.01):
        def keep_off_zero(mem):
            v = np.frombuffer(bytes(mem["input"][1][:2 * N]), np.float16).copy()
            v[np.abs(v.astype(np.float64)) < 0.01] = np.float16(0.5)
            mem["input"][1][:2 * N] = v.tobytes()
    le, lo = tables_from(ndtr, 0.0, 1.0, qmin=0)
    assert (le == 0).sum() > 64
    r = run_case("05", mutate=lambda j, t, w: with_tables(w, le, lo), patch=keep_off_zero)
    assert r.rc == 0, r.msg
    xs = np.frombuffer(bytes(r.buf("input")[:2 * N]), np.float16).astype(np.float64)
    inside = np.abs(xs) * SCALE <= 16384
    assert np.max(np.abs(y_out(r) - ndtr(xs))[inside]) <= 2e-3

    alpha, R = 0.1, 16384 / SCALE
    leaky = lambda v: np.where(v >= 0, v, alpha * v)  # noqa: E731
    out_lo, span = -alpha * R, 8.0
    le, lo = tables_from(leaky, out_lo, span, qmin=0)
    assert le[0] == 0

    def mut(j, t, w):
        w = with_tables(w, le, lo)
        w = set_raw(w, "DPU_OUT_CVT_OFFSET", int(round(out_lo * 32768 / span)) & 0xFFFFFFFF)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", MINUS_EXP=12)
    r = run_case("05", mutate=mut, patch=keep_off_zero)
    assert r.rc == 0, r.msg
    assert np.max(np.abs(y_out(r) - leaky(xs))[inside]) <= 5e-3
