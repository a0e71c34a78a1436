#!/usr/bin/env python3
"""12_lut_elu_quirk2_faithful: expected output from the maths of the op (numpy, float64), independent of any
simulator. Reads program/blobs/input.bin, writes expected_output.bin (fp16)."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def compute(x):
    y = np.where(x >= 0, x, np.expm1(np.minimum(x, 0)))
    # QUIRK 2 (notes dpu-lut-activation.md): a signed decode spikes by +128 where
    # the pre-bias index x*BN_MUL (BN_MUL = 1024) is within half an index unit of 0
    bn_mul = float(np.float16(1024.0))
    return np.where(np.abs(np.float32(x) * np.float32(bn_mul)) < 0.5, y + 128.0, y)

if __name__ == "__main__":
    x = np.fromfile(os.path.join(HERE, "program", "blobs", "input.bin"), dtype="<f2")[:4008]
    compute(x.astype(np.float64)).astype("<f2").tofile(os.path.join(HERE, "expected_output.bin"))
