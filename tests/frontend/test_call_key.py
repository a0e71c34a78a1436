"""The warm-call key (signature.call_key, from tree_flatten alone) is the full signature's key
(make_signature(...).key()) for every kind of argument, so a warm call finds exactly the
Compiled object a traced call would, and a call that differs in any leaf's shape or dtype,
in pytree structure or in a static value misses and traces."""
from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import rockjit
from rockjit.signature import call_key, make_signature

Pair = namedtuple("Pair", "a b")


def _f(w, n, x, y=None):
    return x


CASES = [
    # (args, static_argnums, resident_argnums)
    (({"w": np.ones((3, 4), np.float32), "b": [np.zeros(4, np.float64), 2.5]}, 3,
      np.ones((2, 4), np.float32), Pair(np.int64(3), True)), (1,), (0,)),
    ((np.ones(3, ml_dtypes.bfloat16), (1, 2), jnp.ones((2, 2)), None), (-3,), (0,)),
    ((np.ones(3, np.float16), 1, np.arange(6, dtype=np.int32).reshape(2, 3), 7), (1,), ()),
    (({"k": jax.ShapeDtypeStruct((5,), np.float32)}, "s", np.float32(1.0), False), (1,), (0,)),
]


@pytest.mark.parametrize("args,static,resident", CASES)
def test_call_key_is_the_signature_key(args, static, resident):
    key, leaves = call_key(args, static, resident)
    assert key == make_signature(_f, args, static, resident).key()
    for i, arg in enumerate(args):
        want = None if i in [s % len(args) for s in static] else jax.tree_util.tree_leaves(arg)
        assert (leaves[i] is None) == (want is None)
        if want is not None:
            assert len(leaves[i]) == len(want) and all(a is b for a, b in zip(leaves[i], want))


def test_call_key_leaves_errors_to_the_full_path():
    assert call_key(({"x": "text"},), (), ()) is None           # not an array
    assert call_key(([1, 2],), (0,), ()) is None                # unhashable static
    assert call_key((np.ones(2, np.complex64),), (), ()) is None  # no IR element type


def test_warm_calls_hit_and_differences_retrace():
    f = rockjit.compile(lambda w, n, x: x * w["s"] + n, static_argnums=1, resident_argnums=0,
                        backend="interpreter")
    w = {"s": np.float32(2.0) * np.ones(3, np.float32)}
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(f(w, 1, x), x * 2 + 1)
    np.testing.assert_array_equal(f(w, 1, x + 1), (x + 1) * 2 + 1)
    assert f.trace_count == 1
    f(w, 2, x)                                   # another static value
    f(w, 1, x.astype(np.int32))                  # another input dtype
    f(w, 1, np.ones(4, np.float32)[:3])          # same signature again: no trace
    f({"s": np.ones(3, np.float16)}, 1, x)       # resident f16 is bound as f32: no trace
    assert f.trace_count == 3
    with pytest.raises(rockjit.TraceError, match="pytree"):
        f.compiled(w, 1, x)({"t": w["s"]}, 1, x)
