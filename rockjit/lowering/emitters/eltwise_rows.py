"""Element-wise passes split by rows (tokens): one job per row range, each over every channel
plane's [rows x 16 B] piece, so a norm's chain of passes and its feature reduces (whose row
tiles are the same ranges, rules/reduce.py) run on the core that holds those rows, with no
copy between them (issue 9).

A row range of an NC1HWC2 cube is one contiguous run per channel plane (positions r0..r1 of
plane c1 at c1 * plane + 16 * r0), so each pass is a DPU-only ("flying") task per plane over
the range's atoms, one 8-lane surface each (flying.py):

* x OP c (a scalar): the BS / BN register operand (eltwise.scalar_stages), as the flat form;
* a OP b (two cubes, add / max / min / mul): the two-operand flying EW -- MRDMA streams a,
  ERDMA b, the EW stage combines them in fp32 and the output rounds once: the arithmetic of the
  conv-fed EW, whose main feed is the exact fp32 copy of a (flying.emit_flying_ew);
* x OP s[row] (add / sub / mul): the range's per-row values broadcast over one surface by a
  1x1 conv (eltwise_row's broadcast, ones in input channel 0; -1 for sub, so x - s = x + (-s)
  as the one-pass form adds them) into the job's own scratch, then the flying EW per plane.

Every lane is the same fp32 operation and rounding as the flat or one-pass form's, in the
other operand order for the commutative add and mul. The flying tasks of a job chain in one
kick each pass (fp16).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, weight_layout
from ..op_lowering import BufferSpec, NpuStep, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc
from ..compile_cache import memoized
from ..tiling import ceil_div, round_up
from .eltwise import EW_VIEW_CHANNELS, check_fp16_cube, resolve_profile, scalar_stages
from .eltwise_row import row_vector_layout
from .flying import FLYING_MAX_POSITIONS, emit_flying, emit_flying_ew
from .jobs import JobTasks, assemble_jobs


def row_cuts(positions: int, profile: ChipProfile, parts: int | None = None) -> tuple[int, ...]:
    """The interior row cuts of up to ``parts`` (default: the cores) ranges: multiples of the
    row alignment, each range at least the EW floor of rows -- the row tiles a feature reduce
    of these rows gets with its row cap (rules/reduce._row_parts), so both split alike."""
    parts = profile.cores if parts is None else parts
    cap = round_up(ceil_div(positions, max(parts, 1)), profile.row_align)
    least = max(profile.ew_min_positions, profile.min_feature_rows)
    if parts <= 1 or cap < least or cap >= positions:
        return ()
    return tuple(c for c in range(cap, positions, cap))


def _ranges(positions: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    edges = [0, *cuts, positions]
    return list(zip(edges, edges[1:]))


def _plane_runs(layout: CubeLayout, profile: ChipProfile, r0: int, r1: int
                ) -> list[tuple[int, int]]:
    """(byte offset, positions) of the flying tasks over rows [r0, r1) of every plane."""
    atom = profile.atom_bytes
    out = []
    for c1 in range(ceil_div(layout.channels, layout.c2)):
        base = c1 * layout.surf_stride
        for p in range(r0, r1, FLYING_MAX_POSITIONS):
            out.append((base + p * atom, min(FLYING_MAX_POSITIONS, r1 - p)))
    return out


def _check(layout: CubeLayout, profile: ChipProfile, cuts: Sequence[int], what: str) -> int:
    check_fp16_cube(layout, profile, what)
    positions = layout.height * layout.width
    if not cuts or list(cuts) != sorted(set(cuts)) or cuts[0] <= 0 or cuts[-1] >= positions:
        raise LoweringError(f"{what}: row cuts {tuple(cuts)} do not split {positions} rows")
    return positions


def _program(bufs: list[BufferSpec], jobs: list[JobTasks], profile: ChipProfile,
             macs: int = 0) -> OpLowering:
    npu, end = assemble_jobs(profile, jobs)
    regcmd = BufferSpec("regcmd", "regcmd", round_up(end, profile.regcmd_align_bytes))
    return OpLowering(tuple(bufs) + (regcmd,), (NpuStep(tuple(npu)),), macs=macs)


@memoized
def build_scalar_rows(op: str, layout: CubeLayout, value: float, reverse: bool,
                      profile: ChipProfile | str | None, cuts: Sequence[int]) -> OpLowering:
    """out = x OP c (c OP x with ``reverse``) for a constant c, one job per row range of
    ``cuts``. Buffers as eltwise.build_binary_scalar: ``x``, ``out``, ``regcmd``."""
    profile = resolve_profile(profile)
    positions = _check(layout, profile, cuts, f"element-wise {op} with a scalar by rows")
    bs, bn = scalar_stages(op, value, reverse)
    jobs = []
    for j, (r0, r1) in enumerate(_ranges(positions, cuts)):
        tasks = [emit_flying(f"{op}_r{j}_{i}", profile, Reloc("x", off), Reloc("out", off), n,
                             bs=bs, bn=bn)
                 for i, (off, n) in enumerate(_plane_runs(layout, profile, r0, r1))]
        jobs.append(JobTasks([tasks], ("x",), ("out",)))
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0)]
    return _program(bufs, jobs, profile)


FLYING_OPS = ("add", "max", "min", "mul")


@memoized
def build_binary_rows(op: str, layout: CubeLayout, profile: ChipProfile | str | None,
                      cuts: Sequence[int]) -> OpLowering:
    """out = a OP b (add / max / min / mul) for two cubes of ``layout``, one job per row range.
    Buffers: ``a``, ``b`` (inputs 0, 1), ``out``, ``regcmd``; no padding past the cube."""
    profile = resolve_profile(profile)
    if op not in FLYING_OPS:
        raise LoweringError(f"element-wise {op} by rows: the flying two-operand EW is modelled "
                            f"for {', '.join(FLYING_OPS)}")
    positions = _check(layout, profile, cuts, f"element-wise {op} by rows")
    jobs = []
    for j, (r0, r1) in enumerate(_ranges(positions, cuts)):
        tasks = [emit_flying_ew(f"{op}_r{j}_{i}", profile, op, Reloc("a", off), Reloc("b", off),
                                Reloc("out", off), n)
                 for i, (off, n) in enumerate(_plane_runs(layout, profile, r0, r1))]
        jobs.append(JobTasks([tasks], ("a", "b"), ("out",)))
    bufs = [BufferSpec("a", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("b", "input", layout.nbytes, layout=layout, bind=1),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0)]
    return _program(bufs, jobs, profile)


# the flying EW op of x OP s[row] and the sign the broadcast applies to s
ROW_OPS = {"add": ("add", 1.0), "sub": ("add", -1.0), "mul": ("mul", 1.0)}


@memoized
def build_row_rows(op: str, layout: CubeLayout, profile: ChipProfile | str | None,
                   cuts: Sequence[int], real: int | None = None) -> OpLowering:
    """out[p, c] = x[p, c] OP s[p] (add / sub / mul) with s a run-time per-row vector in
    ``row_vector_layout``, one job per row range: the range's broadcast conv tasks into the
    job's part of ``bcast`` (scratch), then a flying EW task per plane. Buffers as
    eltwise_row.build_binary_row's one-pass form: ``x``, ``s``, ``out``, ``ones``, ``bcast``,
    ``regcmd``."""
    from .eltwise_row import bcast_range_tasks

    profile = resolve_profile(profile)
    if op not in ROW_OPS:
        raise LoweringError(f"element-wise {op} with a per-row vector by rows: only "
                            f"{', '.join(ROW_OPS)}")
    positions = _check(layout, profile, cuts, f"element-wise {op} with a per-row vector by rows")
    p = profile.input(DType.F16)
    atom = profile.atom_bytes
    ew_op, sign = ROW_OPS[op]
    # broadcast planes: 0 s in every lane; 1 s in the real lanes of the value's last plane
    # and 0 in its padding lanes; 2 zeros, for the planes past the value's channels (``real``:
    # a cube padded for a consumer's K). Padding keeps x's (x OP 0), as in
    # eltwise_row._one_pass: -mean there would square past fp16 after a norm's per-row scale
    c2 = p.feature_c2
    real = layout.channels if real is None else min(real, layout.channels)
    planes = ceil_div(layout.channels, c2)
    full, tail = divmod(real, c2)
    kernels = round_up(3 * c2, p.n_align) if planes * c2 > real else p.n_align
    ones = np.zeros((kernels, EW_VIEW_CHANNELS), np.float16)
    ones[:c2, 0] = sign
    ones[c2:c2 + tail, 0] = sign

    def source(off: int) -> int:
        """The broadcast plane the x plane at byte ``off`` reads."""
        plane = off // layout.surf_stride
        return 0 if plane < full else 1 if plane == full and tail else 2

    ones_packed = weight_layout(profile, DType.F16, kernels, EW_VIEW_CHANNELS).pack(ones)
    jobs = []
    scratch = 0
    for j, (r0, r1) in enumerate(_ranges(positions, cuts)):
        at = scratch
        rows = r1 - r0
        scratch += round_up(kernels // p.feature_c2 * rows * atom, 64)
        bc = bcast_range_tasks(profile, "s", positions, r0, rows, "ones", "bcast", at,
                               f"bc{j}_", kernels)
        tasks = [emit_flying_ew(f"{op}_r{j}_{i}", profile, ew_op, Reloc("x", off),
                                Reloc("bcast", at + source(off) * rows * atom
                                      + (off % layout.surf_stride) - r0 * atom),
                                Reloc("out", off), n)
                 for i, (off, n) in enumerate(_plane_runs(layout, profile, r0, r1))]
        jobs.append(JobTasks([bc, tasks], ("x", "s", "ones"), ("out",)))
    s_lay = row_vector_layout(positions, profile)
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("s", "input", s_lay.nbytes, layout=s_lay, bind=1),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0),
            BufferSpec("bcast", "scratch", scratch),
            BufferSpec("ones", "const", ones_packed.size, data=ones_packed)]
    return _program(bufs, jobs, profile, positions * kernels * EW_VIEW_CHANNELS)
