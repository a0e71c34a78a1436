"""The DPU's stages as data: what a task (task.py, flying.py) does to a value on its way out.

Sources: [conf] conformance 01-09 programs; [lut] [ew] notes encodings/dpu-lut-activation.md;
[kacc] encodings/k-accumulation.md; [rq] encodings/out-cvt-converter.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..regcmd import TaskBuilder

# DMA burst length code 15 on every DPU / DPU_RDMA / CNA read and write: the value of every
# conformance program (01-09) and of Mesa's emitter.
BURST_LEN = 15
# DPU_FEATURE_MODE_CFG.OUTPUT_MODE 2 (write the result to memory): every conformance program
# with a DPU (01-06, 09); no source documents the other codes.
OUTPUT_TO_MEMORY = 2


@dataclass(frozen=True)
class SdpStage:
    """Operands of the BS or BN stage (float path). ``alu`` = (algo, fp32 operand bits), algo
    0 max / 1 min / 2 sum [ew "Max / Min"]; ``mul`` = fp16 operand bits. ``alu_src`` 1: the ALU
    operand is a per-channel vector read from memory (BRDMA for BS) instead of the register."""

    alu: tuple[int, int] | None = None
    mul: int | None = None
    alu_src: int = 0


@dataclass(frozen=True)
class OutCvt:
    """DPU OUT_CVT. Identity for plain results (narrowing fp32 -> fp16 when the output format
    says so and ``narrow``); the affine float form out = (v + offset) * 2^-minus_exp * scale
    (CVT_TYPE 1) after a LUT [lut "Signed / wide output -- the affine OUT_CVT"]; the int8
    requant round((x * scale) >> shift) + offset [rq]."""

    offset: int = 0
    scale: int = 1
    minus_exp: int = 0
    affine: bool = False
    shift: int = 0
    round_away: bool = False
    narrow: bool = True


@dataclass(frozen=True)
class EwStage:
    """The EW stage combining the value with an ERDMA operand cube: DPU_EW_CFG's fields and the
    operand's element bytes."""

    cfg: tuple[tuple[str, int], ...]
    esize: int = 2


@dataclass(frozen=True)
class LutTables:
    """LUT tables and geometry (built by lut_tables.py)."""

    le: tuple[int, ...]
    lo: tuple[int, ...]
    le_start: int
    le_end: int
    lo_start: int
    lo_end: int
    le_select: int
    lo_select: int
    cfg: Mapping[str, int] = field(default_factory=lambda: {
        # the LE/LO hybrid: HYBRID_PRIORITY | OFLOW_PRIORITY | LO_LE_MUX=2 = 0x68 [lut][conf 05]
        "LUT_HYBRID_PRIORITY": 1, "LUT_OFLOW_PRIORITY": 1, "LUT_LO_LE_MUX": 2})
    # out-of-table slopes: 0 = the end entry is held (documented clamp)
    le_slope: tuple[int, int, int, int] = (0, 0, 0, 0)   # uflow scale, oflow scale, shifts
    lo_slope: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __hash__(self) -> int:   # a task template's cache key (``cfg`` is a mapping)
        return hash((self.le, self.lo, self.le_start, self.le_end, self.lo_start, self.lo_end,
                     self.le_select, self.lo_select, tuple(sorted(self.cfg.items())),
                     self.le_slope, self.lo_slope))


def upload_lut(t: TaskBuilder, lut: LutTables) -> None:
    """Both tables through the access port: ACCESS_CFG (write, table id, address 0) then one
    ACCESS_DATA word per entry, the address auto-incrementing [lut][conf 05 words 2/516]."""
    for table_id, entries in ((0, lut.le), (1, lut.lo)):
        t.write("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table_id, LUT_ADDR=0)
        t.write_each("DPU_LUT_ACCESS_DATA", "LUT_ACCESS_DATA", entries)


# DPU_EW_CFG of each binary op on the conv-main EW datapath: per-pixel operand (EW_DATA_MODE
# 1), operand from memory (EW_OP_SRC 1), ReLU and LUT bypassed. mul = EW_OP_TYPE 1 with the
# operand converter bypassed (0x108003C4); the ALU ops differ only in EW_ALU_ALGO, 0 max /
# 1 min / 2 sum (0x108002C0 / 0x108102C0 / 0x108202C0) [ew "Two-operand EW", "Max / Min"; kacc].
# EDATA_SIZE: code 2 = 16-bit operand (fp16), 3 = 32-bit (fp32 partials: "a 32-bit fp32 EW
# operand read works (EDATA_SIZE(3))", k-accumulation.md).
_EW_DATA_SIZE = {2: 2, 4: 3}
_EW_OP = {"add": {"EW_ALU_ALGO": 2}, "max": {"EW_ALU_ALGO": 0}, "min": {"EW_ALU_ALGO": 1},
          "mul": {"EW_OP_TYPE": 1, "EW_OP_CVT_BYPASS": 1}}


def ew_stage(op: str, esize: int = 2) -> EwStage:
    """The EW stage computing ``value OP operand`` for op add / max / min / mul."""
    cfg = {"EW_DATA_MODE": 1, "EDATA_SIZE": _EW_DATA_SIZE[esize], "EW_OP_SRC": 1,
           "EW_LUT_BYPASS": 1, "EW_RELU_BYPASS": 1, **_EW_OP[op]}
    return EwStage(tuple(sorted(cfg.items())), esize)


def ew_sum(esize: int) -> EwStage:
    """K accumulation: the conv result plus the previous partial [kacc]."""
    return ew_stage("add", esize)
