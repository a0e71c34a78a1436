#!/usr/bin/env python3
"""20_int8_matmul_fp16_out: C = A . B^T in int64 (|C| <= 2048, exact in fp16), written as fp16,
independent of any simulator. Layouts in case.md."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
M, K, N = 8, 64, 64


def blob(name):
    return np.fromfile(os.path.join(HERE, "program", "blobs", name + ".bin"), dtype=np.int8)


a = blob("feature")[:M * K].reshape(K // 16, M, 16).transpose(1, 0, 2).reshape(M, K).astype(np.int64)
b = blob("weight")[:N * K].reshape(N // 32, K // 32, 32, 32).transpose(0, 2, 1, 3).reshape(N, K)
c = a @ b.astype(np.int64).T
assert np.abs(c).max() <= 2048
# output cube [N/8][M][8] fp16
c.astype(np.float16).reshape(M, N // 8, 8).transpose(1, 0, 2).astype("<f2").tofile(
    os.path.join(HERE, "expected_output.bin"))
