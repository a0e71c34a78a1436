#!/usr/bin/env python3
"""14_int8_requant_cpend_conv: TFLite's int8 conv arithmetic in numpy (float64/int64), independent of any simulator:
acc = sum over the valid taps of (x - in_zp)(w - w_zp) + bias; out = sat8(round_half_even(acc * SCALE
/ 2^SHIFT) + out_zp). Reads the packed blobs (layouts in case.md), writes expected_output.bin."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tflite_int8 import accumulate, read_feature, requant_out, shifted_input, write_output  # noqa: E402

C, H, W, N, KH, KW, PAD = 32, 6, 5, 32, 3, 3, 1
IN_ZP, W_ZP, OUT_ZP, SCALE, SHIFT = 37, 25, -20, 17675, 25


def main():
    # weights [N/32][C/32][KH][KW][32 kernels][32 channels] int8
    w = np.fromfile(os.path.join(HERE, "program", "blobs", "weight.bin"), np.int8)[:N * C * KH * KW]
    w = w.reshape(N // 32, C // 32, KH, KW, 32, 32).transpose(0, 4, 1, 5, 2, 3).reshape(N, C, KH, KW)
    bias = np.fromfile(os.path.join(HERE, "bias_tflite.bin"), dtype="<i4").astype(np.int64)
    xp = shifted_input(read_feature(HERE, C, H, W), IN_ZP, PAD)
    acc = accumulate(xp, w.astype(np.int64) - W_ZP, KH, KW, depthwise=False) + bias[:, None, None]
    write_output(HERE, requant_out(acc, SCALE, SHIFT, OUT_ZP))


if __name__ == "__main__":
    main()
