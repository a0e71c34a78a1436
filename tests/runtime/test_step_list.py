"""One C call runs a whole step list of host steps and NPU jobs: pack the row-major input into
its cube, run conformance case 01's matmul job, unpack the output cube, take the row max (a host op).
References are numpy on the case's own blobs, decoded with the byte formulas of its case.md."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.host_rules import HostView, encode_descriptor
from rockjit.runtime import Operand, ProgramBuilder, RocketDevice, SimDevice, host_abi, host_steps

from .conftest import CONFORMANCE, add_case

M, K, N = 8, 64, 32  # case 01: C[8,32] = A[8,64] . B[32,64]^T, fp16


def case01_operands() -> tuple[np.ndarray, np.ndarray]:
    """A[M,K] and B[N,K] from case 01's blobs: input byte(m,k) = 2*((k//8)*M*8 + m*8 + k%8),
    weight byte(n,k) = 2*(((n//16)*2 + k//32)*512 + (n%16)*32 + k%32) (case.md)."""
    d = CONFORMANCE / "01_matmul_fp16" / "program" / "blobs"
    a_raw = np.fromfile(d / "input.bin", dtype=np.float16)
    w_raw = np.fromfile(d / "weight.bin", dtype=np.float16)
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    a = a_raw[(k // 8) * M * 8 + m * 8 + k % 8]
    n, k = np.meshgrid(np.arange(N), np.arange(K), indexing="ij")
    b = w_raw[((n // 16) * 2 + k // 32) * 512 + (n % 16) * 32 + k % 32]
    return a, b


@pytest.mark.parametrize("make", [SimDevice, lambda: RocketDevice(fake=True)], ids=["sim", "rocket_fake"])
def test_host_and_npu_steps_in_one_run(make, fake):
    a, b = case01_operands()
    with make() as dev:
        pb = ProgramBuilder(dev)
        lc = add_case(pb, "01_matmul_fp16")
        a_in = pb.add_bo(a.nbytes, "io")
        c_out = pb.add_bo(M * N * 2, "io")
        row_max = pb.add_bo(M * 2, "io")
        # reduce max over axis 1 of the f16 [M, N] result; the output view skips that axis
        desc = pb.add_bo(host_abi.DESC_BYTES, "io")
        pb.upload(desc, encode_descriptor("reduce", (M, N), [HostView("o", DType.F16, 0, (1, 0)),
                                                             HostView("c", DType.F16, 0, (N, 1))],
                                          code=host_abi.REDUCE["max"], axis_mask=0b10))
        pb.upload(lc.bos["input"], bytes(M * K * 2))  # the cube now comes only from the pack step
        pb.upload(a_in, a)
        cube = dict(height=M, width=1, channels=K, c2=8, esize=2)
        pb.add_host_step(host_steps.pack_cube(Operand(a_in), Operand(lc.bos["input"]), **cube))
        pb.add_npu_step(lc.jobs)
        out = dict(height=M, width=1, channels=N, c2=8, esize=2)
        pb.add_host_step(host_steps.unpack_cube(Operand(lc.out_bo), Operand(c_out), **out))
        pb.add_host_step(host_steps.host_op("reduce", Operand(row_max), Operand(desc), Operand(c_out)))
        prog = pb.build()
        prog.run()
        want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16)
        got = prog.read_array(c_out, np.float16, (M, N))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(prog.read_array(row_max, np.float16, (M,)), want.max(axis=1))
        st = prog.stats()
        assert (st["runs"], st["steps"], st["npu_steps"], st["host_steps"]) == (1, 4, 1, 3)
        # a second run repeats the whole list (the pack re-reads the row-major input)
        pb_input = a.copy()
        pb_input[0] *= 2
        prog.write(a_in, pb_input)
        prog.run()
        want2 = (pb_input.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16)
        np.testing.assert_array_equal(prog.read_array(c_out, np.float16, (M, N)), want2)
        prog.close()
