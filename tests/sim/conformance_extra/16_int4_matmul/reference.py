#!/usr/bin/env python3
"""16_int4_matmul: C = A . B^T in int64 from nibble-packed int4 operands, saturated to int16,
independent of any simulator. Layouts in case.md."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
M, K, N = 8, 64, 128


def nibbles(name, count):
    raw = np.fromfile(os.path.join(HERE, "program", "blobs", name + ".bin"), dtype=np.uint8)[:count // 2]
    v = np.empty(count, np.int64)
    v[0::2], v[1::2] = raw & 0xF, raw >> 4          # element 2i in the low nibble
    return np.where(v >= 8, v - 16, v)


a = nibbles("feature", M * K).reshape(K // 32, M, 32).transpose(1, 0, 2).reshape(M, K)
b = nibbles("weight", N * K).reshape(N // 64, K // 32, 64, 32).transpose(0, 2, 1, 3).reshape(N, K)
c = np.clip(a @ b.T, -32768, 32767)
# output cube [N/8][M][8] int16
c.reshape(M, N // 8, 8).transpose(1, 0, 2).astype("<i2").tofile(os.path.join(HERE, "expected_output.bin"))
