"""One record per activation kind: everything the compiler and the error oracle know about it.

A record says, in one place:

* ``reference`` -- the exact function in float64 numpy (the IR's reference for the fused
  ``activation{kind}`` op, the fusion probe's target, the error oracle's value);
* ``jax_fn`` -- the same function written with jax.numpy: its derivative (``derivative``) is
  taken with ``jax.grad``, never written by hand;
* the LUT program: which function the DPU table holds (``table``, with its jnp twin
  ``table_jax`` for the table's derivative), whether the table covers [-R, R] (``"unit"``: values
  in [0, 1]) or [lo, hi] (``"shifted"``), and how the table value becomes the result (``post``:
  ``"none"``, ``"gate"`` out = x * t, ``"square"`` out = t * t, ``"affine"`` out = a t + b);
* the table domain rule (``domain``): ``"saturating"`` (the table function is a gate in [0, 1]
  that reaches its limits: the domain follows from the function, lowering/calibrate.py),
  ``"softmax"`` (exp after a row-max subtraction only), or None (no domain from the function
  alone: the op runs on the host in f32);
* ``expand`` -- the host fallback: the same function as primitive IR ops (each with a host
  rule), used when the LUT has no form for the op;
* ``bound(a)`` -- a bound on |f(x)| for |x| <= a (lowering/range_plan.py).

Adding a LUT activation is one record here plus, if JAX spells it in a new way, one pattern in
ir/passes/fuse.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
from scipy import special

from .ops import Op

Fn = Callable[[np.ndarray], np.ndarray]
# emit(op, inputs, attrs, out_type=None) -> value: appends one IR node
Emit = Callable[..., object]

_GT_A = math.sqrt(2.0 / math.pi)   # tanh-GELU's published constants (jax.nn.gelu, HF)
_GT_B = 0.044715


@dataclass(frozen=True)
class ActivationKind:
    name: str
    reference: Fn
    jax_fn: Callable
    table: Fn
    table_jax: Callable
    form: str = "unit"                  # "unit" [-R, R] in [0, 1] | "shifted" [lo, hi]
    post: str = "none"                  # "none" | "gate" | "square" | "affine"
    affine: tuple[float, float] = (1.0, 0.0)
    domain: str | None = "saturating"   # "saturating" | "softmax" | None
    default_range: tuple[float, float] = (-8.0, 8.0)
    fusable: bool = False               # an IR ``activation{kind}`` op (a composite)
    expand: Callable[[Emit, object], object] | None = None
    # sup |f(x)| over |x| <= a (the range plan's bound), where the form does not give it
    magnitude: Callable[[float], float] | None = None

    def bound(self, a: float) -> float:
        """A bound on |f(x)| for |x| <= a: |x * gate(x)| <= |x| for a gate in [0, 1]."""
        if self.magnitude is not None:
            return self.magnitude(a)
        if self.post == "gate":
            return a
        return math.inf

    @property
    def gated(self) -> bool:
        return self.post == "gate"

    def derivative(self, x: np.ndarray) -> np.ndarray:
        """|f'(x)| (float64), by jax.grad of ``jax_fn``."""
        return _grad(self.jax_fn)(x)

    def table_derivative(self, x: np.ndarray) -> np.ndarray:
        return _grad(self.table_jax)(x)


@lru_cache(maxsize=None)
def _jit_grad(f: Callable):
    import jax

    return jax.jit(jax.vmap(jax.grad(f)))


def _grad(f: Callable) -> Fn:
    def d(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if x.size == 0:
            return np.zeros_like(x)
        g = np.asarray(_jit_grad(f)(x.reshape(-1).astype(np.float32)), np.float64)
        return np.nan_to_num(np.abs(g).reshape(x.shape), nan=0.0, posinf=0.0)
    return d


# ------------------------------------------------------------------------ the functions (numpy)

def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return special.expit(x)


def phi(x: np.ndarray) -> np.ndarray:
    """The Gaussian CDF, GELU's gate: GELU(x) = x * Phi(x)."""
    return special.ndtr(x)


def tanh_gate(x: np.ndarray) -> np.ndarray:
    """(1 + tanh x) / 2 = sigmoid(2x): tanh's table in [0, 1]."""
    return special.expit(2 * _f64(x))


def gelu_tanh_gate(x: np.ndarray) -> np.ndarray:
    """GELU_tanh(x) = 0.5 x (1 + tanh(a (x + b x^3))) = x * sigmoid(2a (x + b x^3))."""
    x = _f64(x)
    return special.expit(2 * _GT_A * (x + _GT_B * x ** 3))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(_f64(x), 0.0)


def mish_gate(x: np.ndarray) -> np.ndarray:
    """mish(x) = x * tanh(softplus(x)); the gate is in (0, 1), 0 at -inf and 1 at +inf."""
    return np.tanh(softplus(x))


def rsqrt(x: np.ndarray) -> np.ndarray:
    return 1 / np.sqrt(x)


def reciprocal(x: np.ndarray) -> np.ndarray:
    return 1 / _f64(x)


def _exp_half(x: np.ndarray) -> np.ndarray:
    return np.exp(0.5 * _f64(x))


def _times_x(g: Fn) -> Fn:
    return lambda x: _f64(x) * g(x)


# ------------------------------------------------------------------ the same in jax.numpy (grad)

def _jnp():
    import jax.numpy as jnp
    return jnp


def _j_sigmoid(x):
    import jax
    return jax.nn.sigmoid(x)


def _j_phi(x):
    import jax
    return jax.scipy.special.ndtr(x)


def _j_gelu_tanh_gate(x):
    return _j_sigmoid(2 * _GT_A * (x + _GT_B * x ** 3))


def _j_softplus(x):
    import jax
    return jax.nn.softplus(x)


def _j_mish_gate(x):
    return _jnp().tanh(_j_softplus(x))


# ------------------------------------------------------------------ host fallbacks (IR ops)

def _const(emit: Emit, v: float, like) -> object:
    c = emit(Op.CONSTANT, [], {"value": np.array(v, like.type.dtype.to_numpy())})
    return emit(Op.BROADCAST_IN_DIM, [c], {"broadcast_dimensions": []}, like.type)


def _bin(emit: Emit, op: Op, a, b) -> object:
    return emit(op, [a, b], {})


def _softplus_ops(emit: Emit, x) -> object:
    # max(x, 0) + log(1 + exp(-|x|)): no overflow; log(1 + e) for e < 2^-24 is 0, an absolute
    # error under 2^-24 (tolerance.FLOOR)
    zero, one = _const(emit, 0.0, x), _const(emit, 1.0, x)
    e = emit(Op.EXP, [emit(Op.NEG, [emit(Op.ABS, [x], {})], {})], {})
    return _bin(emit, Op.ADD, _bin(emit, Op.MAX, x, zero),
                emit(Op.LOG, [_bin(emit, Op.ADD, e, one)], {}))


def _gated_ops(gate: Callable[[Emit, object], object]) -> Callable[[Emit, object], object]:
    return lambda emit, x: _bin(emit, Op.MUL, x, gate(emit, x))


def _phi_ops(emit: Emit, x) -> object:
    half, one = _const(emit, 0.5, x), _const(emit, 1.0, x)
    t = emit(Op.ERF, [_bin(emit, Op.MUL, x, _const(emit, 1 / math.sqrt(2.0), x))], {})
    return _bin(emit, Op.MUL, half, _bin(emit, Op.ADD, one, t))


def _gelu_tanh_gate_ops(emit: Emit, x) -> object:
    cube = emit(Op.INTEGER_POW, [x], {"y": 3})
    inner = _bin(emit, Op.ADD, x, _bin(emit, Op.MUL, cube, _const(emit, _GT_B, x)))
    return emit(Op.LOGISTIC, [_bin(emit, Op.MUL, inner, _const(emit, 2 * _GT_A, x))], {})


def _sigmoid_ops(emit: Emit, x) -> object:
    return emit(Op.LOGISTIC, [x], {})


def _mish_gate_ops(emit: Emit, x) -> object:
    return emit(Op.TANH, [_softplus_ops(emit, x)], {})


def _jax_gelu(x):
    import jax
    return jax.nn.gelu(x, approximate=False)


def _jax_gelu_tanh(x):
    import jax
    return jax.nn.gelu(x, approximate=True)


def _jax_silu(x):
    import jax
    return jax.nn.silu(x)


def _jax_mish(x):
    import jax
    return jax.nn.mish(x)


def _jax_exp(x):
    return _jnp().exp(x)


def _jax_tanh(x):
    return _jnp().tanh(x)


def _jax_rsqrt(x):
    import jax
    return jax.lax.rsqrt(x)


def _jax_reciprocal(x):
    return 1.0 / x


def _jax_exp_half(x):
    return _jnp().exp(0.5 * x)


def _j_tanh_gate(x):
    return _j_sigmoid(2 * x)


# The registry: one record per kind. Kinds with ``fusable`` are IR ops (``activation{kind}``);
# the others are the LUT programs of primitive IR ops (exp, tanh, logistic, rsqrt) and of the
# emitters' own intermediates (softmax's squared half-exponent, a division's reciprocal).
ACTIVATIONS: dict[str, ActivationKind] = {k.name: k for k in (
    ActivationKind("sigmoid", sigmoid, _j_sigmoid, sigmoid, _j_sigmoid),
    ActivationKind("tanh", np.tanh, _jax_tanh, tanh_gate, _j_tanh_gate, post="affine",
                   affine=(2.0, -1.0), default_range=(-6.0, 6.0)),
    ActivationKind("exp", np.exp, _jax_exp, np.exp, _jax_exp, form="shifted", domain="softmax",
                   default_range=(-16.0, 0.0)),
    ActivationKind("exp_sq", np.exp, _jax_exp, _exp_half, _jax_exp_half, form="shifted",
                   post="square", domain="softmax", default_range=(-16.0, 0.0)),
    ActivationKind("gelu", _times_x(phi), _jax_gelu, phi, _j_phi, post="gate",
                   default_range=(-12.0, 12.0), fusable=True, expand=_gated_ops(_phi_ops)),
    ActivationKind("gelu_tanh", _times_x(gelu_tanh_gate), _jax_gelu_tanh, gelu_tanh_gate,
                   _j_gelu_tanh_gate, post="gate", default_range=(-12.0, 12.0), fusable=True,
                   expand=_gated_ops(_gelu_tanh_gate_ops)),
    ActivationKind("silu", _times_x(sigmoid), _jax_silu, sigmoid, _j_sigmoid, post="gate",
                   default_range=(-16.0, 16.0), fusable=True, expand=_gated_ops(_sigmoid_ops)),
    ActivationKind("mish", _times_x(mish_gate), _jax_mish, mish_gate, _j_mish_gate, post="gate",
                   default_range=(-16.0, 16.0), fusable=True,
                   expand=_gated_ops(_mish_gate_ops)),
    # softplus grows like x: no table domain follows from the function (a clamp above the
    # table's end would be silently wrong), so it runs on the host (expand) in f32
    ActivationKind("softplus", softplus, _j_softplus, softplus, _j_softplus, form="shifted",
                   domain=None, fusable=True, expand=_softplus_ops,
                   magnitude=lambda a: a + math.log(2.0)),
    ActivationKind("rsqrt", rsqrt, _jax_rsqrt, rsqrt, _jax_rsqrt, form="shifted", domain=None,
                   default_range=(0.5, 64.0)),
    ActivationKind("reciprocal", reciprocal, _jax_reciprocal, reciprocal, _jax_reciprocal,
                   form="shifted", domain=None, default_range=(0.25, 32.0)),
)}

FUSABLE = tuple(k for k, a in ACTIVATIONS.items() if a.fusable)


def activation(kind: str) -> ActivationKind:
    try:
        return ACTIVATIONS[kind]
    except KeyError:
        raise KeyError(f"no activation kind {kind!r}; known: {', '.join(sorted(ACTIVATIONS))}"
                       ) from None
