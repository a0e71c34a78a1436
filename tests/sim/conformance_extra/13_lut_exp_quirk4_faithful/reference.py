#!/usr/bin/env python3
"""13_lut_exp_quirk4_faithful: expected output from the maths of the op (numpy, float64), independent of any
simulator. Reads program/blobs/input.bin, writes expected_output.bin (fp16)."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def compute(x):
    # the table rocket-userspace builds with ROCKET_LUT_QFLOOR=0: q = round(exp(x_j) 2^15)
    dx = 16.0 / 512
    q = np.clip(np.rint(np.exp(-16.0 + np.arange(513) * dx) * 32768.0), 0, 32767)
    j = np.clip(np.floor((x + 16.0) / dx).astype(int), 0, 511)
    # QUIRK 4 (notes dpu-lut-activation.md): reading a q = 0 entry emits ~4.0
    return np.where((q[j] == 0) | (q[j + 1] == 0), 4.0, np.exp(x))

if __name__ == "__main__":
    x = np.fromfile(os.path.join(HERE, "program", "blobs", "input.bin"), dtype="<f2")[:512]
    compute(x.astype(np.float64)).astype("<f2").tofile(os.path.join(HERE, "expected_output.bin"))
