"""The issue's "done when" graphs: small JAX functions compiled with rockjit.compile(...,
backend="sim"), run on the strict SimDevice and compared with JAX on CPU.

The accuracy bound of each graph is tolerance.graph_bound: the fp16 roundings, fp32
accumulations and LUT table errors propagated along the graph's op chain (the rules are
stated in rockjit/oracle/tolerance.py), plus the float32 rounding of JAX's own result.
Every test also checks that the bound is tight enough to catch a wrong answer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import assert_npu as _npu, check_bound as _check, run_sim as _run
from rockjit.oracle import tolerance as T


# ---------------------------------------------------------------------------------------------

def mlp(p, x):
    h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
    return h @ p["w2"] + p["b2"]


def test_mlp_matmul_bias_gelu_matmul() -> None:
    rng = np.random.default_rng(10)
    d, f_ = 96, 256
    p = {"w1": (rng.standard_normal((d, f_)) / np.sqrt(d)).astype(np.float32),
         "b1": (rng.standard_normal(f_) * 0.1).astype(np.float32),
         "w2": (rng.standard_normal((f_, d)) / np.sqrt(f_)).astype(np.float32),
         "b2": (rng.standard_normal(d) * 0.1).astype(np.float32)}
    x = rng.standard_normal((37, d)).astype(np.float32)
    got, ref, bound, st, rep = _run(mlp, p, x)
    _check(got, ref, bound, "MLP")
    # each bias in its matmul's own DPU pass (matmul_epilogue{bias}): no separate add
    _npu(rep, "matmul_epilogue", "activation")
    assert "= add" not in rep and "= dot_general" not in rep, rep
    # three NPU ops back to back: one NPU step (lowering/coalesce.py)
    assert st["npu_ops"] == 3 and st["npu_steps"] == 1, st
    assert "lut.lower_activation[gelu]" in rep   # the fused activation{gelu}, one LUT op
    # the whole MLP stays on the NPU cubes: only the boundary pack and unpack touch the host
    assert st["retiles"] == 0 and st["host_steps"] == 2
    assert st["macs"] == 37 * d * f_ * 2


def layer_norm(p, x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * p["g"] + p["b"]


def test_layer_norm() -> None:
    rng = np.random.default_rng(11)
    d = 200
    p = {"g": rng.uniform(0.5, 1.5, d).astype(np.float32),
         "b": (rng.standard_normal(d) * 0.1).astype(np.float32)}
    x = (rng.standard_normal((45, d)) * 2 + 0.5).astype(np.float32)
    got, ref, bound, st, rep = _run(layer_norm, p, x)
    _check(got, ref, bound, "LayerNorm")
    # the sums are ones-vector matmuls, the centring and scaling per-row DPU ops; only the
    # O(rows) tails (mean, variance, 1/sqrt) run on the host
    _npu(rep, "reduce_sum", "sub", "integer_pow")
    host = [l for l in rep.splitlines() if " host " in l]
    assert all("div" in l or "add" in l or "sqrt" in l for l in host), rep


def test_softmax() -> None:
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((50, 77)) * 3).astype(np.float32)
    got, ref, bound, st, rep = _run(lambda x: jax.nn.softmax(x, axis=-1), None, x)
    _check(got, ref, bound, "softmax")
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=77 * 2 * T.U16)
    _npu(rep, "sub", "exp", "reduce_sum", "div")


def conv_gelu(p, x):
    y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), ((1, 1), (1, 1)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return jax.nn.gelu(y + p["b"][None, :, None, None], approximate=False)


def test_conv3x3_then_gelu() -> None:
    rng = np.random.default_rng(13)
    p = {"w": (rng.standard_normal((24, 12, 3, 3)) / np.sqrt(108)).astype(np.float32),
         "b": (rng.standard_normal(24) * 0.1).astype(np.float32)}
    x = rng.standard_normal((2, 12, 10, 9)).astype(np.float32)
    got, ref, bound, st, rep = _run(conv_gelu, p, x)
    _check(got, ref, bound, "conv3x3 + GELU")
    _npu(rep, "conv", "activation")
    assert "lut.lower_activation[gelu]" in rep


T_, D_, H_ = 40, 128, 4


def attention(p, x):
    dh = D_ // H_
    q, k, v = (x @ p[f"w{n}"] + p[f"b{n}"] for n in "qkv")

    def heads(t):
        return t.reshape(T_, H_, dh).transpose(1, 0, 2)

    s = jnp.einsum("hqd,hkd->hqk", heads(q), heads(k)) * dh ** -0.5
    o = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), heads(v))
    return o.transpose(1, 0, 2).reshape(T_, D_) @ p["wo"] + p["bo"]


def test_attention_block() -> None:
    rng = np.random.default_rng(14)
    p = {f"w{n}": (rng.standard_normal((D_, D_)) / np.sqrt(D_)).astype(np.float32)
         for n in "qkvo"}
    p.update({f"b{n}": (rng.standard_normal(D_) * 0.1).astype(np.float32) for n in "qkvo"})
    x = rng.standard_normal((T_, D_)).astype(np.float32)
    got, ref, bound, st, rep = _run(attention, p, x)
    _check(got, ref, bound, "attention")
    _npu(rep, "dot_general", "exp", "reduce_sum", "div")
    # the softmax's division moved after the value product (ir/passes/softmax_dot.py): e @ v
    # in fp32, scaled per row by the split reciprocal on the NPU; the [q, k] probabilities are
    # never written, nothing the size of the scores is broadcast
    div = [ln for ln in rep.splitlines() if "= div " in ln]
    assert len(div) == 1 and "build_row_scale_wide" in div[0], rep
    assert not [ln for ln in rep.splitlines() if "= broadcast_in_dim" in ln and " host " in ln], rep
    # heads are independent jobs of one step
    assert st["jobs"] > st["npu_steps"]



def masked_attention(p, x, bias):
    dh = D_ // H_
    q, k, v = (x @ p[f"w{n}"] + p[f"b{n}"] for n in "qkv")

    def heads(t):
        return t.reshape(T_, H_, dh).transpose(1, 0, 2)

    # a run-time per-key bias (0 or -1e4: BERTs' key mask), broadcast over heads and queries
    s = jnp.einsum("hqd,hkd->hqk", heads(q), heads(k)) * dh ** -0.5 + bias[None, None, :]
    o = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), heads(v))
    return o.transpose(1, 0, 2).reshape(T_, D_)


def test_attention_with_a_key_mask() -> None:
    """The mask's per-key bias is added by the scores' own one-pass per-channel form: the
    vector is read in the weight layout, never broadcast to the scores' size."""
    rng = np.random.default_rng(15)
    p = {f"w{n}": (rng.standard_normal((D_, D_)) / np.sqrt(D_)).astype(np.float32)
         for n in "qkv"}
    p.update({f"b{n}": (rng.standard_normal(D_) * 0.1).astype(np.float32) for n in "qkv"})
    x = rng.standard_normal((T_, D_)).astype(np.float32)
    bias = np.where(rng.random(T_) > 0.25, 0.0, -1e4).astype(np.float32)
    got, ref, bound, st, rep = _run(masked_attention, p, x, bias)
    _check(got, ref, bound, "masked attention")
    add = [ln for ln in rep.splitlines() if "lower_binary_channel_runtime" in ln]
    assert len(add) == 1 and " npu " in add[0], rep
    assert not [ln for ln in rep.splitlines() if "= broadcast_in_dim" in ln and " host " in ln], rep


# ---------------------------------------------------------------------------------------------

def test_real_transpose_is_not_a_free_view() -> None:
    """Regression: a transpose of a square row-major value was taken for a view (same
    extents in a different order), returning the untransposed data."""
    t = (np.arange(3 * 5 * 5, dtype=np.float32).reshape(3, 5, 5) / 7).astype(np.float32)
    f = rockjit.compile(lambda t, i: jnp.take(t, i, axis=0).T, backend="sim")
    got = f(t, np.int32(1))
    np.testing.assert_array_equal(got, t[1].T)


def test_transposed_cube_output_is_unpacked_in_order() -> None:
    rng = np.random.default_rng(15)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got, ref, bound, st, rep = _run(lambda w, x: (x @ w).T, w, x)
    assert got.shape == (48, 8)
    _check(got, ref, bound, "(x @ w).T")


def _int_conv(w, x):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def test_an_op_without_any_form_names_op_and_line() -> None:
    """An int32 convolution: the NPU convolves fp16 and int8 only (the chip has no int32
    MAC path) and no host conv exists (a host matmul would hide a missing emitter): a clear
    UnsupportedError naming the op and this file's line, never a silent fallback."""
    f = rockjit.compile(_int_conv, resident_argnums=0, backend="sim")
    with pytest.raises(rockjit.UnsupportedError) as e:
        f(np.ones((4, 2, 3, 3), np.int32), np.ones((1, 2, 5, 5), np.int32))
    msg = str(e.value)
    assert "conv" in msg and "test_graphs_sim.py:" in msg and "i32" in msg, msg


def patch_embed(p, x):
    y = jax.lax.conv_general_dilated(x, p["w"], (16, 16), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = y + p["b"][None, :, None, None]
    b, d, gh, gw = y.shape
    return jnp.transpose(y.reshape(b, d, gh * gw), (0, 2, 1)) + p["pos"]


def test_patchify_conv_im2col_then_tokens() -> None:
    """SigLIP's patch embedding: a 16x16 stride-16 conv lowered as an im2col host copy + a
    matmul, its bias a per-channel DPU op, the NCHW -> tokens transpose a view, the position
    table a constant cube: only the im2col and the final unpack touch the host."""
    rng = np.random.default_rng(16)
    p = {"w": (rng.standard_normal((64, 3, 16, 16)) / 28).astype(np.float32),
         "b": (rng.standard_normal(64) * 0.1).astype(np.float32),
         "pos": (rng.standard_normal((9, 64)) * 0.1).astype(np.float32)}
    x = rng.standard_normal((1, 3, 48, 48)).astype(np.float32)
    got, ref, bound, st, rep = _run(patch_embed, p, x)
    _check(got, ref, bound, "patch embedding")
    assert "im2col" in rep and st["host_steps"] == 2 and st["retiles"] == 0
