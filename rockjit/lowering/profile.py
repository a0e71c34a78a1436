"""Chip profiles: the machine parameters of an NPU, each with the source it comes from.

Planners and emitters read every machine number from a ``ChipProfile`` (never a bare literal),
so a second chip is one more ``register_profile`` call. A profile holds *parameters* only; the
register encoding is named by ``encoding`` and an emitter refuses a profile whose encoding it
does not implement (seeds 001 "Portability": the RK3576 keeps the block bases but re-packs the
CNA/CORE/DPU geometry registers, so an RK3588 program does not run there).

Source keys used below:
  [hw]      /work/notes/hardware-overview.md
  [dt]      /work/notes/datatypes.md
  [mm]      /work/notes/matmul-as-conv.md
  [tile]    /work/notes/encodings/tile-layouts.md
  [prec]    /work/notes/encodings/precision-field.md
  [size-e]  /work/notes/encodings/size-e-quirk.md
  [slack]   /work/notes/encodings/cbuf-bank-slack.md
  [chain]   /work/notes/encodings/regcmd-task-model.md (contiguous chaining)
  [lut]     /work/notes/encodings/dpu-lut-activation.md (QUIRK 3)
  [kacc]    /work/notes/encodings/k-accumulation.md
  [dw]      /work/notes/depthwise-conv.md
  [seed3]   /work/shared/seeds/003_*.txt (programming model page)
  [conf]    /work/shared/conformance (hardware-validated programs; README index + case.md)
  [mesa]    Mesa src/gallium/drivers/rocket (rkt_ml.h, rkt_regcmd.c), MIT
  [kernel]  Linux drivers/accel/rocket/rocket_job.c
  [regs]    the register table (rockjit/lowering/regtable.py, from rk3588-registers.xml)
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

from ..errors import RockjitError
from ..ir.types import DType


class ProfileError(RockjitError, ValueError):
    """An unknown chip, or a datatype the chip's profile does not offer."""


@dataclass(frozen=True)
class OutputFormat:
    """How the DPU writes one output element type (the write-out side of a conv/matmul)."""

    dtype: DType
    precision: int          # DPU_DATA_FORMAT.OUT_PRECISION code [prec]
    esize: int              # bytes per element in memory
    c2: int                 # output cube channel atom = atom_bytes / esize [tile]
    size_e: int             # DPU_BS_OW_CFG.SIZE_E_* [size-e]
    surf_mult: int          # DPU_SURFACE_ADD per output position, = size_e + 1 [size-e][dw]
    fp32_to_fp16: bool      # DPU_OUT_CVT_SCALE.FP32TOFP16_EN: narrow the fp32 accumulator [tile]


@dataclass(frozen=True)
class InputPrecision:
    """One input datatype of the CNA/CORE conv datapath (feature and weight share it: the
    RK3588 matmul is same-A/B-dtype only [tile])."""

    dtype: DType
    precision: int          # CNA_CONV_CON1 / CORE_MISC_CFG / DPU in+proc precision code [prec]
    esize: int              # bytes per element
    feature_c2: int         # feature cube channel atom [tile]
    weight_n_group: int     # kernels per weight block [tile]
    weight_k_group: int     # channels per weight block [tile]
    k_align: int            # K (input channels of a matmul) must be a multiple [mm]
    n_align: int            # N (kernels of a matmul) must be a multiple [mm]
    dw_group: int           # depthwise weight channel group G [dw]
    feature_bank_slack: int  # extra CBUF banks the feature DMA needs [slack]
    chainable: bool         # may run in a self-chained kick [chain]
    core_qd_en: int         # CORE_MISC_CFG.QD_EN on the plain conv/matmul path [conf][dw]
    outputs: Mapping[DType, OutputFormat]  # native output formats [dt]

    def __hash__(self) -> int:  # the mapping field is not hashable; the dtype identifies it
        return hash((self.dtype, self.precision))


@dataclass(frozen=True)
class ChipProfile:
    name: str
    encoding: str                 # which regcmd encoder programs this chip
    cores: int
    cbuf_banks: int
    cbuf_bank_bytes: int
    cbuf_entry_bytes: int         # unit of CNA_CBUF_CON1.DATA_ENTRIES
    atom_bytes: int               # one cube atom: C2 channels of any dtype
    min_feature_rows: int         # conv height below this mis-computes
    row_align: int                # matmul M must be a multiple of this
    max_feature_rows: int         # input rows of one conv task
    max_feature_cols: int         # input columns of one conv task
    cube_dim_bits: int            # width of the DPU/RDMA cube-dimension fields
    cube_dim_exact_max_unsafe: bool  # a dimension of exactly 2^bits - 1 corrupts output
    ew_min_positions: int         # EW operand surface stride floor (positions)
    regcmd_align_bytes: int       # alignment of a regcmd segment the PC jumps to
    chain_word_align: int         # chained segments start at multiples of this many words
    enable_bits: Mapping[str, int]  # PC_OPERATION_ENABLE bit(s) per block group
    precisions: Mapping[DType, InputPrecision]
    sources: Mapping[str, str] = field(compare=False)

    def __hash__(self) -> int:  # mapping fields are not hashable; a registered name is unique
        return hash((self.name, self.encoding))

    # -- derived ---------------------------------------------------------------------
    @property
    def cbuf_bytes(self) -> int:
        return self.cbuf_banks * self.cbuf_bank_bytes

    @property
    def cube_dim_limit(self) -> int:
        """Largest cube dimension (element count) a planner may use."""
        top = (1 << self.cube_dim_bits) - 1
        return top - 1 if self.cube_dim_exact_max_unsafe else top

    def input(self, dtype: DType) -> InputPrecision:
        try:
            return self.precisions[dtype]
        except KeyError:
            have = ", ".join(d.value for d in self.precisions)
            raise ProfileError(
                f"chip {self.name!r} has no conv/matmul input datatype {dtype.value}; "
                f"it offers: {have}") from None

    def output(self, in_dtype: DType, out_dtype: DType) -> OutputFormat:
        p = self.input(in_dtype)
        try:
            return p.outputs[out_dtype]
        except KeyError:
            have = ", ".join(d.value for d in p.outputs)
            raise ProfileError(
                f"chip {self.name!r}: a {in_dtype.value} matmul/conv cannot write "
                f"{out_dtype.value}; its native outputs are: {have} (requantize on the host "
                f"or cast in a later op)") from None


def _out(dtype: DType, precision: int, esize: int, size_e: int, fp32_to_fp16: bool,
         atom: int) -> OutputFormat:
    return OutputFormat(dtype, precision, esize, atom // esize, size_e, size_e + 1, fp32_to_fp16)


_ATOM = 16  # [tile]: "C2 = 16 bytes / element size" for feature and output cubes

_FP32_OUT = _out(DType.F32, 5, 4, 3, False, _ATOM)   # [prec] fp32=5, [size-e] size_e=3 natural

RK3588 = ChipProfile(
    name="rk3588",
    encoding="rk3588",
    cores=3,
    cbuf_banks=12,
    cbuf_bank_bytes=32 * 1024,
    cbuf_entry_bytes=64,
    atom_bytes=_ATOM,
    min_feature_rows=4,
    row_align=4,
    max_feature_rows=1022,
    max_feature_cols=2047,
    cube_dim_bits=13,
    cube_dim_exact_max_unsafe=True,
    ew_min_positions=12,
    regcmd_align_bytes=16,
    chain_word_align=2,
    enable_bits=MappingProxyType({
        # CNA and CORE always run together (a conv); 0x1d - 0x18 leaves bits 0 and 2 for
        # the pair, bit 1 is never seen set. The DPU-only LUT program is 0x18, pooling 0x60.
        "CNA+CORE": 0x05, "DPU": 0x08, "DPU_RDMA": 0x10, "PPU": 0x20, "PPU_RDMA": 0x40,
    }),
    precisions=MappingProxyType({
        DType.F16: InputPrecision(
            DType.F16, precision=2, esize=2, feature_c2=8, weight_n_group=16,
            weight_k_group=32, k_align=32, n_align=16, dw_group=32, feature_bank_slack=0,
            chainable=True, core_qd_en=1,
            outputs=MappingProxyType({
                DType.F16: _out(DType.F16, 2, 2, 1, True, _ATOM),
                DType.F32: _FP32_OUT,
            })),
        DType.BF16: InputPrecision(
            DType.BF16, precision=3, esize=2, feature_c2=8, weight_n_group=16,
            weight_k_group=32, k_align=32, n_align=16, dw_group=32, feature_bank_slack=0,
            chainable=False, core_qd_en=1,
            outputs=MappingProxyType({DType.F32: _FP32_OUT})),
        DType.I8: InputPrecision(
            DType.I8, precision=0, esize=1, feature_c2=16, weight_n_group=32,
            weight_k_group=32, k_align=32, n_align=32, dw_group=64, feature_bank_slack=1,
            chainable=False, core_qd_en=0,
            outputs=MappingProxyType({
                DType.I32: _out(DType.I32, 4, 4, 7, False, _ATOM),
                # the requantizing int8 writer (only with OUT_CVT requant, emitters/conv
                # ConvRequant): size_e 1 direct (depthwise overrides to 3) [dw][conf 14]
                DType.I8: _out(DType.I8, 0, 1, 1, False, _ATOM),
            })),
    }),
    sources=MappingProxyType({
        "name": "device tree compatible rockchip,rk3588 [seed 000 'hardware profile']",
        "encoding": "seeds 001 'Portability': regcmd geometry encoding is per chip",
        "cores": "[hw] 'Three cores' (npu@fdab0000/fdac0000/fdad0000)",
        "cbuf_banks": "[hw] 'CBUF 12 banks x 32 KB'; [mesa] rkt_ml.h CBUF_BANKS",
        "cbuf_bank_bytes": "[hw] 'CBUF 12 banks x 32 KB'; [mesa] rkt_ml.h CBUF_BANK_SIZE",
        "cbuf_entry_bytes": "[tile] 'data_entries divisor': a data entry is 64 bytes; "
                            "[conf] 01 DATA_ENTRIES=2 for a 128-byte row",
        "atom_bytes": "[tile] 'C2 = 16 bytes / element size'",
        "min_feature_rows": "[mm] 'Feature height < 4 is broken'",
        "row_align": "[mm] 'M%4==0 is the real hardware constraint'",
        "max_feature_rows": "[seed3] section 6: one conv task at most 1022 input rows "
                            "(CNA_CONV_CON2.FEATURE_GRAINS, 10 bits, holds rows+1) [regs]",
        "max_feature_cols": "[seed3] section 6: at most 2047 columns "
                            "(CNA_DATA_SIZE0.DATAIN_WIDTH is 11 bits) [regs]",
        "cube_dim_bits": "[lut] 'DPU_DATA_CUBE_WIDTH is 13 bits'; [regs] WIDTH/HEIGHT/CHANNEL 0..12",
        "cube_dim_exact_max_unsafe": "[lut] QUIRK 3: riding the exact max (8191) corrupts ~54 positions",
        "ew_min_positions": "[kacc] SURF_NOTCH = EW_SURF_STRIDE = MAX(out_w*out_h, 12) << 4",
        "regcmd_align_bytes": "[regs] PC_BASE_ADDRESS.PC_SOURCE_ADDR is bits 4..31",
        "chain_word_align": "[chain] chained segments are laid out at the even-rounded word count",
        "enable_bits": "[conf] README index: conv 0x1d, DPU-only 0x18, PPU 0x60; "
                       "[seed3] section 3: the enable value is a per-block bitmap; "
                       "[mesa] rkt_regcmd.c writes RESERVED_0(14)|OP_EN(1) = 0x1d for a conv",
        "precisions": "[prec] codes int8=0 fp16=2 bf16=3 int32=4 fp32=5; [tile] feature C2 "
                      "fp16 8 / int8 16, weight groups fp16 16x32 / int8 32x32, output C2 = "
                      "16/esize; [mm] alignment fp16 K%32 N%16, int8 K%32 N%32; [size-e] "
                      "size_e fp16 1, fp32 3, int 7 with SURF_MULT 8; [dw] depthwise G fp16 32 / "
                      "int8 64; [slack] int8 data_bank = fd_banks + 1; [chain] integer chains "
                      "garble after the first task (fp16 only); [conf] 01/03 CORE_MISC_CFG "
                      "QD_EN=1 fp16, 0 int8; [dt] native pairs fp16->fp32, int8->int32",
    }),
)

_PROFILES: dict[str, ChipProfile] = {}


def register_profile(profile: ChipProfile) -> None:
    """Add a chip. Every field must name its source, so an unsourced number cannot slip in."""
    missing = [f.name for f in fields(ChipProfile)
               if f.name != "sources" and not profile.sources.get(f.name)]
    if missing:
        raise ProfileError(f"profile {profile.name!r} gives no source for: {', '.join(missing)}")
    if profile.name in _PROFILES and _PROFILES[profile.name] != profile:
        raise ProfileError(f"a different profile named {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile


def get_profile(name: str = "rk3588") -> ChipProfile:
    try:
        return _PROFILES[name.lower()]
    except KeyError:
        have = ", ".join(sorted(_PROFILES))
        raise ProfileError(
            f"no chip profile named {name!r}; known: {have}. A new chip needs its machine "
            f"parameters measured and registered with register_profile()") from None


def profile_names() -> list[str]:
    return sorted(_PROFILES)


register_profile(RK3588)

# The RK3576 is not registered: seeds 001 gives only some of its parameters (2 cores, a
# matmul tile cap of 2048, weight N-group 32) and says its CBUF differs without giving the
# numbers, and it needs its own regcmd encoder. Registering guessed CBUF values would let a
# planner tile for a machine nobody measured.
