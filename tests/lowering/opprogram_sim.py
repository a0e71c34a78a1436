"""Run an OpProgram on the C simulator (strict mode) the way the runtime would: buffers at
IOVAs, relocations patched, NPU steps job by job, host steps by a numpy model of the host-step
kinds the emitters rely on ("add_i32", "im2col"; their contract is in emitters/conv.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rockjit.lowering.layouts import CubeLayout, WeightLayout, pack_matrix, unpack_matrix
from rockjit.lowering.opprogram import HostStep, NpuStep, OpProgram

try:
    from rockjit._rjc import ffi, lib
    MISSING = ""
except ImportError:  # the C core is not built
    ffi = lib = None
    MISSING = "the simulator (rockjit._rjc) is not built"

PAGE = 4096
SENTINEL = 0xAA


@dataclass
class SimRun:
    """Buffers by name (host bytes) after a run, plus counters."""

    mem: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)
    kicks: int = 0
    host_steps: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.mem[name][1]


def _host_add_i32(step: HostStep, run: SimRun) -> None:
    n = int(step.params["elements"])
    ops = step.operands

    def view(name: str) -> np.ndarray:
        sl = ops[name]
        return run[sl.buffer][sl.offset:sl.offset + 4 * n].view("<i4")

    acc = np.zeros(n, np.int64)
    for i in range(int(step.params["count"])):
        acc += view(f"src{i}")
    view("dst")[...] = acc.astype(np.int64).astype(np.int32)   # wraps like int32 adds


def _host_im2col(step: HostStep, run: SimRun) -> None:
    pr = step.params
    dt = np.dtype(np.float16 if pr["dtype"] == "f16" else np.int8)
    b, c, h, w, kh, kw = (pr[k] for k in ("batch", "channels", "height", "width", "kh", "kw"))
    src = step.operands["src"]
    x = run[src.buffer][src.offset:src.offset + src.nbytes].view(dt).reshape(b, c, h, w)
    oh, ow = h // kh, w // kw
    dst = step.operands["dst"]
    lay = CubeLayout(pr["rows_pad"], 1, pr["cols_pad"], pr["c2"], dt)
    for i in range(b):
        patches = x[i].reshape(c, oh, kh, ow, kw).transpose(1, 3, 0, 2, 4).reshape(oh * ow, c * kh * kw)
        a = np.zeros((pr["rows_pad"], pr["cols_pad"]), dt)
        a[:oh * ow, :c * kh * kw] = patches
        off = dst.offset + i * pr["image_stride"]
        run[dst.buffer][off:off + lay.nbytes] = pack_matrix(lay, a)


HOST_KINDS = {"add_i32": _host_add_i32, "im2col": _host_im2col}


def run_program(prog: OpProgram, inputs: dict[str, np.ndarray]) -> SimRun:
    """``inputs``: bytes for every input buffer (by name). Outputs and scratch start as 0xAA so
    a byte the program should write but does not shows up."""
    run = SimRun()
    nxt = 0x01000000
    for b in prog.buffers:
        size = -(-max(b.nbytes, 1) // PAGE) * PAGE
        buf = np.full(size, SENTINEL if b.role in ("output", "scratch") else 0, np.uint8)
        data = b.data if b.role == "const" else inputs.get(b.name) if b.role == "input" else None
        if b.role == "input" and data is None:
            raise KeyError(f"no bytes given for input buffer {b.name!r}")
        if data is not None:
            raw = np.asarray(data).reshape(-1).view(np.uint8)
            assert raw.size <= b.nbytes, f"{b.name}: {raw.size} bytes > buffer {b.nbytes}"
            buf[:raw.size] = raw
        run.mem[b.name] = (nxt, buf)
        nxt += size + PAGE          # an unmapped guard page between buffers
    addrs = {k: v[0] for k, v in run.mem.items()}
    for job in prog.jobs():
        for k in job.kicks:
            words = k.array(addrs)
            rb = run[k.regcmd_buffer]
            rb[k.base_offset:k.base_offset + words.nbytes] = words.view(np.uint8)
    simp = ffi.new("rj_sim **")
    err = ffi.new("rj_err *")
    assert lib.rj_sim_create(simp, lib.RJ_SIM_STRICT, err) == 0, ffi.string(err.msg).decode()
    sim = ffi.gc(simp[0], lib.rj_sim_destroy)
    regions = ffi.new("rj_region[]", len(run.mem))
    keep = []
    for r, (iova, buf) in zip(regions, run.mem.values()):
        ptr = ffi.from_buffer("uint8_t[]", buf)
        keep.append(ptr)
        r.iova, r.size, r.host = iova, buf.size, ptr
    for step in prog.steps:
        if isinstance(step, NpuStep):
            for job in step.jobs:
                for k in job.kicks:
                    tasks = k.job_tasks(addrs[k.regcmd_buffer])
                    jt = ffi.new("rj_task[]", len(tasks))
                    for d, (iova, n) in zip(jt, tasks):
                        d.regcmd_iova, d.regcmd_count = iova, n
                    rc = lib.rj_sim_run_job(sim, regions, len(run.mem), jt, len(tasks), err)
                    assert rc == 0, ffi.string(err.msg).decode()
                    run.kicks += 1
        else:
            HOST_KINDS[step.kind](step, run)
            run.host_steps.append(step.kind)
    return run


def stride_of(prog: OpProgram, name: str, batch: int) -> int:
    return prog.buffer(name).nbytes // batch


def pack_rows(layout: CubeLayout, x: np.ndarray) -> np.ndarray:
    """[rows, cols] (<= layout's) -> cube bytes, zero padded."""
    xp = np.zeros((layout.height, layout.channels), layout.dtype)
    xp[:x.shape[0], :x.shape[1]] = x
    return pack_matrix(layout, xp)


def run_matmul(prog: OpProgram, a: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, SimRun]:
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


def run_conv(prog: OpProgram, x: np.ndarray) -> tuple[np.ndarray, SimRun]:
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
