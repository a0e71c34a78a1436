"""Run an OpLowering through the real runtime on the strict simulator (rockjit.lowering.oprun),
and pack/unpack helpers for the matmul and conv tests."""
from __future__ import annotations

import numpy as np

from rockjit.lowering.layouts import CubeLayout, WeightLayout, pack_matrix, unpack_matrix
from rockjit.lowering.op_lowering import OpLowering

try:
    from rockjit._rjc import ffi, lib
    MISSING = ""
except ImportError:  # the C core is not built
    ffi = lib = None
    MISSING = "the simulator (rockjit._rjc) is not built"

SENTINEL = 0xAA


def run_program(prog: OpLowering, inputs: dict[str, np.ndarray]):
    """``inputs``: bytes for every input buffer (by name). Runs through the real runtime
    (rockjit.lowering.oprun: one BO per buffer, relocations patched at load, NPU jobs on a
    strict SimDevice, host steps -- K-partial sums, im2col copies -- in the C host-op
    library). Outputs and scratch start as 0xAA so a byte the program should write but does
    not shows up."""
    from rockjit.lowering.oprun import run_op_lowering
    return run_op_lowering(prog, inputs, sentinel=SENTINEL)


def stride_of(prog: OpLowering, name: str, batch: int) -> int:
    return prog.buffer(name).nbytes // batch


def pack_rows(layout: CubeLayout, x: np.ndarray) -> np.ndarray:
    """[rows, cols] (<= layout's) -> cube bytes, zero padded."""
    xp = np.zeros((layout.height, layout.channels), layout.dtype)
    xp[:x.shape[0], :x.shape[1]] = x
    return pack_matrix(layout, xp)


def run_matmul(prog: OpLowering, a: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, SimRun]:
    """a [M,K] or [batch,M,K]; b only when B is an input ([N,K] / [batch,N,K])."""
    batched = a.ndim == 3
    a3 = a if batched else a[None]
    nb = a3.shape[0]
    la: CubeLayout = prog.buffer("a").layout
    sa = stride_of(prog, "a", nb)
    abytes = np.zeros(prog.buffer("a").nbytes, np.uint8)
    for i in range(nb):
        blob = pack_rows(la, a3[i])
        abytes[i * sa:i * sa + blob.size] = blob
    inputs = {"a": abytes}
    if b is not None:
        lb: WeightLayout = prog.buffer("b").layout
        b3 = b if batched else b[None]
        sb = prog.buffer("b").nbytes // nb
        bbytes = np.zeros(prog.buffer("b").nbytes, np.uint8)
        for i in range(nb):
            bp = np.zeros((lb.kernels, lb.channels), lb.dtype)
            bp[:b3[i].shape[0], :b3[i].shape[1]] = b3[i]
            blob = lb.pack(bp)
            bbytes[i * sb:i * sb + blob.size] = blob
        inputs["b"] = bbytes
    run = run_program(prog, inputs)
    lc: CubeLayout = prog.buffer("c").layout
    sc = stride_of(prog, "c", nb)
    m, n = a3.shape[1], prog.buffer("c").shape[-1]
    outs = [unpack_matrix(lc, run["c"][i * sc:i * sc + lc.nbytes])[:m, :n] for i in range(nb)]
    c = np.stack(outs)
    return (c if batched else c[0]), run


def run_conv(prog: OpLowering, x: np.ndarray) -> tuple[np.ndarray, SimRun]:
    """x NCHW -> y NCHW through the program (direct, depthwise or im2col route)."""
    xs = prog.buffer("x")
    nb = x.shape[0]
    if xs.layout is None:                      # im2col route: row-major input
        inputs = {"x": np.ascontiguousarray(x).view(np.uint8)}
    else:
        lx: CubeLayout = xs.layout
        sx = xs.nbytes // nb
        xb = np.zeros(xs.nbytes, np.uint8)
        for i in range(nb):
            xi = np.zeros((lx.height, lx.width, lx.channels), lx.dtype)
            xi[:x.shape[2], :, :x.shape[1]] = x[i].transpose(1, 2, 0)
            blob = lx.pack(xi)
            xb[i * sx:i * sx + blob.size] = blob
        inputs = {"x": xb}
    run = run_program(prog, inputs)
    ys = prog.buffer("y")
    ly: CubeLayout = ys.layout
    n, oc, oh, ow = ys.shape
    sy = ys.nbytes // nb
    outs = []
    for i in range(nb):
        raw = run["y"][i * sy:i * sy + ly.nbytes]
        if ly.width == 1 and ow != 1 or ly.height != oh:      # matmul cube: rows = oy*OW+ox
            v = unpack_matrix(ly, raw)[:oh * ow, :oc].reshape(oh, ow, oc)
        else:
            v = ly.unpack(raw)[:oh, :ow, :oc]
        outs.append(v.transpose(2, 0, 1))
    return np.stack(outs), run
