"""What the NPU backends refuse to compute in fp16: non-finite or out-of-range values.

The NPU's float is fp16: a call's float input is rounded to it, a resident weight is packed
in it. Three things go silently wrong there, so they are refused instead:

* **NaN / Inf in a call's input.** The NPU does not propagate them as IEEE float32 math (and
  JAX) would: ReLU is a max with 0 on the DPU, which returns 0 for NaN; a LUT clamps +-Inf to
  its table's end. Rather than a result that differs from JAX's in a way no bound describes, a
  float input holding NaN or +-Inf is refused before the run (``InputRangeError``).
* **A float input beyond fp16's finite range** (|x| > 65504) becomes +-Inf when packed, and then
  NaN or 0 downstream. Refused likewise, naming the range.
* **A resident weight that is non-finite or beyond fp16's range** is known at compile time:
  refused then (``WeightError``), naming the weight. Saturating it (as fp16_range.py does for a
  compile-time *constant* such as an attention mask's finfo.min, whose meaning survives the
  saturation) would change what a weight computes.

The interpreter backend computes in float32 and checks none of this (it propagates NaN like
JAX). The errors carry the flat input index / param name; ``rockjit.api`` turns them into the
argument's name and pytree path.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import InputRangeError, WeightError
from ..ir.graph import Graph
from ..ir.ops import Op
from .fp16_range import extremes

FP16_MAX = float(np.finfo(np.float16).max)     # 65504


def _first_bad(a: np.ndarray) -> tuple[tuple[int, ...], float]:
    """(index, value) of the first element that is non-finite or beyond FP16_MAX."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(a) <= FP16_MAX)
    i = np.unravel_index(int(np.argmax(bad)), a.shape) if a.ndim else ()
    return tuple(int(k) for k in i), float(a[i])


def fp16_problem(a: np.ndarray) -> str | None:
    """None when every element of float ``a`` is finite and within fp16's range, else what is
    wrong (the first offending element and how many there are)."""
    a = np.asarray(a)
    if a.dtype.kind != "f" or a.size == 0:
        return None
    lo, hi = extremes(a)       # NaN propagates into both; memoized per compile (fp16_range)
    if lo >= -FP16_MAX and hi <= FP16_MAX:
        return None
    idx, v = _first_bad(a)
    with np.errstate(invalid="ignore"):
        n_nan = int(np.isnan(a).sum())
        n_inf = int(np.isinf(a).sum())
        n_big = int((np.isfinite(a) & (np.abs(a) > FP16_MAX)).sum())
    parts = [f"{n} {what}" for n, what in ((n_nan, "NaN"), (n_inf, "infinite"),
                                          (n_big, f"beyond +-{FP16_MAX:g}")) if n]
    at = f"[{', '.join(map(str, idx))}]" if idx else "the scalar"
    return (f"element {at} is {v!r} ({', '.join(parts)} of {a.size} elements); the NPU computes "
            f"in fp16, which holds finite values with |x| <= {FP16_MAX:g}")


def check_inputs(graph: Graph, inputs: Sequence[np.ndarray]) -> None:
    """Raise InputRangeError (with ``.index``, the graph input's position) for the first float
    input holding NaN, Inf or a value beyond fp16's range (module docstring)."""
    for k, (v, a) in enumerate(zip(graph.inputs, inputs)):
        if not v.type.dtype.is_float:
            continue
        a = np.asarray(a)
        if a.dtype.kind != "f":        # bfloat16 (ml_dtypes): checked through float32
            a = a.astype(np.float32)
        why = fp16_problem(a)
        if why is not None:
            raise InputRangeError(
                f"input {k} ({v.type}): {why}. NaN/Inf and out-of-range inputs are refused on "
                f"the NPU backends (rockjit README, 'Non-finite and out-of-range values'): "
                f"replace non-finite values (e.g. np.nan_to_num) and scale the input into "
                f"range, or run with backend='interpreter' (float32)", index=k)


def check_weights(graph: Graph, params: Mapping[str, np.ndarray]) -> None:
    """Raise WeightError (with ``.param``, the param name) for the first float resident weight
    holding NaN, Inf or a value beyond fp16's range (module docstring)."""
    for n in graph.nodes:
        if n.op is not Op.PARAM:
            continue
        name = n.attrs["name"]
        if name not in params:
            continue     # fold_consts names an unbound param
        why = fp16_problem(np.asarray(params[name]))
        if why is not None:
            loc = f" (used at {n.loc})" if n.loc else ""
            raise WeightError(
                f"resident weight {name!r} ({n.out.type}){loc}: {why}. A weight must be finite "
                f"and within fp16's range to be packed for the NPU: fix the checkpoint, or "
                f"rescale the weight (and undo the scale after its use) in the model code",
                param=name)
