"""Host-op steps inside runtime programs: HOST_RULES programs placed in BOs, added with
rockjit.runtime.host_steps.HOST_STEPS and run by rj_program_run (one C call), compared with
the numpy reference; the program's host counters; the step-level error paths; and a traced
JAX function compiled by rockjit whose host ops go through this library."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.ir.ops import Op
from rockjit.ir.types import DType, TensorType
from rockjit.lowering.host_rules import HostView, encode_descriptor, lower_on_host
from rockjit.lowering.op_lowering import OpLowering
from rockjit.runtime import NullDevice, Operand, ProgramBuilder, host_steps
from rockjit.runtime.errors import AddressError, ProgramError

from host_ops_testutil import assert_exact, gen, make_node, reference

RNG = np.random.default_rng(99)


def _align(x: int, a: int = 64) -> int:
    return -(-x // a) * a


class Placed:
    """One OpLowering in a NullDevice program: io buffers in an arena BO, descriptors in the
    weights BO (uploaded before the steps are added, as the pipeline does)."""

    def __init__(self, prog: OpLowering, inputs, add_steps: bool = True) -> None:
        self.dev = NullDevice()
        self.b = ProgramBuilder(self.dev)
        self.at: dict[str, tuple[int, int]] = {}
        io = [s for s in prog.buffers if s.role != "const"]
        consts = [s for s in prog.buffers if s.role == "const"]
        arena = self.b.add_bo(max(64, sum(_align(max(s.nbytes, 1)) for s in io)), "arena")
        weights = self.b.add_bo(max(64, sum(_align(s.nbytes) for s in consts)), "weights")
        for bo, specs in ((arena, io), (weights, consts)):
            off = 0
            for s in specs:
                self.at[s.name] = (bo, off)
                off += _align(max(s.nbytes, 1))
        for s in consts:
            self.b.upload(self.at[s.name][0], s.data, self.at[s.name][1])
        for s in io:
            if s.role == "input" and s.nbytes:
                arr = np.array(inputs[s.bind], dtype=DType(s.dtype).to_numpy(), order="C")
                self.b.upload(self.at[s.name][0], arr.reshape(-1).view(np.uint8), self.at[s.name][1])
        self.prog = prog
        if add_steps:
            for st in prog.steps:
                self.b.add_host_step(self.step(st))

    def step(self, st):
        ops = {k: Operand(self.at[sl.buffer][0], self.at[sl.buffer][1] + sl.offset)
               for k, sl in st.operands.items()}
        return host_steps.HOST_STEPS[st.kind](**ops)

    def run(self) -> tuple[np.ndarray, dict]:
        p = self.b.build()
        p.run()
        out = next(s for s in self.prog.buffers if s.role == "output")
        bo, off = self.at["out"]
        got = p.read_array(bo, DType(out.dtype).to_numpy(), out.shape, off)
        stats = p.stats()
        p.close()
        self.dev.close()
        return got, stats


def t(dtype, shape):
    return TensorType(dtype, tuple(shape))


CASES = [
    (Op.ADD, [t(DType.F16, (3, 5))] * 2, {}, None),
    (Op.TAKE, [t(DType.F32, (20, 8)), t(DType.I32, (2, 3))], {"axis": 0}, None),
    (Op.SELECT_N, [t(DType.I32, (4, 4))] + [t(DType.I8, (4, 4))] * 3, {}, None),
    (Op.REDUCE_MAX, [t(DType.BF16, (3, 7, 2))], {"axes": (1,)}, None),
    (Op.PAD, [t(DType.F32, (3, 3)), t(DType.F32, ())],
     {"low": (1, -1), "high": (0, 2), "interior": (1, 0)}, None),
    (Op.CONCATENATE, [t(DType.I64, (2, 3)), t(DType.I64, (2, 1))], {"dimension": 1}, None),
    (Op.IOTA, [], {"dimension": 1}, t(DType.I32, (3, 6))),
    (Op.TRANSPOSE, [t(DType.F16, (2, 3, 4))], {"permutation": (1, 2, 0)}, None),
    (Op.CONVERT, [t(DType.F32, (10,))], {}, t(DType.U8, (10,))),
    (Op.LOGISTIC, [t(DType.F32, (2, 9))], {}, None),
]


@pytest.mark.parametrize("op,in_types,attrs,out_type", CASES, ids=[c[0].text for c in CASES])
def test_host_ops_in_a_program(op, in_types, attrs, out_type):
    node = make_node(op, in_types, attrs, out_type)
    ins = [gen(RNG, ty.dtype, ty.shape) for ty in in_types]
    if op is Op.TAKE:
        ins[1] = RNG.integers(-20, 20, (2, 3)).astype(np.int32)
    if op is Op.SELECT_N:
        ins[0] = RNG.integers(0, 3, (4, 4)).astype(np.int32)
    prog = lower_on_host(node)
    got, st = Placed(prog, ins).run()
    ref = reference(node, ins)
    if op is Op.LOGISTIC:
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    else:
        assert_exact(got, ref, op.text)
    assert st["host_steps"] == len(prog.steps) and st["runs"] == 1
    assert st["host_bytes"] > 0


def test_host_byte_count_of_a_binary_step():
    node = make_node(Op.MUL, [t(DType.F32, (6, 10))] * 2)
    a, b = (RNG.standard_normal((6, 10)).astype(np.float32) for _ in range(2))
    got, st = Placed(lower_on_host(node), [a, b]).run()
    np.testing.assert_array_equal(got, a * b)
    assert st["host_bytes"] == 3 * 6 * 10 * 4  # two inputs read, one output written


def test_step_errors_at_add_time():
    node = make_node(Op.SUB, [t(DType.F32, (4,))] * 2)
    prog = lower_on_host(node)
    (st,) = prog.steps
    pl = Placed(prog, [np.zeros(4, np.float32)] * 2, add_steps=False)
    arena, _ = pl.at["in0"]
    weights, doff = pl.at["desc0"]
    ops = {k: Operand(*pl.at[sl.buffer]) for k, sl in st.operands.items()}

    # a descriptor that was never written
    empty = pl.b.add_bo(448, "weights")
    with pytest.raises(ProgramError, match="no host-op descriptor at BO .* write the op's "
                                           "descriptor bytes"):
        pl.b.add_host_step(host_steps.host_op("binary", **{**ops, "desc": Operand(empty, 0)}))
    # the step kind must be the descriptor's kind
    with pytest.raises(ProgramError, match="host step unary: its descriptor describes a binary op"):
        pl.b.add_host_step(host_steps.host_op("unary", **ops))
    # an operand the op does not have
    with pytest.raises(ProgramError, match=r"param\[1\] \(input 3\) is set but the op has 2 inputs"):
        pl.b.add_host_step(host_steps.host_op("binary", **ops, src2=Operand(arena, 0)))
    # a BO index the program does not have
    with pytest.raises(ProgramError, match="dst \\(output\\) names BO 7"):
        pl.b.add_host_step(host_steps.host_op("binary", **{**ops, "dst": Operand(7, 0)}))
    # row strides belong to the descriptor
    with pytest.raises(ProgramError, match="operand row strides must be 0"):
        pl.b.add_host_step(host_steps.host_op("binary", **{**ops, "src": Operand(arena, 0, "f32", 64)}))
    # an output placed so close to the arena's end that the view runs past it
    size = pl.b.bo_info(arena).size
    with pytest.raises(AddressError, match="output .* reaches element 3 .* holds 8 bytes"):
        pl.b.add_host_step(host_steps.host_op("binary", **{**ops, "dst": Operand(arena, size - 8)}))
    pl.b.add_host_step(pl.step(st))  # the well-formed step is accepted
    pl.dev.close()


def test_out_of_range_index_fails_the_run_naming_step_and_index():
    node = make_node(Op.TAKE, [t(DType.F32, (5, 2)), t(DType.I32, (3,))], {"axis": 0})
    pl = Placed(lower_on_host(node), [np.zeros((5, 2), np.float32), np.array([1, 9, 2], np.int32)])
    p = pl.b.build()
    with pytest.raises(ProgramError, match=r"step 0: .*index 9 \(indices element 1\) is out of "
                                           r"range for an axis of size 5"):
        p.run()
    assert p.stats()["runs"] == 0
    p.close()
    pl.dev.close()


def test_unknown_host_op_kind_name():
    with pytest.raises(ProgramError, match="host-op kind 'gatherr' is not one of"):
        host_steps.host_op("gatherr", Operand(0), Operand(0))


# ---------------------------------------------------------------- through rockjit.compile

def _embed_and_mask(table, ids, x):
    e = jnp.take(table, ids, axis=0)            # gather: host take
    m = jnp.where(x > 0, x, -x) * 3 + 1         # compare, select_n, integer math on the host
    return e, jnp.max(m, axis=1), jnp.arange(6, dtype=jnp.int32) * ids[0]


def test_compiled_function_runs_host_ops_like_jax():
    table = RNG.standard_normal((12, 5)).astype(np.float32)
    ids = np.array([3, 11, 0, 7], np.int32)
    x = RNG.integers(-9, 9, (3, 6)).astype(np.int32)
    f = rockjit.compile(_embed_and_mask, backend="sim")
    got = f(table, ids, x)
    want = jax.jit(_embed_and_mask)(table, ids, x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    st = f.stats()
    assert st["rt_host_steps"] >= 4 and st["rt_host_bytes"] > 0 and st["rt_npu_steps"] == 0
