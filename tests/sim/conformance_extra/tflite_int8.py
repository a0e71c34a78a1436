"""TFLite's int8 conv arithmetic, shared by the requantizing conv cases' references (14, 19, 21):
numpy int64/float64, independent of any simulator. Each case's reference.py holds its own
constants and the parts it alone has (weight layout, per-channel stage)."""
import os

import numpy as np


def rne(v, s):
    """v / 2^s rounded half to even."""
    return np.round(v.astype(np.float64) / 2.0 ** s).astype(np.int64)


def read_feature(here, c, h, w):
    """The input cube [C/16][H][W][16] int8 of program/blobs/feature.bin as [C, H, W] int64."""
    x = np.fromfile(os.path.join(here, "program", "blobs", "feature.bin"), np.int8)[:c * h * w]
    return x.reshape(c // 16, h, w, 16).transpose(0, 3, 1, 2).reshape(c, h, w).astype(np.int64)


def shifted_input(x, in_zp, pad):
    """x - in_zp, zero-padded by `pad` on each side ((x - in_zp) is 0 in the padding)."""
    c, h, w = x.shape
    xp = np.zeros((c, h + 2 * pad, w + 2 * pad), np.int64)
    xp[:, pad:pad + h, pad:pad + w] = x - in_zp
    return xp


def accumulate(xp, wc, kh, kw, depthwise):
    """sum over the taps of xp * wc at stride 1: wc [N, C, KH, KW] (wc [C, KH, KW] depthwise),
    already corrected by the weight zero point."""
    oh, ow = xp.shape[1] - kh + 1, xp.shape[2] - kw + 1
    acc = np.zeros((wc.shape[0], oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            win = xp[:, ky:ky + oh, kx:kx + ow]
            if depthwise:
                acc += win * wc[:, ky, kx][:, None, None]
            else:
                acc += np.einsum("chw,nc->nhw", win, wc[:, :, ky, kx])
    return acc


def requant_out(v, scale, shift, out_zp):
    """sat8(round_half_even(v * scale / 2^shift) + out_zp)."""
    return np.clip(rne(v * scale, shift) + out_zp, -128, 127)


def write_output(here, out):
    """[N, OH, OW] int8 as the output cube [N/16][OH][OW][16] into expected_output.bin."""
    n, oh, ow = out.shape
    out.reshape(n // 16, 16, oh, ow).transpose(0, 2, 3, 1).astype(np.int8).tofile(
        os.path.join(here, "expected_output.bin"))
