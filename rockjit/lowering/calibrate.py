"""LUT table domains, chosen from the function alone: no result depends on the first call.

The DPU LUT clamps its input to the table's domain (emitters/lut.py: the result is
f(clamp(x)), or x * gate(clamp(x)) for GELU/SiLU). A domain taken from the first call's data
(what this module used to do) was exact for that call and wrong for a later, wider one: tanh
compiled on [-0.5, 0.5] and called on [-50, 50] came out 37 % off, silently. So the domain is
now a property of the function, and compile needs no data at all (``lower(ShapeDtypeStruct)``
gives the same program as compiling after a call; no interpreter run at compile time):

* **saturating functions** (sigmoid, tanh, and the gates of GELU, tanh-GELU and SiLU): the
  table covers [-R, R] with R the smallest radius at which the gate is within ``SATURATION``
  of its limits 0 and 1 (``saturation_radius``). ``SATURATION`` is half a Q0.15 table step,
  below what a table entry can resolve (and under the QUIRK 4 floor entry 2^-15), so clamping
  a wider input changes the gate by less than the table's own rounding: exact to the table's
  precision for every input. sigmoid/SiLU R = 11.09, tanh 5.55, GELU (Phi) 4.17, tanh-GELU 4.03.
* **exp after a row-max subtraction** (softmax: ``x - broadcast(reduce_max(x))``, inputs <= 0):
  the fixed table [EXP_FLOOR, 0]. Below EXP_FLOOR exp is under 2^-23, beneath fp16's resolution
  next to the row maximum's exp(0) = 1, so the clamp changes no softmax output by more than
  that; an attention mask's -2^15 (fp16_range.py) lands on the floor entry.
* **everything else** (exp of an arbitrary value, rsqrt, reciprocal): no domain follows from
  the function, and the only other source would be data. ``lut_domain`` returns None and the
  rule refuses the NPU form (``rules.eltwise.lut_result``): the op runs on the host in fp32
  (host_rules), correct for every input. In the three encoders every exp is a softmax's and
  every rsqrt a LayerNorm's per-row tail (already on the host), so this costs them nothing.

tolerance.graph_bound uses the same ``lut_domain`` so the bound describes the program.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
from scipy import optimize

from ..ir.activations import ACTIVATIONS
from ..ir.graph import Value
from ..ir.ops import Op
from .rules.base import RuleContext

# The softmax exp table never reaches below this (module docstring): exp(-16) < 2^-23, and
# every input under ln(2^-16) ~ -11.1 already quantises to the table's floor entry q = 1
# (lut_tables: QUIRK 4), so a lower start only coarsens the table. A masked score
# (fp16_range.MASK_MAGNITUDE below its row) is far under it: clamped to the floor entry.
EXP_FLOOR = -16.0

# Half of one Q0.15 table step (lut_tables.Q_ONE = 2^15): a gate closer than this to its limit
# is stored as the limit's entry anyway, so the table's domain ends where the gate gets there.
SATURATION = 0.5 / (1 << 15)

# The gate each saturating kind's table holds (values in [0, 1], 0 at -inf, 1 at +inf), from
# the kinds' records (ir/activations.py)
GATES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    k: a.table for k, a in ACTIVATIONS.items() if a.domain == "saturating"}
# the kinds whose result is x * gate(x) (the rest are a function of the gate alone)
GATED = frozenset(k for k, a in ACTIVATIONS.items() if a.post == "gate")


@lru_cache(maxsize=None)
def saturation_radius(kind: str) -> float:
    """The smallest R with gate(-R) <= SATURATION and 1 - gate(R) <= SATURATION: beyond +-R the
    clamped table's answer equals the function's to the table's resolution."""
    g = GATES[kind]
    return float(optimize.brentq(lambda r: max(float(g(-r)), 1.0 - float(g(r))) - SATURATION,
                                 1e-3, 1e3, xtol=1e-9))


def lut_domain(kind: str, max_subtracted: bool = False) -> tuple[float, float] | None:
    """The (lo, hi) the LUT for ``kind`` covers, from the function alone; None when only data
    could give one (the op then runs on the host; module docstring). ``max_subtracted``: the
    input is ``a - broadcast(reduce_max(a))`` (``is_max_subtracted``)."""
    if kind in GATES:
        r = saturation_radius(kind)
        return (-r, r)
    if ACTIVATIONS[kind].domain == "softmax" and max_subtracted:
        return (EXP_FLOOR, 0.0)
    return None


def is_max_subtracted(producer, const, v: Value) -> bool:
    """v = a - broadcast(reduce_max(a)) (possibly through a max with -inf, as jax emits);
    ``producer(v)`` gives a value's producing node, ``const(v)`` its compile-time value."""
    p = producer(v)
    if p is None or p.op is not Op.SUB:
        return False
    b = producer(p.inputs[1])
    while b is not None and b.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.MAX):
        if b.op is Op.MAX:
            nxt = [u for u in b.inputs if const(u) is None]
            if len(nxt) != 1:
                return False
            b = producer(nxt[0])
        else:
            b = producer(b.inputs[0])
    # the max must be over the very value it is subtracted from: only then is every
    # difference <= 0 (x - max(y) can be positive, and the [EXP_FLOOR, 0] table would clamp it)
    return b is not None and b.op is Op.REDUCE_MAX and b.inputs[0].id == p.inputs[0].id


def npu_lut_domain(ctx: RuleContext, kind: str, x: Value) -> tuple[float, float] | None:
    """``lut_domain`` for the LUT op of ``x`` at the rule's node."""
    return lut_domain(kind, kind == "exp" and is_max_subtracted(ctx.producer, ctx.const, x))


def clamp_error(kind: str, x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """What clamping the input to the table's covered [lo, hi] changes, per element: for
    x * gate(x) kinds |x| |gate(clamp x) - gate(x)|, for an affinely decoded gate (tanh =
    2 gate - 1) |a| times the gate's change, else |f(clamp x) - f(x)| (exp_sq computes
    exp(x/2)^2 = exp(x): the same clamp)."""
    x = np.asarray(x, np.float64)
    xc = np.clip(x, lo, hi)
    with np.errstate(all="ignore"):
        act = ACTIVATIONS[kind]
        if kind in GATES:
            d = np.abs(GATES[kind](xc) - GATES[kind](x))
            d = np.abs(x) * d if kind in GATED else abs(act.affine[0]) * d
        else:
            d = np.abs(act.reference(xc) - act.reference(x))
    return np.nan_to_num(d, nan=0.0, posinf=0.0)
