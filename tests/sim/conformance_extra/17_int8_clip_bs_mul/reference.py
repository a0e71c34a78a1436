#!/usr/bin/env python3
"""17_int8_clip_bs_mul: conformance 03's int8 matmul with the integer DPU arithmetic written out in
numpy (int64), independent of any simulator: acc -> CLIP_TRUNCATE round (half away) -> + bias ->
x MUL -> shift by S_POS (product >= 0) or S_NEG (< 0), half to even -> sat int32. Layouts in case.md."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
M, K, N = 8, 64, 64
T, MUL, S_POS, S_NEG = 1, 77, 6, 3


def blob(name, dtype):
    return np.fromfile(os.path.join(HERE, "program", "blobs", name + ".bin"), dtype=dtype)


def rne(v, s):
    return np.round(v.astype(np.float64) / 2.0 ** s).astype(np.int64)


a = blob("feature", np.int8)[:M * K].reshape(K // 16, M, 16).transpose(1, 0, 2).reshape(M, K).astype(np.int64)
b = blob("weight", np.int8)[:N * K].reshape(N // 32, K // 32, 32, 32).transpose(0, 2, 1, 3).reshape(N, K)
acc = a @ b.astype(np.int64).T
v = acc / 2.0 ** T
acc = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)
p = (acc + blob("bias", "<i4").astype(np.int64)[None, :]) * MUL
out = np.clip(np.where(p >= 0, rne(p, S_POS), rne(p, S_NEG)), -2 ** 31, 2 ** 31 - 1)
# output cube [N/4][M][4] int32
out.reshape(M, N // 4, 4).transpose(1, 0, 2).astype("<i4").tofile(os.path.join(HERE, "expected_output.bin"))
