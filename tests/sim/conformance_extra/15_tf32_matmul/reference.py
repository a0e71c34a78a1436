#!/usr/bin/env python3
"""15_tf32_matmul: C = tf32(A) . tf32(B)^T in float64 (tf32 = fp32 rounded to a 10-bit mantissa,
nearest even), independent of any simulator. Layouts in case.md."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
M, K, N = 8, 64, 32


def tf32(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def blob(name):
    return np.fromfile(os.path.join(HERE, "program", "blobs", name + ".bin"), dtype="<f4")


a = blob("feature")[:M * K].reshape(K // 4, M, 4).transpose(1, 0, 2).reshape(M, K)
b = blob("weight")[:N * K].reshape(N // 16, K // 16, 16, 16).transpose(0, 2, 1, 3).reshape(N, K)
c = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64).T
# output cube [N/4][M][4] fp32
c.astype(np.float32).reshape(M, N // 4, 4).transpose(1, 0, 2).astype("<f4").tofile(
    os.path.join(HERE, "expected_output.bin"))
