"""The DPU-only ("flying") task: DPU_RDMA's MRDMA streams a flat fp16 vector through the DPU
stages (task.py's DPU block) without CNA/CORE -- conformance 05's framing [lut "Pipeline",
"Framing"]: cube width = positions, height 1, 8 channels, one surface.

Sources: [lut] notes encodings/dpu-lut-activation.md; [conf] conformance 05.
"""
from __future__ import annotations

from ...ir.types import DType
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, TaskBuilder, EmittedTask, TaskTemplate, template_of
from .dpu_stages import LutTables, OutCvt, SdpStage, ew_stage, upload_lut
from .task import DpuStages, cached_template, write_dpu, write_dpu_rdma

# Flying DPU tasks stay at 4096 columns, well under the 13-bit maximum that corrupts a tail of
# the cube (notes: dpu-lut-activation.md QUIRK 3, "Tiling well under the ceiling at
# DPU_LUT_MAXN = 32768 (cols = 4096) is bit-clean").
FLYING_MAX_POSITIONS = 4096


def _build(profile: ChipProfile, positions: int, st: DpuStages) -> TaskTemplate:
    c2 = profile.input(DType.F16).feature_c2
    t = TaskBuilder("flying", profile)
    t.write("DPU_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    t.write("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)
    if st.lut is not None:
        upload_lut(t, st.lut)
    # The flying source is written with SIZE_E 0 and SURF_ADD = positions (conformance 05, the
    # hardware-validated flying program)
    write_dpu(t, profile, st, in_dtype=DType.F16, out_dtype=DType.F16, flying=True, mode=0,
              width=positions, height=1, channels=c2,
              dst_surf_stride=positions * profile.atom_bytes, size_e=0, surf_add=positions,
              od_bypass=True)
    write_dpu_rdma(t, profile, st, in_dtype=DType.F16, flying=True, mode=0, width=positions,
                   height=1, channels=c2)
    # DMA: the source atoms in (and the operand's), the result atoms out
    t.reads(Reloc("src"), positions * profile.atom_bytes)
    if st.ew is not None:
        t.reads(Reloc("ew"), positions * profile.atom_bytes)
    t.writes(Reloc("out"), positions * profile.atom_bytes)
    return template_of(t.finish())


def emit_flying(name: str, profile: ChipProfile, src: Reloc, dst: Reloc, positions: int, *,
                bs: SdpStage | None = None, bn: SdpStage | None = None,
                lut: LutTables | None = None, out_cvt: OutCvt = OutCvt()) -> EmittedTask:
    """A DPU-only task over ``positions`` consecutive 16-byte atoms (8 fp16 lanes each) at
    ``src``, written to ``dst``, through the register-operand BS / BN stages, the LUT and the
    output converter."""
    if not 1 <= positions <= FLYING_MAX_POSITIONS:
        raise LoweringError(f"{name}: a flying DPU task covers 1..{FLYING_MAX_POSITIONS} positions "
                            f"(QUIRK 3 keeps it well under the 13-bit width), got {positions}")
    if any(s is not None and s.alu_src for s in (bs, bn)):
        raise LoweringError(f"{name}: a flying task's BS/BN operands are registers (no memory "
                            f"vector is read on this path)")
    st = DpuStages(bs=bs, bn=bn, lut=lut, out_cvt=out_cvt)
    tpl = cached_template(profile, ("flying", positions, st), lambda: _build(profile, positions, st))
    return tpl.bind(name, {"src": src, "out": dst})


def emit_flying_ew(name: str, profile: ChipProfile, op: str, src: Reloc, operand: Reloc,
                   dst: Reloc, positions: int, *, bs: SdpStage | None = None,
                   bn: SdpStage | None = None) -> EmittedTask:
    """A DPU-only task out = src OP operand over ``positions`` consecutive atoms of one fp16
    surface each (op add / max / min / mul): MRDMA streams ``src`` (through the BS and then the
    BN stage, if given: the SDP's X1 -> X2 -> Y order, notes: sdp-stage-precision.md "SDP
    read-modify-write stages"), ERDMA the operand, the EW stage combines them in fp32 and the
    output converter rounds once -- the conv-fed EW's arithmetic, with no CNA/CORE pass
    (task.write_dpu_rdma)."""
    if not 1 <= positions <= FLYING_MAX_POSITIONS:
        raise LoweringError(f"{name}: a flying DPU task covers 1..{FLYING_MAX_POSITIONS} positions "
                            f"(QUIRK 3 keeps it well under the 13-bit width), got {positions}")
    if any(s is not None and s.alu_src for s in (bs, bn)):
        raise LoweringError(f"{name}: a flying task's BS/BN operands are registers (no memory "
                            f"vector is read on this path)")
    st = DpuStages(bs=bs, bn=bn, ew=ew_stage(op))
    tpl = cached_template(profile, ("flying", positions, st), lambda: _build(profile, positions, st))
    return tpl.bind(name, {"src": src, "ew": operand, "out": dst})
