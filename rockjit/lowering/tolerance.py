"""The one tolerance rule for comparing NPU results with the numpy reference.

fp16 has an 11-bit significand, so each rounding to fp16 moves a value by at most
u = 2**-11 of its magnitude (round-to-nearest-even).  A result is accepted when, element by
element, ``|got - ref| <= bound`` with the bound derived from where fp16 roundings happen:

* matmul / conv (fp16 operands, fp32 accumulation, fp16 or fp32 output): both operands are
  rounded to fp16 (each product then carries up to ~2u of relative error), the fp32 sum adds
  negligible error for the K we run (K·2**-24 << u), and an fp16 output adds u·|ref|:
  ``bound = 2u · (|A|·|B|ᵀ) + u·|ref| (fp16 out)``.
* element-wise (inputs rounded once, one op, output rounded once):
  ``bound = rounds · u · (|x| + |y| + |ref|)`` with the operands' magnitudes.
* a LUT activation: the table's documented interpolation error (per function, stated by the
  emitter that builds the table) plus the fp16 roundings above.

int8 paths are exact: integer arithmetic with int32 accumulation.  A tiny absolute floor
(``FLOOR``) absorbs fp16's subnormal spacing near zero.
"""
from __future__ import annotations

import numpy as np

U16 = 2.0 ** -11          # unit roundoff of fp16
FLOOR = 2.0 ** -24        # fp16's smallest subnormal step


def matmul_bound(a: np.ndarray, b_nk: np.ndarray, fp16_out: bool = True) -> np.ndarray:
    """Bound for C = A·Bᵀ with A [..., M, K] and B [..., N, K] (fp16 operands)."""
    mag = np.abs(a.astype(np.float64)) @ np.swapaxes(np.abs(b_nk.astype(np.float64)), -1, -2)
    ref = a.astype(np.float64) @ np.swapaxes(b_nk.astype(np.float64), -1, -2)
    return 2 * U16 * mag + (U16 * np.abs(ref) if fp16_out else 0.0) + FLOOR


def elementwise_bound(ref: np.ndarray, *operands: np.ndarray, rounds: int = 2) -> np.ndarray:
    mag = np.abs(np.asarray(ref, np.float64))
    for x in operands:
        mag = mag + np.abs(np.asarray(x, np.float64))
    return rounds * U16 * mag + FLOOR


def check(got: np.ndarray, ref: np.ndarray, bound: np.ndarray | float, what: str = "") -> None:
    """Raise AssertionError naming the worst element when any |got - ref| exceeds its bound."""
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got64.shape != ref64.shape:
        raise AssertionError(f"{what}: shape {got64.shape} != reference {ref64.shape}")
    if np.isnan(got64).any() and not np.isnan(ref64).any():
        raise AssertionError(f"{what}: NaN in result")
    err = np.abs(got64 - ref64)
    excess = err - np.broadcast_to(bound, err.shape)
    if (excess > 0).any():
        i = np.unravel_index(int(np.argmax(excess)), err.shape)
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} of {err.size} elements out of tolerance; worst at "
            f"{i}: got {got64[i]!r}, want {ref64[i]!r}, |err| {err[i]:.3g} > bound "
            f"{np.broadcast_to(bound, err.shape)[i]:.3g}")


def lut_bound(ref: np.ndarray, table_error: np.ndarray | float) -> np.ndarray:
    """A LUT activation: the table's stated absolute error (``table_error``, from the emitter
    that builds the table, including any intermediate fp16 rounding of a 2-pass form) plus
    the final rounding to fp16 (one u of |ref|) and the FLOOR."""
    return np.asarray(table_error, np.float64) + elementwise_bound(ref, rounds=1)
