#!/usr/bin/env python3
"""21_int8_perchannel_requant_depthwise: TFLite's per-channel int8 depthwise arithmetic followed by the
BS stage's per-channel multiplier, in numpy (int64), independent of any simulator:
acc[c] = sum over the valid taps of (x[c] - in_zp)(w[c] - w_zp[c]) + bias[c];
v = sat32(rne(acc * C[c] / 2^(s if acc*C >= 0 else s_neg)));  out = sat8(rne(v * SCALE / 2^SHIFT) + out_zp).
Reads the packed blobs and the unfolded per-channel parameters (perchannel_tflite.npz), writes
expected_output.bin."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tflite_int8 import (accumulate, read_feature, requant_out, rne, shifted_input,  # noqa: E402
                         write_output)

C, H, W, KH, KW, PAD = 64, 6, 5, 3, 3, 1
IN_ZP, OUT_ZP, S_POS, S_NEG, SCALE, SHIFT = -37, 5, 14, 13, 17675, 23


def main():
    # weights [C/64][KH][KW][64] int8
    w = np.fromfile(os.path.join(HERE, "program", "blobs", "weight.bin"), np.int8)[:C * KH * KW]
    w = w.reshape(C // 64, KH, KW, 64).transpose(0, 3, 1, 2).reshape(C, KH, KW)
    prm = np.load(os.path.join(HERE, "perchannel_tflite.npz"))
    w_zp, bias, mult = (prm[k].astype(np.int64) for k in ("w_zp", "bias", "mult"))
    xp = shifted_input(read_feature(HERE, C, H, W), IN_ZP, PAD)
    acc = accumulate(xp, w.astype(np.int64) - w_zp[:, None, None], KH, KW, depthwise=True)
    p = (acc + bias[:, None, None]) * mult[:, None, None]
    v = np.clip(np.where(p >= 0, rne(p, S_POS), rne(p, S_NEG)), -2 ** 31, 2 ** 31 - 1)
    write_output(HERE, requant_out(v, SCALE, SHIFT, OUT_ZP))


if __name__ == "__main__":
    main()
