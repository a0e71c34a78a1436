"""The register table and emit() agree with words taken from the independent conformance
programs (written by another generator, not by us)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rockjit.lowering.registers import RegisterError, decode, emit, emit_raw, lookup, register

CONF = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"


def test_emit_known_words() -> None:
    # Words as they stand in conformance case 01 (matmul fp16), decoded by hand from the
    # register database: DPU S_POINTER arms the ping-pong pointer; CNA_CONV_CON1 fp16/fp16.
    assert emit("DPU_S_POINTER", POINTER_PP_EN=1, EXECUTER_PP_EN=1, POINTER_PP_MODE=1) \
        == 0x10010000000E4004
    assert emit("CNA_CONV_CON1", PROC_PRECISION=2, IN_PRECISION=2) == 0x020100000120100C
    assert emit_raw("DPU_DST_BASE_ADDR", 0x01008000) == 0x1001010080004020


def test_field_overflow_is_refused() -> None:
    with pytest.raises(RegisterError, match="does not fit"):
        emit("CNA_CONV_CON1", CONV_MODE=16)
    with pytest.raises(RegisterError, match="no field"):
        emit("CNA_CONV_CON1", NOT_A_FIELD=1)
    with pytest.raises(RegisterError, match="unknown register"):
        register("CNA_NOPE")


@pytest.mark.skipif(not CONF.exists(), reason="../shared/conformance is not beside the checkout")
def test_every_conformance_write_names_a_known_register() -> None:
    seen = 0
    for f in sorted(CONF.glob("*/program/*.regcmd")):
        for w in np.fromfile(f, "<u8").tolist():
            op, value, offset = decode(w)
            if op & 0xFF != 0x01 or op == 0x0101 and offset == 0x0014:
                continue
            reg = lookup(op & 0xFF00, offset)
            assert reg is not None, f"{f.name}: word {w:#018x} writes an unknown register"
            assert reg.pack(**reg.unpack(value)) | (value & ~sum(
                fl.mask for fl in reg.fields) & 0xFFFFFFFF) == value
            seen += 1
    assert seen > 500
