"""The chip profile: every value sourced, the registry, and the RK3588 values cross-checked
against fields of the independent conformance programs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.lowering.profile import (RK3588, ChipProfile, ProfileError, get_profile,
                                      profile_names, register_profile)

from lowering_testutil import task_words

P = get_profile("rk3588")


def _fields(prefix: str) -> dict[str, dict[str, int]]:
    out = {}
    for w in task_words(prefix).tolist():
        op, value, offset = R.decode(w)
        reg = R.lookup(op & 0xFF00, offset) if op & 0xFF == R.OP_WRITE else None
        if reg is not None:
            out[reg.full_name] = reg.unpack(value)
    return out


def test_every_field_has_a_source() -> None:
    for f in dataclasses.fields(ChipProfile):
        if f.name != "sources":
            assert P.sources.get(f.name), f.name


def test_unsourced_profile_is_refused() -> None:
    bad = dataclasses.replace(RK3588, name="bad", sources={"name": "x"})
    with pytest.raises(ProfileError, match="no source for: encoding, cores"):
        register_profile(bad)
    assert "bad" not in profile_names()


def test_registry() -> None:
    assert get_profile() is get_profile("RK3588") is RK3588
    with pytest.raises(ProfileError, match="no chip profile named 'rk9999'; known: rk3588"):
        get_profile("rk9999")
    other = dataclasses.replace(RK3588, name="rk3588-test-clone")
    register_profile(other)
    try:
        assert get_profile("rk3588-test-clone").cbuf_banks == 12
        with pytest.raises(ProfileError, match="already registered"):
            register_profile(dataclasses.replace(RK3588, name="rk3588-test-clone", cores=2))
    finally:  # keep the process-wide registry as it was
        import rockjit.lowering.profile as profile_module
        profile_module._PROFILES.pop("rk3588-test-clone")


def test_dtype_refusals() -> None:
    with pytest.raises(ProfileError, match="no conv/matmul input datatype f32"):
        P.input(DType.F32)
    with pytest.raises(ProfileError, match="cannot write f16; its native outputs are: i32"):
        P.output(DType.I8, DType.F16)


def test_precision_codes_match_conformance_programs() -> None:
    f16, i8 = _fields("01"), _fields("03")
    assert f16["CNA_CONV_CON1"]["IN_PRECISION"] == P.input(DType.F16).precision
    assert i8["CNA_CONV_CON1"]["IN_PRECISION"] == P.input(DType.I8).precision
    assert f16["DPU_DATA_FORMAT"]["OUT_PRECISION"] == P.output(DType.F16, DType.F16).precision
    assert i8["DPU_DATA_FORMAT"]["OUT_PRECISION"] == P.output(DType.I8, DType.I32).precision
    assert f16["CORE_MISC_CFG"]["QD_EN"] == P.input(DType.F16).core_qd_en
    assert i8["CORE_MISC_CFG"]["QD_EN"] == P.input(DType.I8).core_qd_en


def test_write_out_geometry_matches_conformance_programs() -> None:
    for prefix, i, o, rows in (("01", DType.F16, DType.F16, 8), ("03", DType.I8, DType.I32, 8)):
        f = _fields(prefix)
        out = P.output(i, o)
        assert f["DPU_BS_OW_CFG"]["SIZE_E_0"] == out.size_e
        assert f["DPU_SURFACE_ADD"]["SURF_ADD"] == rows * out.surf_mult
        assert f["DPU_OUT_CVT_SCALE"]["FP32TOFP16_EN"] == int(out.fp32_to_fp16)
        # one output surface = rows x one 16-byte atom (field unit 16 bytes)
        assert f["DPU_DST_SURF_STRIDE"]["DST_SURF_STRIDE"] * 16 == rows * out.c2 * out.esize


def test_cbuf_split_matches_conformance_programs() -> None:
    # case 01: 1 KiB fp16 feature -> 1 bank; case 03: 512 B int8 feature -> 1 bank + 1 slack
    for prefix, dt, feature_bytes in (("01", DType.F16, 8 * 64 * 2), ("03", DType.I8, 8 * 64)):
        f = _fields(prefix)["CNA_CBUF_CON0"]
        banks = -(-feature_bytes // P.cbuf_bank_bytes) + P.input(dt).feature_bank_slack
        assert (f["DATA_BANK"], f["WEIGHT_BANK"]) == (banks, P.cbuf_banks - banks)
    # DATA_ENTRIES counts 64-byte entries of one feature row
    assert _fields("01")["CNA_CBUF_CON1"]["DATA_ENTRIES"] == 64 * 2 // P.cbuf_entry_bytes
    assert _fields("04")["CNA_CBUF_CON1"]["DATA_ENTRIES"] == 12 * 64 * 2 // P.cbuf_entry_bytes


def test_field_limits_follow_the_register_table() -> None:
    width = R.register("DPU_DATA_CUBE_WIDTH").field("WIDTH").width
    assert width == P.cube_dim_bits and P.cube_dim_limit == (1 << width) - 2
    grains = R.register("CNA_CONV_CON2").field("FEATURE_GRAINS").width
    assert P.max_feature_rows + 1 < 1 << grains
    assert P.max_feature_cols == (1 << R.register("CNA_DATA_SIZE0").field("DATAIN_WIDTH").width) - 1
    src = R.register("PC_BASE_ADDRESS").field("PC_SOURCE_ADDR")
    assert P.regcmd_align_bytes == 1 << src.lo


def test_profile_is_hashable_and_frozen() -> None:
    assert {P: 1}[get_profile()] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        P.cores = 2  # type: ignore[misc]
    assert np.dtype(P.input(DType.F16).dtype.to_numpy()) == np.float16
