#!/usr/bin/env python3
"""21_int8_perchannel_requant_depthwise: TFLite's per-channel int8 depthwise arithmetic followed by the
BS stage's per-channel multiplier, in numpy (int64), independent of any simulator:
acc[c] = sum over the valid taps of (x[c] - in_zp)(w[c] - w_zp[c]) + bias[c];
v = sat32(rne(acc * C[c] / 2^(s if acc*C >= 0 else s_neg)));  out = sat8(rne(v * SCALE / 2^SHIFT) + out_zp).
Reads the packed blobs and the unfolded per-channel parameters (perchannel_tflite.npz), writes
expected_output.bin."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
C, H, W, KH, KW, PAD = 64, 6, 5, 3, 3, 1
IN_ZP, OUT_ZP, S_POS, S_NEG, SCALE, SHIFT = -37, 5, 14, 13, 17675, 23


def rne(v, s):
    return np.round(v.astype(np.float64) / 2.0 ** s).astype(np.int64)


def main():
    x = np.fromfile(os.path.join(HERE, "program", "blobs", "feature.bin"), np.int8)[:C * H * W]
    x = x.reshape(C // 16, H, W, 16).transpose(0, 3, 1, 2).reshape(C, H, W).astype(np.int64)
    w = np.fromfile(os.path.join(HERE, "program", "blobs", "weight.bin"), np.int8)[:C * KH * KW]
    w = w.reshape(C // 64, KH, KW, 64).transpose(0, 3, 1, 2).reshape(C, KH, KW).astype(np.int64)
    prm = np.load(os.path.join(HERE, "perchannel_tflite.npz"))
    w_zp, bias, mult = (prm[k].astype(np.int64) for k in ("w_zp", "bias", "mult"))
    oh, ow = H + 2 * PAD - KH + 1, W + 2 * PAD - KW + 1
    xp = np.zeros((C, H + 2 * PAD, W + 2 * PAD), np.int64)   # (x - in_zp) is 0 in the padding
    xp[:, PAD:PAD + H, PAD:PAD + W] = x - IN_ZP
    acc = np.zeros((C, oh, ow), np.int64)
    for ky in range(KH):
        for kx in range(KW):
            acc += xp[:, ky:ky + oh, kx:kx + ow] * (w[:, ky, kx] - w_zp)[:, None, None]
    acc += bias[:, None, None]
    p = acc * mult[:, None, None]
    v = np.clip(np.where(p >= 0, rne(p, S_POS), rne(p, S_NEG)), -2 ** 31, 2 ** 31 - 1)
    out = np.clip(rne(v * SCALE, SHIFT) + OUT_ZP, -128, 127)
    # output cube [C/16][OH][OW][16] int8
    out.reshape(C // 16, 16, oh, ow).transpose(0, 2, 3, 1).astype(np.int8).tofile(
        os.path.join(HERE, "expected_output.bin"))


if __name__ == "__main__":
    main()
