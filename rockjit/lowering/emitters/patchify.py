"""Non-overlapping patchify (stride == kernel, no padding/dilation) as a host im2col step + a
matmul, when the cost rule in ``choose_patchify`` says so (notes: encodings/siglip-encoder.md).
"""
from __future__ import annotations

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout
from ..op_lowering import BufferSpec, HostStep, NpuJob, NpuStep, OpLowering, Slice
from ..profile import ChipProfile
from ..regcmd import Access, Kick, LoweringError, Reloc
from ..tiling import field_limit, round_up
from .conv_spec import ConvSpec
from .matmul import build_matmul


def is_patchify(spec: ConvSpec) -> bool:
    (pt, pb), (pl, pr) = spec.padding
    return (spec.stride == (spec.kh, spec.kw) and spec.dilation == (1, 1) and spec.groups == 1
            and pt == pb == pl == pr == 0 and spec.height % spec.kh == 0
            and spec.width % spec.kw == 0)


def choose_patchify(spec: ConvSpec, in_dtype: DType, profile: ChipProfile) -> str:
    """The cost rule for a non-overlapping patchify (stride == kernel, no padding/dilation).

    Both routes read every input byte exactly once (the patches do not overlap, so im2col copies
    each byte once, like the host pack the input needs anyway) and do the same useful MACs. They
    differ in padding waste: the direct conv pads the *input channels* to K's atom before the
    kernel taps multiply them (round_up(C, k_align) * KH * KW MACs per output), im2col pads the
    flattened patch once (round_up(C * KH * KW, k_align)). im2col + matmul is chosen when it
    does strictly less MAC work (e.g. SigLIP 3x16x16: 32*256 = 8192 vs 768), or when the direct
    conv cannot run (input wider than one task reads, or a stride past CNA_CONV_CON3's 3-bit
    field); otherwise the direct conv, which needs no host step.
    """
    stride_top = field_limit("CNA_CONV_CON3", "CONV_X_STRIDE", profile.encoding)
    if not is_patchify(spec):
        # a stride past the 3-bit field has no direct form; im2col gathers only the windows
        # the stride visits (each input byte at most KH*KW / (SY*SX) < 1 + KH*KW/8 times)
        if spec.groups == 1 and max(spec.stride) > stride_top:
            return "im2col"
        return "direct"
    p = profile.input(in_dtype)
    direct = round_up(spec.in_c, p.k_align) * spec.kh * spec.kw
    im2col = round_up(spec.in_c * spec.kh * spec.kw, p.k_align)
    if im2col < direct or spec.width > profile.max_feature_cols or max(spec.stride) > stride_top:
        return "im2col"
    return "direct"


def build_patchify_im2col(spec: ConvSpec, in_dtype: DType, out_dtype: DType,
                          profile: ChipProfile, weights: np.ndarray, *,
                          name: str = "patchify") -> OpLowering:
    """im2col on the host (row-major NCHW input -> the matmul's A cube) + a matmul per image.

    The im2col is a pure strided copy of the generic host-op library (``im2col_steps_for``):
    A[oy*OW + ox, (c*KH + ky)*KW + kx] = x[c, oy*SY + ky*DY, ox*SX + kx*DX] (the order of a
    reshaped [OC, C*KH*KW] weight, notes: encodings/siglip-encoder.md); "a" is zero-filled
    scratch so the cube's padding rows/channels read as zero. Any ungrouped conv has this form
    (used for a non-overlapping patchify, and for a stride past CONV_X/Y_STRIDE's field); a
    padded one is first copied into the interior of a zero-filled "xpad" scratch image.
    The output "y" is the matmul's cube per image, H = OH*OW rows (padded), W = 1 -- byte-
    identical to the conv's [OC/C2][OH][OW][C2] cube whenever OH*OW is a multiple of 4.
    """
    if spec.groups != 1:
        raise LoweringError(f"im2col lowering needs an ungrouped conv (groups=1): {spec}")
    w = np.asarray(weights)
    if w.shape != (spec.out_c, spec.in_c, spec.kh, spec.kw):
        raise LoweringError(f"conv weights must have shape {(spec.out_c, spec.in_c, spec.kh, spec.kw)}"
                            f" (OIHW), got {w.shape}")
    m = spec.out_h * spec.out_w
    kk = spec.in_c * spec.kh * spec.kw
    mm = build_matmul(m, kk, spec.out_c, in_dtype, out_dtype, profile, batch=spec.batch,
                      b=w.reshape(spec.out_c, kk), name=name)
    a = mm.buffer("a")
    p = profile.input(in_dtype)
    xbytes = spec.batch * spec.in_c * spec.height * spec.width * p.esize
    x = BufferSpec("x", "input", xbytes, None, in_dtype.value,
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0)
    a_scratch = BufferSpec("a", "scratch", a.nbytes, a.layout, a.dtype, a.shape, zero=True)
    pad_steps, pad_bufs, src, src_bytes = _pad_steps(spec, in_dtype, xbytes)
    im2col_steps, extra = im2col_steps_for(spec, in_dtype, a.layout, a.nbytes // spec.batch,
                                           src, "a", src_bytes, a.nbytes)
    im2col_steps = pad_steps + im2col_steps
    extra = pad_bufs + extra
    y = mm.buffer("c")
    y_out = BufferSpec("y", "output", y.nbytes, y.layout, y.dtype,
                       (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0)
    rename = {"c": "y"}
    bufs = [x, a_scratch, y_out] + extra + [b for b in mm.buffers if b.name not in ("a", "c")]
    steps = im2col_steps + [_rename_step(st, rename) for st in mm.steps]
    return OpLowering(tuple(bufs), tuple(steps), macs=mm.macs)


def _pad_steps(spec: ConvSpec, dtype: DType, xbytes: int
               ) -> tuple[list[HostStep], list[BufferSpec], str, int]:
    """(steps, buffers, im2col source, its bytes): a padded conv's input copied into the
    interior of a zero-filled scratch image "xpad" (NCHW, padded H and W), so the im2col reads
    the zeros of the padding like any other pixel; an unpadded one reads "x" itself."""
    from ..host_rules import HostView, host_op_step

    (pt, pb), (pl, pr) = spec.padding
    if not (pt or pb or pl or pr):
        return [], [], "x", xbytes
    es = np.dtype(dtype.to_numpy()).itemsize
    b, c, h, w = spec.batch, spec.in_c, spec.height, spec.width
    hp, wp = h + pt + pb, w + pl + pr
    nbytes = b * c * hp * wp * es
    sizes = {"x": xbytes, "xpad": nbytes, "pad_desc": 0}
    dview = HostView("xpad", dtype, pt * wp + pl, (c * hp * wp, hp * wp, wp, 1))
    sview = HostView("x", dtype, 0, (c * h * w, h * w, w, 1))
    st, desc = host_op_step("copy", (b, c, h, w), dview, [sview], sizes, "pad_desc",
                            what="conv padding copy")
    xpad = BufferSpec("xpad", "scratch", nbytes, None, dtype.value, (b, c, hp, wp), zero=True)
    return [st], [xpad, desc], "xpad", nbytes


def im2col_steps_for(spec: ConvSpec, dtype: DType, lay: CubeLayout, image_stride: int, src: str,
                     dst: str, src_bytes: int, dst_bytes: int
                     ) -> tuple[list[HostStep], list[BufferSpec]]:
    """The im2col as host-op copies into the A cube ``lay`` (per image ``image_stride`` bytes
    apart) from ``src``, the NCHW image with the conv's padding already in it. Window (oy, ox)
    tap (ky, kx) reads pixel (oy*SY + ky*DY, ox*SX + kx*DX): strides affine in every index, so
    a strided view. Cube element (m, k) sits at (k // C2) * surf + m * line + k % C2
    (layouts.py); when KW is a whole number of C2 atoms, kx splits into (kx // C2, kx % C2)
    and the whole im2col is one rank-7 strided copy (batch, oy, ox, c, ky, kx_hi, kx_lo).
    Otherwise a copy makes row-major patches [M, K] (scratch) and pack_cube steps pack them
    per image."""
    from ..host_rules import HostView, host_op_step

    es = np.dtype(lay.dtype).itemsize
    c2 = lay.c2
    line, surf, img = lay.line_stride // es, lay.surf_stride // es, image_stride // es
    (pt, pb), (pl, pr) = spec.padding
    b, c, kh, kw = spec.batch, spec.in_c, spec.kh, spec.kw
    h, w = spec.height + pt + pb, spec.width + pl + pr
    (sy, sx), (dy, dx) = spec.stride, spec.dilation
    oh, ow = spec.out_h, spec.out_w
    sizes = {src: src_bytes, dst: dst_bytes, "im2col_desc": 0}
    if kw % c2 == 0:
        shape = (b, oh, ow, c, kh, kw // c2, c2)
        dview = HostView(dst, dtype, 0, (img, ow * line, line, kh * (kw // c2) * surf,
                                         (kw // c2) * surf, surf, 1))
        sview = HostView(src, dtype, 0, (c * h * w, sy * w, sx, h * w, dy * w, c2 * dx, dx))
        st, desc = host_op_step("copy", shape, dview, [sview], sizes, "im2col_desc",
                                what="im2col copy")
        return [st], [desc]
    m, k = oh * ow, c * kh * kw
    sizes["patches"] = b * m * k * es
    shape = (b, oh, ow, c, kh, kw)
    dview = HostView("patches", dtype, 0, (m * k, ow * k, k, kh * kw, kw, 1))
    sview = HostView(src, dtype, 0, (c * h * w, sy * w, sx, h * w, dy * w, dx))
    st, desc = host_op_step("copy", shape, dview, [sview], sizes, "im2col_desc",
                            what="im2col copy")
    steps = [st]
    for i in range(b):
        steps.append(HostStep("pack_cube", {"src": Slice("patches", i * m * k * es, m * k * es),
                                            "dst": Slice(dst, i * image_stride, lay.nbytes)},
                              {"height": m, "width": 1, "channels": k, "c2": c2, "esize": es,
                               "line_stride": lay.line_stride, "surf_stride": lay.surf_stride}))
    return steps, [desc, BufferSpec("patches", "scratch", sizes["patches"])]


def _rename_step(step, rename: dict[str, str]):
    """A matmul's steps with its output buffer renamed (relocations included)."""
    if isinstance(step, HostStep):
        ops = {k: Slice(rename.get(v.buffer, v.buffer), v.offset, v.nbytes)
               for k, v in step.operands.items()}
        return HostStep(step.kind, ops, step.params)
    jobs = []
    for job in step.jobs:
        kicks = []
        for k in job.kicks:
            rel = {i: Reloc(rename.get(r.buffer, r.buffer), r.offset) for i, r in k.relocs.items()}
            ren = [Access(rename.get(a.buffer, a.buffer), a.offset, a.extent, a.nbytes,
                          a.pieces, a.pitch) for a in k.reads + k.writes]
            kicks.append(Kick(k.regcmd_buffer, k.base_offset, k.words, rel, k.task_offsets,
                              k.task_counts, k.enables, tuple(ren[:len(k.reads)]),
                              tuple(ren[len(k.reads):]), k.chainable))
        jobs.append(NpuJob(tuple(kicks), tuple(rename.get(b, b) for b in job.reads),
                           tuple(rename.get(b, b) for b in job.writes), job.integer))
    return NpuStep(tuple(jobs))
