#!/usr/bin/env python3
"""19_int8_requant_cpend_depthwise: TFLite's int8 depthwise conv arithmetic in numpy (int64), independent of any simulator:
acc[c] = sum over the valid taps of (x[c] - in_zp)(w[c] - w_zp) + bias[c]; out = sat8(round_half_even(
acc * SCALE / 2^SHIFT) + out_zp). Reads the packed blobs (layouts in case.md), writes expected_output.bin."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
C, H, W, KH, KW, PAD = 64, 6, 5, 3, 3, 1
IN_ZP, W_ZP, OUT_ZP, SCALE, SHIFT = -100, 90, 3, 17675, 24


def blob(name, dtype):
    return np.fromfile(os.path.join(HERE, "program", "blobs", name + ".bin"), dtype=dtype)


def main():
    # feature [C/16][H][W][16] int8; weights [C/64][KH][KW][64] int8
    x = blob("feature", np.int8)[:C * H * W].reshape(C // 16, H, W, 16).transpose(0, 3, 1, 2)
    x = x.reshape(C, H, W).astype(np.int64)
    w = blob("weight", np.int8)[:C * KH * KW].reshape(C // 64, KH, KW, 64).transpose(0, 3, 1, 2)
    w = w.reshape(C, KH, KW).astype(np.int64)
    bias = np.fromfile(os.path.join(HERE, "bias_tflite.bin"), dtype="<i4").astype(np.int64)
    oh, ow = H + 2 * PAD - KH + 1, W + 2 * PAD - KW + 1
    xp = np.zeros((C, H + 2 * PAD, W + 2 * PAD), np.int64)   # (x - in_zp) is 0 in the padding
    xp[:, PAD:PAD + H, PAD:PAD + W] = x - IN_ZP
    acc = np.zeros((C, oh, ow), np.int64)
    for ky in range(KH):
        for kx in range(KW):
            acc += xp[:, ky:ky + oh, kx:kx + ow] * (w[:, ky, kx] - W_ZP)[:, None, None]
    acc += bias[:, None, None]
    out = np.clip(np.round(acc * SCALE / 2.0 ** SHIFT).astype(np.int64) + OUT_ZP, -128, 127)
    # output cube [C/16][OH][OW][16] int8
    out.reshape(C // 16, 16, oh, ow).transpose(0, 2, 3, 1).astype(np.int8).tofile(
        os.path.join(HERE, "expected_output.bin"))


if __name__ == "__main__":
    main()
