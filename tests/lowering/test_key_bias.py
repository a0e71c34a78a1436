"""Key biases a softmax cannot see, dropped (rockjit/lowering/key_bias.py): the simulator's
result against numpy float64 on the original formula (with the bias), and the cases the
drop must leave alone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from models import layers as L

T, D, H = 24, 64, 2


def _attn(p, x):
    q = L.linear(x, p["wq"], p["bq"]).reshape(T, H, D // H).transpose(1, 0, 2)
    k = L.linear(x, p["wk"], p["bk"]).reshape(T, H, D // H).transpose(1, 0, 2)
    v = L.linear(x, p["wv"], p["bv"]).reshape(T, H, D // H).transpose(1, 0, 2)
    s = jnp.einsum("hid,hjd->hij", q, k) * (D // H) ** -0.5
    return jnp.einsum("hij,hjd->hid", jax.nn.softmax(s, axis=-1), v)


def _attn_scores_too(p, x):
    q = L.linear(x, p["wq"], p["bq"]).reshape(T, H, D // H).transpose(1, 0, 2)
    k = L.linear(x, p["wk"], p["bk"]).reshape(T, H, D // H).transpose(1, 0, 2)
    s = jnp.einsum("hid,hjd->hij", q, k)
    return jax.nn.softmax(s, axis=-1), s


def _params() -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(11)
    p = {}
    for n in ("q", "k", "v"):
        p["w" + n] = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
        p["b" + n] = rng.standard_normal(D).astype(np.float32)
    p["bk"] *= 8.0          # a large key bias: q . b_k shifts every row by several units
    return p, rng.standard_normal((T, D)).astype(np.float32)


def _ref(p, x) -> np.ndarray:
    xd = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    q, k, v = ((x @ xd["w" + n].T + xd["b" + n]).reshape(T, H, D // H).transpose(1, 0, 2)
               for n in "qkv")
    s = np.einsum("hid,hjd->hij", q, k) * (D // H) ** -0.5
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hij,hjd->hid", e / e.sum(-1, keepdims=True), v)


def test_key_bias_dropped_on_the_simulator() -> None:
    p, x = _params()
    f = rockjit.compile(_attn, resident_argnums=0, backend="sim")
    got = np.asarray(f(p, x), np.float64)
    ref = _ref(p, x)
    cos = float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.99999, cos
    assert np.abs(got - ref).max() / np.abs(ref).max() < 5e-3
    assert f.compiled(p, x).stats()["range_key_bias_drops"] == 1


def test_no_drop_where_the_scores_are_read_otherwise() -> None:
    p, x = _params()
    f = rockjit.compile(_attn_scores_too, resident_argnums=0, backend="null")
    f(p, x)
    assert f.compiled(p, x).stats()["range_key_bias_drops"] == 0
