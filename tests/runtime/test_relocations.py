"""Relocations: an address word's value field becomes BO IOVA + offset at load."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.lowering.registers import decode, emit, emit_raw
from rockjit.runtime import ProgramBuilder, ProgramError, RocketDevice, SimDevice


@pytest.mark.parametrize("make", [lambda: SimDevice(), lambda: RocketDevice(fake=True)])
def test_patch_keeps_op_and_register(make, fake):
    with make() as dev:
        b = ProgramBuilder(dev)
        rc = b.add_bo(4096, "regcmd")
        pad = b.add_bo(3 * 4096, "io")  # pushes the target to a non-trivial address
        tgt = b.add_bo(8192, "arena")
        words = [emit_raw("DPU_DST_BASE_ADDR", 0xDEAD0000),
                 emit("CNA_CONV_CON1", PROC_PRECISION=2),
                 emit_raw("PPU_DST_BASE_ADDR", 0x5),     # low bits are a flag to keep
                 emit_raw("CNA_FEATURE_DATA_ADDR", 0)]
        b.write_words(rc, words)
        b.add_reloc(rc, 0, tgt, 0x40)
        b.add_reloc(rc, 2, tgt, 0x1000, keep_mask=0xF)
        b.add_reloc(rc, 3, tgt, 8191)
        prog = b.build()
        base = prog.bo_info(tgt).iova
        assert base != 0 or dev.kind == "rocket"
        got = [int(x) for x in np.frombuffer(prog.read(rc, 32), "<u8")]
        op0, _, reg0 = decode(words[0])
        assert decode(got[0]) == (op0, base + 0x40, reg0)
        assert got[1] == words[1]                        # untouched word
        op2, _, reg2 = decode(words[2])
        assert decode(got[2]) == (op2, (base + 0x1000) | 0x5, reg2)
        assert decode(got[3])[1] == base + 8191
        assert prog.stats()["relocs_applied"] == 3
        del pad


def test_relocation_refusals():
    with SimDevice(cores=2) as dev:
        b = ProgramBuilder(dev)
        rc = b.add_bo(64, "regcmd")
        tgt = b.add_bo(4096, "arena")
        far = b.add_bo(4096, "arena", core=1)
        with pytest.raises(ProgramError, match="outside BO"):
            b.add_reloc(rc, 0, tgt, 4096)
        with pytest.raises(ProgramError, match="IOVA space"):
            b.add_reloc(rc, 0, far, 0)
        with pytest.raises(ProgramError, match="not a regcmd BO"):
            b.add_reloc(tgt, 0, tgt, 0)
        with pytest.raises(ProgramError, match="outside BO"):
            b.add_reloc(rc, 8, tgt, 0)   # word 8 is bytes 64..72 of a 64-byte BO
        # a relocation onto a word that is not a register write (here: still zero)
        b.add_reloc(rc, 1, tgt, 0)
        with pytest.raises(ProgramError, match="not a register write"):
            b.build()


def test_keep_mask_needs_an_aligned_address():
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        rc = b.add_bo(64, "regcmd")
        tgt = b.add_bo(4096, "arena")
        b.write_words(rc, [emit_raw("PPU_DST_BASE_ADDR", 0x3)])
        b.add_reloc(rc, 0, tgt, 0x8, keep_mask=0xF)
        with pytest.raises(ProgramError, match="keep_mask"):
            b.build()
