"""Host steps split over threads (csrc/runtime/rj_host_pool.h): every kind the runtime splits
gives the same bytes on 3 threads as on 1 and the values numpy gives; the thread-count setting
and its environment flag; the pool's lifetime; compiled functions called from several Python
threads at once with the pool on."""
from __future__ import annotations

import os
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.ir.types import DType
from rockjit.lowering.host_rules import HostView, encode_descriptor
from rockjit.runtime import NullDevice, Operand, ProgramBuilder, host_steps
from rockjit.runtime._ffi import check, ffi, lib
from rockjit.runtime.host_abi import BINARY, COMPARE, REDUCE, UNARY
from rockjit.runtime.host_threads import (SPLIT_MIN_BYTES, host_default, host_threads,
                                          pool_workers, set_host_threads, shutdown_pool)

RNG = np.random.default_rng(11)
F32, F16, I32, BOOL = DType.F32, DType.F16, DType.I32, DType.BOOL


@pytest.fixture(autouse=True)
def _restore_setting():
    yield
    set_host_threads(None)


def _dense(a: np.ndarray) -> list[int]:
    return [s // a.itemsize for s in a.strides]


def run_threads(kind: str, shape, out: np.ndarray, out_view: HostView, ins, threads: int,
                code: int = 0, axis_mask: int = 0, iparams=()) -> int:
    """One descriptor through rj_host_op_run_threads; returns the threads it ran on."""
    desc = encode_descriptor(kind, shape, [out_view] + [v for _, v in ins], code, axis_mask,
                             iparams)
    d = ffi.new("rj_host_op *")
    ffi.memmove(d, desc.tobytes(), desc.nbytes)
    arrays = [out] + [a for a, _ in ins]
    bufs = ffi.new("rj_host_buf[]", len(arrays))
    for i, a in enumerate(arrays):
        bufs[i].data = ffi.from_buffer(a)
        bufs[i].size = a.nbytes
    used, nbytes, err = ffi.new("uint32_t *"), ffi.new("uint64_t *"), ffi.new("rj_err *")
    check(lib.rj_host_op_run_threads(d, bufs, len(arrays), threads, nbytes, used, err), err)
    assert nbytes[0] >= SPLIT_MIN_BYTES       # the case is large enough to split
    assert int(lib.rj_host_op_plan_threads(d, threads)) == used[0]
    return int(used[0])


def both(kind, shape, make_out, out_view, ins, **kw) -> np.ndarray:
    """The op on 1 and on 3 threads: the same bytes; returns the 3-thread output."""
    one, three = make_out(), make_out()
    assert run_threads(kind, shape, one, out_view, ins, 1, **kw) == 1
    assert run_threads(kind, shape, three, out_view, ins, 3, **kw) == 3
    assert one.tobytes() == three.tobytes(), f"{kind}: 3 threads differ from 1"
    return three


def _v(name, dt, a, off=0):
    return HostView(name, dt, off, _dense(a))


def test_copy_dense_row_split_in_chunks():
    x = RNG.standard_normal((256, 513)).astype(np.float32)   # merges into one long row
    got = both("copy", x.shape, lambda: np.zeros_like(x), _v("o", F32, x), [(x, _v("x", F32, x))])
    np.testing.assert_array_equal(got, x)


def test_copy_converting_f32_to_f16_on_a_split_row():
    # one row of 200003 values: ranges start at whole chunks, so the 8-lane F16C groups and
    # the scalar tail fall where one thread has them (halfway values round to even)
    x = (RNG.standard_normal(200003) * 70000).astype(np.float32)
    x[::7] = np.float32(1.0 + 2.0 ** -11)                      # exactly halfway in f16
    got = both("copy", x.shape, lambda: np.zeros(x.shape, np.float16), HostView("o", F16, 0, [1]),
               [(x, HostView("x", F32, 0, [1]))])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16))


def test_copy_transpose():
    x = RNG.integers(0, 60000, (512, 300)).astype(np.uint16)
    want = np.ascontiguousarray(x.T)
    got = both("copy", want.shape, lambda: np.zeros_like(want), HostView("o", F16, 0, [512, 1]),
               [(x, HostView("x", F16, 0, [1, 300]))])
    assert got.tobytes() == want.tobytes()


def test_unary_exp_with_two_outer_rows():
    # the outer dim (2) is narrower than the threads: the split falls in the rows
    x = RNG.standard_normal((2, 70001)).astype(np.float32)
    got = both("unary", x.shape, lambda: np.zeros_like(x), _v("o", F32, x), [(x, _v("x", F32, x))],
               code=UNARY["exp"])
    np.testing.assert_allclose(got, np.exp(x), rtol=8 * 2.0 ** -23)


def test_binary_add_with_a_broadcast_row():
    a = RNG.standard_normal((300, 500)).astype(np.float32)
    b = RNG.standard_normal(500).astype(np.float32)
    got = both("binary", a.shape, lambda: np.zeros_like(a), _v("o", F32, a),
               [(a, _v("a", F32, a)), (b, HostView("b", F32, 0, [0, 1]))], code=BINARY["add"])
    np.testing.assert_array_equal(got, a + b[None, :])


def test_compare_and_select():
    a = RNG.standard_normal((400, 300)).astype(np.float32)
    b = RNG.standard_normal((400, 300)).astype(np.float32)
    lt = both("compare", a.shape, lambda: np.zeros(a.shape, np.bool_), _v("o", BOOL, a),
              [(a, _v("a", F32, a)), (b, _v("b", F32, b))], code=COMPARE["lt"])
    np.testing.assert_array_equal(lt, a < b)
    got = both("select", a.shape, lambda: np.zeros_like(a), _v("o", F32, a),
               [(lt, _v("w", BOOL, lt)), (a, _v("c0", F32, a)), (b, _v("c1", F32, b))],
               iparams=(0, 2))
    np.testing.assert_array_equal(got, np.where(a < b, b, a))


@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_sum_over_either_axis(axis):
    x = RNG.standard_normal((512, 384)).astype(np.float32)
    out_shape = (384,) if axis == 0 else (512,)
    ov = HostView("o", F32, 0, [0, 1] if axis == 0 else [1, 0])
    got = both("reduce", x.shape, lambda: np.zeros(out_shape, np.float32), ov,
               [(x, _v("x", F32, x))], code=REDUCE["sum"], axis_mask=1 << axis)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=axis), rtol=1e-6, atol=1e-5)


def test_reduce_max_of_cube_lanes():
    x = RNG.standard_normal((4, 4096, 8)).astype(np.float32)   # groups x rows x 8 lanes
    got = both("reduce", x.shape, lambda: np.zeros((4, 4096), np.float32),
               HostView("o", F32, 0, [4096, 1, 0]), [(x, _v("x", F32, x))],
               code=REDUCE["max"], axis_mask=0b100)
    np.testing.assert_array_equal(got, x.max(axis=2))


def test_take_rows():
    table = RNG.standard_normal((4096, 64)).astype(np.float32)
    idx = RNG.integers(-4096, 4096, 3000).astype(np.int32)
    got = both("take", (3000, 64), lambda: np.zeros((3000, 64), np.float32),
               HostView("o", F32, 0, [64, 1]),
               [(table, HostView("x", F32, 0, [0, 1])), (idx, HostView("i", I32, 0, [1, 0]))],
               iparams=(64, 4096))
    np.testing.assert_array_equal(got, table[idx])


@pytest.mark.parametrize("dim", [0, 1])
def test_iota_along_each_dim(dim):
    shape = (1024, 160)
    got = both("iota", shape, lambda: np.zeros(shape, np.int32), HostView("o", I32, 0, [160, 1]),
               [], iparams=(dim,))
    np.testing.assert_array_equal(got, np.indices(shape)[dim])


def test_a_bad_index_in_a_split_take_is_an_error():
    table = np.zeros((4096, 64), np.float32)
    idx = np.zeros(3000, np.int32)
    idx[2500] = 5000
    with pytest.raises(Exception, match="5000"):
        run_threads("take", (3000, 64), np.zeros((3000, 64), np.float32),
                    HostView("o", F32, 0, [64, 1]),
                    [(table, HostView("x", F32, 0, [0, 1])), (idx, HostView("i", I32, 0, [1, 0]))],
                    3, iparams=(64, 4096))


# ---------------------------------------------------------------- layouts in a program

def _run_layout(step_of, src: np.ndarray, dst_size: int, threads: int | None
                ) -> tuple[bytes, dict]:
    """One layout step in a program on the null device; dst starts as 0xEE garbage, so a pack
    must zero every padding byte itself."""
    set_host_threads(threads)
    dev = NullDevice()
    b = ProgramBuilder(dev)
    s, d = b.add_bo(src.nbytes, "arena"), b.add_bo(dst_size, "arena")
    b.upload(s, src)
    b.upload(d, np.full(dst_size, 0xEE, np.uint8))
    b.add_host_step(step_of(Operand(s), Operand(d)))
    prog = b.build()
    prog.run()
    out, st = prog.read(d, dst_size), prog.stats()
    prog.close()
    dev.close()
    return out, st


def _layout_both(step_of, src, dst_size) -> bytes:
    one, st1 = _run_layout(step_of, src, dst_size, 1)
    three, st3 = _run_layout(step_of, src, dst_size, 3)
    assert st1["host_threads"] == 1 and st3["host_threads"] == 3
    assert one == three
    return three


def test_pack_and_unpack_cube_with_padded_strides():
    h, w, c, c2 = 64, 40, 60, 8
    line, groups = w * c2 * 2 + 64, -(-c // c2)
    surf = h * line + 128
    x = RNG.integers(0, 60000, (h, w, c)).astype(np.uint16)
    lay = dict(height=h, width=w, channels=c, c2=c2, esize=2, line_stride=line, surf_stride=surf)
    size = (groups - 1) * surf + h * line
    cube = _layout_both(lambda s, d: host_steps.pack_cube(s, d, **lay), x, size)
    got = np.frombuffer(cube, np.uint16)
    # notes encodings/tile-layouts.md: byte(h,w,c) = (c//c2)*surf + h*line + w*c2*2 + (c%c2)*2
    hh, ww, cc = np.meshgrid(range(h), range(w), range(c), indexing="ij")
    pos = ((cc // c2) * surf + hh * line + ww * c2 * 2 + (cc % c2) * 2) // 2
    np.testing.assert_array_equal(got[pos], x)
    pad = np.ones(got.size, bool)
    pad[pos.ravel()] = False
    assert not got[pad].any()                  # every padding byte zeroed by some part
    back = _layout_both(lambda s, d: host_steps.unpack_cube(s, d, **lay),
                        np.frombuffer(cube, np.uint8), x.nbytes)
    np.testing.assert_array_equal(np.frombuffer(back, np.uint16).reshape(x.shape), x)


@pytest.mark.parametrize("n,k,kh,kw", [(500, 300, 1, 1), (100, 96, 3, 3)])
def test_pack_weight(n, k, kh, kw):
    ng, kg = 16, 32
    wt = RNG.integers(1, 60000, (n, k, kh, kw)).astype(np.uint16)
    np_, kp = -(-n // ng) * ng, -(-k // kg) * kg
    got = _layout_both(lambda s, d: host_steps.pack_weight(
        s, d, kernels=n, channels=k, kh=kh, kw=kw, n_group=ng, k_group=kg, esize=2),
        wt, np_ * kp * kh * kw * 2)
    # [N/ng][K/kg][KH][KW][ng][kg], N and K zero-padded to whole groups (rj_layout.h)
    padded = np.zeros((np_, kp, kh, kw), np.uint16)
    padded[:n, :k] = wt
    want = padded.reshape(np_ // ng, ng, kp // kg, kg, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    assert got == np.ascontiguousarray(want).tobytes()


def test_depthwise_weight_parts_cover_the_layout():
    """Depthwise packs have no host-step kind of their own here: the C parts, each with its
    own zero fill, against the numpy layout and the one-call pack."""
    c, kh, kw, g = 20000, 3, 3, 16
    wt = RNG.integers(1, 60000, (c, kh, kw)).astype(np.uint16)
    cp = -(-c // g) * g
    lay = ffi.new("rj_dw_weight_layout *", {"channels": c, "kh": kh, "kw": kw, "group": g,
                                           "esize": 2})
    whole, parts = np.full(cp * kh * kw, 7, np.uint16), np.full(cp * kh * kw, 7, np.uint16)
    err = ffi.new("rj_err *")
    check(lib.rj_dw_weight_pack(lay, ffi.from_buffer(wt), wt.nbytes, ffi.from_buffer(whole),
                                whole.nbytes, err), err)
    for part in (2, 0, 4, 1, 3):              # any order: the parts are independent
        check(lib.rj_dw_weight_convert_part(lay, 1, ffi.from_buffer(wt), wt.nbytes,
                                            ffi.from_buffer(parts), parts.nbytes, part, 5, err), err)
    padded = np.zeros((cp, kh, kw), np.uint16)
    padded[:c] = wt
    want = padded.reshape(cp // g, g, kh, kw).transpose(0, 2, 3, 1).reshape(-1)
    np.testing.assert_array_equal(whole, want)
    np.testing.assert_array_equal(parts, want)


def test_a_large_input_and_output_convert_on_threads():
    """Program.write_as / read_as of a 1 MiB tensor: the same bits on 3 threads as numpy."""
    x = (RNG.standard_normal(262147) * 3e4).astype(np.float32)
    x[::5] = np.float32(1.0 + 2.0 ** -11)                     # ties round to even
    out = {}
    shutdown_pool()
    for threads in (1, 3):
        set_host_threads(threads)
        dev = NullDevice()
        b = ProgramBuilder(dev)
        bo = b.add_bo(2 * x.size, "io")
        prog = b.build()
        with dev, prog:
            prog.write_as(bo, x, "float16")
            assert pool_workers() == threads - 1          # the 3-thread write did split
            out[threads] = (prog.read(bo, 2 * x.size), prog.read_as(bo, "float16", "float32",
                                                                    x.shape))
    with np.errstate(over="ignore"):                          # |x| > 65504: inf, as in C
        want = x.astype(np.float16)
    assert out[1][0] == out[3][0] == want.tobytes()
    np.testing.assert_array_equal(out[3][1], want.astype(np.float32))


# ---------------------------------------------------------------- the setting and the pool

def test_the_setting_and_its_environment_flag(monkeypatch):
    monkeypatch.delenv("RJ_HOST_THREADS", raising=False)
    assert lib.RJ_HOST_THREADS_DEFAULT == 3
    assert host_threads() == host_default() == max(1, min(3, os.cpu_count() - 1))
    monkeypatch.setenv("RJ_HOST_THREADS", "2")
    assert host_threads() == 2
    set_host_threads(1)                        # the Python setting wins over the flag
    assert host_threads() == 1
    set_host_threads(None)
    monkeypatch.setenv("RJ_HOST_THREADS", "three")
    with pytest.raises(Exception, match="RJ_HOST_THREADS=three is not a thread count"):
        host_threads()
    x = RNG.standard_normal((256, 600)).astype(np.float32)
    with pytest.raises(Exception, match="RJ_HOST_THREADS=three"):   # a run says so too
        _run_layout(lambda s, d: host_steps.pack_cube(s, d, height=256, width=600, channels=1,
                                                      c2=8, esize=4), x, 256 * 600 * 8 * 4, None)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="not a thread count"):
            set_host_threads(bad)
    with pytest.raises(Exception, match="more than the 8"):
        set_host_threads(9)


def _pool_threads() -> int:
    """The pool's live worker threads, by the name the pool gives them: a count of every thread
    in the process would also see JAX's, the sanitizers' and the simulator's own come and go."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == "rj-host"
        except FileNotFoundError:                 # a thread that ended while we looked
            pass
    return n


def _pool_threads_after_join() -> int:
    """``_pool_threads`` once joined workers are gone: the kernel lets a join return when the
    thread's id is released, a moment before its /proc entry goes."""
    deadline = time.monotonic() + 2.0
    while _pool_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _pool_threads()


def test_pool_starts_on_a_split_and_joins_at_shutdown():
    shutdown_pool()
    assert pool_workers() == 0 and _pool_threads_after_join() == 0
    x = RNG.standard_normal((256, 513)).astype(np.float32)
    assert run_threads("copy", x.shape, np.zeros_like(x), _v("o", F32, x), [(x, _v("x", F32, x))],
                       3) == 3
    assert pool_workers() == 2 and _pool_threads() == 2
    shutdown_pool()
    assert pool_workers() == 0 and _pool_threads_after_join() == 0   # joined, none left behind
    small = np.ones(1000, np.float32)
    out = np.zeros_like(small)
    desc = encode_descriptor("copy", small.shape, [HostView("o", F32, 0, [1]),
                                                   HostView("x", F32, 0, [1])])
    d = ffi.new("rj_host_op *")
    ffi.memmove(d, desc.tobytes(), desc.nbytes)
    assert int(lib.rj_host_op_plan_threads(d, 3)) == 1     # below the threshold: one thread
    bufs = ffi.new("rj_host_buf[]", [(ffi.from_buffer(out), out.nbytes),
                                     (ffi.from_buffer(small), small.nbytes)])
    used, err = ffi.new("uint32_t *"), ffi.new("rj_err *")
    check(lib.rj_host_op_run_threads(d, bufs, 2, 3, ffi.NULL, used, err), err)
    assert used[0] == 1 and np.array_equal(out, small)
    assert pool_workers() == 0                              # a small step starts no worker


# ---------------------------------------------------------------- concurrent calls

def _take_add(x, idx):
    return jnp.take(x, idx, axis=0) + 1.0


def _col_sum(x):
    return jnp.sum(x * 0.5, axis=0)


def test_concurrent_calls_with_split_host_steps():
    """Six Python threads call two compiled functions whose host steps split; a call that finds
    the pool busy runs alone. Every result against numpy, none lost, no hang."""
    set_host_threads(3)
    x = RNG.standard_normal((4096, 64)).astype(np.float32)
    idxs = [RNG.integers(0, 4096, 2048).astype(np.int32) for _ in range(6)]
    xs = [RNG.standard_normal((4096, 64)).astype(np.float32) for _ in range(6)]
    f = rockjit.compile(_take_add, backend="sim")
    g = rockjit.compile(_col_sum, backend="sim")
    f(x, idxs[0]), g(xs[0])                    # compiled once, before the race
    before = f.compiled(x, idxs[0]).stats()
    assert before["rt_host_threads"] > before["rt_host_steps"]   # it does split
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work(k: int) -> None:
        start.wait()
        try:
            for _ in range(4):
                np.testing.assert_allclose(np.asarray(f(x, idxs[k])), x[idxs[k]] + 1.0,
                                           rtol=2e-3, atol=2e-3)
                np.testing.assert_allclose(np.asarray(g(xs[k])), xs[k].sum(axis=0) * 0.5,
                                           rtol=2e-2, atol=0.2)
        except BaseException as e:             # collected: a thread's failure fails the test
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a calling thread hung"
    assert not errors, errors[:3]
