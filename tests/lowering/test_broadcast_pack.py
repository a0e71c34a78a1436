"""A run-time broadcast asked for as a cube is packed straight from its operand through
stride-0 axes (strided_conversion._broadcast_pack): ModernBERT's local-attention bias [1,1,S,S]
added to the [1,H,S,S] scores. Before, the host first wrote the broadcast rows (H copies in
f32), then packed them.

An attention with a padding mask and a band (some keys masked in every row) on the strict
simulator: within the fp16 bound of JAX on the CPU, also with every arena byte poisoned; the
same output bits as with the two-pass route (``_broadcast_pack`` turned off), whose broadcast
is a host step of the full [1,H,S,S] rows and which moves more host bytes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from graphs_testutil import check_bound, run_poisoned
from rockjit.lowering.strided_conversion import StridedConversion
from rockjit.oracle import tolerance as T

H, S, D = 4, 64, 32


def _attention(params, q, k, mask):
    band = jnp.abs(jnp.arange(S)[:, None] - jnp.arange(S)[None, :]) <= 16
    allowed = (mask != 0)[:, None, None, :] & band[None, None]
    bias = jnp.where(allowed, jnp.zeros((), jnp.float32), jnp.finfo(jnp.float32).min)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k * params["scale"]) + bias
    return jax.nn.softmax(scores, axis=-1)


def _inputs():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, H, S, D)).astype(np.float32)
    k = rng.standard_normal((1, H, S, D)).astype(np.float32)
    mask = np.ones((1, S), np.int32)
    mask[0, 40:] = 0                  # padding: the last keys masked in every row
    return {"scale": np.float32(D ** -0.5)}, q, k, mask


def _compile(params, *xs):
    f = rockjit.compile(_attention, resident_argnums=0, backend="sim")
    out = np.asarray(f(params, *xs))
    return out, f.compiled(params, *xs)


def _broadcast_steps(c) -> list[str]:
    """Host calls that write a broadcast's replicated rows."""
    return [pc.node for pc in c._runner.lowered.calls
            if pc.call.where == "host" and " = broadcast_in_dim" in pc.node]


def test_the_bias_is_packed_from_its_operand(monkeypatch) -> None:
    params, q, k, mask = _inputs()
    out, c = _compile(params, q, k, mask)
    how = [d.how for d in c._runner.lowered.decisions if "broadcast_in_dim" in d.node
           and d.where == "host"]
    assert "pack from the operand" in how, how
    assert not _broadcast_steps(c)
    ref = np.asarray(_attention(params, q, k, mask), np.float64)
    bound = T.graph_bound(c.graph, c.params, [q, k, mask])[0] + 2.0 ** -23 * np.abs(ref)
    check_bound(out, ref, bound, "banded, padded attention")
    # masked keys get next to no weight in every row that has a key left (the exp table's
    # floor, lut.py's QUIRK 4, keeps it above 0); rows past 55 have none left: all their
    # scores are equal, so JAX's softmax is uniform there, and so is ours
    assert np.all(out[:, :, :56, 40:] < 2.0 ** -20)
    with monkeypatch.context() as m:
        m.setattr(StridedConversion, "_broadcast_pack", lambda self, use, want: None)
        old, c_old = _compile(params, q, k, mask)
    assert _broadcast_steps(c_old)              # the two-pass route writes the rows first
    np.testing.assert_array_equal(out, old)


def test_poisoned_arena() -> None:
    params, q, k, mask = _inputs()
    got, ref, bound = run_poisoned(_attention, params, q, k, mask)
    check_bound(got, ref, bound, "banded, padded attention, poisoned arena")
