"""reduce_window_{max,sum} -> emitters/pool.py: 2-D max / average pooling on the PPU.

The NPU form is a window over the two spatial axes of an N,C,H,W tensor (window, stride 1 and
no padding on N and C) within the PPU's fields: kernel and stride 1..16, padding 0..7 per side
(notes: encodings/ppu-pooling.md). Each image is one PPU pool of its H x W x C cube, read
through the view H,W,C of image n (free when the value is a conv's output cube) and written as
one cube per image whose logical axes are C,OH,OW -- the layout a following conv reads.

* ``reduce_window_max`` -> a max pool; padded positions read -inf on the PPU, as in XLA.
* ``reduce_window_sum`` -> an average pool (count-include-pad: the PPU pads with 0 and divides
  by kh*kw) followed, in the same job, by a DPU multiply by kh*kw, so the IR value stays the
  window *sum*; the user's ``/ (kh*kw)`` is then its own (DPU) multiply. A power-of-two window
  size scales exactly; otherwise the multiply adds one fp16 rounding (tolerance.py states both).

Anything else (another rank, a window on N or C, fields beyond the PPU's, an integer tensor, a
1x1 sum) raises NoNpuForm; host_rules then reduces unpadded windows on the host.
"""
from __future__ import annotations

from ...ir.ops import Op
from ...ir.types import DType
from ..layouts import feature_layout
from ..op_lowering import BufferSpec, OpLowering
from ..regcmd import LoweringError, Reloc
from .base import CubeForm, NoNpuForm, OpCall, RuleContext, RuleResult, Use, npu_dtype_of

_METHOD = {Op.REDUCE_WINDOW_MAX: "max", Op.REDUCE_WINDOW_SUM: "avg"}


def spatial_window(node) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    """(kernel, stride, (top, left, bottom, right)) of a window over H, W of N,C,H,W; raises
    NoNpuForm when the window also spans N or C."""
    x = node.inputs[0]
    if x.type.rank != 4:
        raise NoNpuForm(f"a rank-{x.type.rank} window (the PPU pools the H, W of N,C,H,W)")
    a = node.attrs
    win = tuple(int(w) for w in a["window_dimensions"])
    st = tuple(int(s) for s in a["window_strides"])
    pad = tuple((int(lo), int(hi)) for lo, hi in a["padding"])
    if win[:2] != (1, 1) or st[:2] != (1, 1) or pad[:2] != ((0, 0), (0, 0)):
        raise NoNpuForm(f"a window {win} / strides {st} / padding {pad} that spans the batch or "
                        f"channel axis (the PPU pools the two spatial axes of N,C,H,W only)")
    return (win[2], win[3]), (st[2], st[3]), (pad[2][0], pad[3][0], pad[2][1], pad[3][1])


def sum_pool_program(lay, kernel, stride, padding, profile) -> OpLowering:
    """A window sum of the cube ``lay`` in one NPU job of two passes: the PPU average into the
    scratch cube ``t``, then a flying DPU multiply by kh*kw into ``out``. One program, so the
    scheduler cannot run the multiply beside the pool it reads (a rule's calls of one shape
    are merged into one step of independent jobs)."""
    from ..emitters import eltwise as ew
    from ..emitters.pool import PoolGeom, _pool_tasks

    g = PoolGeom(lay.height, lay.width, lay.channels, kernel[0], kernel[1], stride[0],
                 stride[1], *padding)
    out = feature_layout(profile, DType.F16, g.out_h, g.out_w, g.channels)
    pool = _pool_tasks(g, "avg", profile, "x", "t", "sumpool")
    bs, bn = ew.scalar_stages("mul", float(kernel[0] * kernel[1]), False)
    scale = [ew.emit_flying(f"sumscale{i}", profile, Reloc("t", off), Reloc("out", off), n,
                            bs=bs, bn=bn)
             for i, (off, n) in enumerate(ew.flying_chunks(out.nbytes, profile))]
    bufs = [BufferSpec("x", "input", lay.nbytes, layout=lay, bind=0),
            BufferSpec("out", "output", out.nbytes, layout=out, bind=0),
            BufferSpec("t", "scratch", out.nbytes)]
    return ew.npu_program(bufs, [pool, scale], profile, ("x",), ("out",))


def lower_reduce_window(ctx: RuleContext) -> RuleResult:
    from ..emitters.pool import build_pool

    node = ctx.node
    x = node.inputs[0]
    if npu_dtype_of(x.type.dtype) is not DType.F16:
        raise NoNpuForm(f"{x.type.dtype.value} pooling (the PPU pools fp16 only)")
    kernel, stride, padding = spatial_window(node)
    method = _METHOD[node.op]
    n, c, h, w = x.type.shape
    _, _, oh, ow = node.out.type.shape
    lay = feature_layout(ctx.profile, DType.F16, h, w, c)
    try:
        if node.op is Op.REDUCE_WINDOW_SUM:
            prog = sum_pool_program(lay, kernel, stride, padding, ctx.profile)
            how = "pool.lower_pool[avg] x window size (DPU)"
        else:
            prog = build_pool(method, lay, kernel, stride, padding, ctx.profile)
            how = f"pool.lower_pool[{method}]"
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    out_lay = prog.buffer("out").layout
    form_in = CubeForm(lay, ("h", "w", "c"), (0, 0, 0), (h, w, c))
    form_out = CubeForm(out_lay, ("c", "h", "w"), (0, 0, 0), (c, oh, ow))
    label = f"{node.op.text} {kernel[0]}x{kernel[1]}/{stride} pad {padding} C={c}"
    # one pool per image; the calls are independent, so the scheduler runs them side by side
    calls = [OpCall(prog, (Use(x, (i,), (1, 2, 0), (h, w, c), ("h", "w", "c")),),
                    (Use(node.out, (i,)),), label, emitter=how, forms_in=(form_in,),
                    forms_out=(form_out,))
             for i in range(n)]
    return RuleResult(calls, parallel=True)


RULES = {Op.REDUCE_WINDOW_MAX: lower_reduce_window, Op.REDUCE_WINDOW_SUM: lower_reduce_window}
