#!/usr/bin/env python3
"""19_int8_requant_cpend_depthwise: TFLite's int8 depthwise conv arithmetic in numpy (int64), independent of any simulator:
acc[c] = sum over the valid taps of (x[c] - in_zp)(w[c] - w_zp) + bias[c]; out = sat8(round_half_even(
acc * SCALE / 2^SHIFT) + out_zp). Reads the packed blobs (layouts in case.md), writes expected_output.bin."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tflite_int8 import accumulate, read_feature, requant_out, shifted_input, write_output  # noqa: E402

C, H, W, KH, KW, PAD = 64, 6, 5, 3, 3, 1
IN_ZP, W_ZP, OUT_ZP, SCALE, SHIFT = -100, 90, 3, 17675, 24


def main():
    # weights [C/64][KH][KW][64] int8
    w = np.fromfile(os.path.join(HERE, "program", "blobs", "weight.bin"), np.int8)[:C * KH * KW]
    w = w.reshape(C // 64, KH, KW, 64).transpose(0, 3, 1, 2).reshape(C, KH, KW)
    bias = np.fromfile(os.path.join(HERE, "bias_tflite.bin"), dtype="<i4").astype(np.int64)
    xp = shifted_input(read_feature(HERE, C, H, W), IN_ZP, PAD)
    acc = accumulate(xp, w.astype(np.int64) - W_ZP, KH, KW, depthwise=True) + bias[:, None, None]
    write_output(HERE, requant_out(acc, SCALE, SHIFT, OUT_ZP))


if __name__ == "__main__":
    main()
