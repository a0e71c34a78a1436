#!/usr/bin/env python3
"""10_lut_exp_shifted_fp16: expected output from the maths of the op (numpy, float64), independent of any
simulator. Reads program/blobs/input.bin, writes expected_output.bin (fp16)."""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def compute(x):
    # inputs outside the table domain [-16, 0] hold the end entry (slopes 0)
    return np.exp(np.clip(x, -16.0, 0.0))

if __name__ == "__main__":
    x = np.fromfile(os.path.join(HERE, "program", "blobs", "input.bin"), dtype="<f2")[:1024]
    compute(x.astype(np.float64)).astype("<f2").tofile(os.path.join(HERE, "expected_output.bin"))
