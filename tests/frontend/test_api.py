"""rockjit.compile: decorator forms, pytrees, the trace cache, static and resident arguments,
lowering, TraceError messages and the backend hook.  Results are compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit import TraceError
from rockjit.api import TraceSpec
from rockjit.backends import BACKENDS, register_backend
from rockjit.ir.ops import Op
from rockjit.ir.parser import parse

from .helpers import assert_close


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def interp(fn=None, **kw):
    """rockjit.compile on the IR interpreter: these tests are about tracing, signatures and the
    cache (compared with jax.jit at float32 precision), not the NPU (tests/lowering,
    tests/bundle)."""
    return rockjit.compile(fn, backend="interpreter", **kw)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


# ------------------------------------------------------------------ decorator forms

def _affine(x, w):
    return jnp.tanh(x @ w) * 2.0


def test_decorator_forms_match_jax() -> None:
    x, w = rand(3, 4), rand(4, 5, seed=1)
    want = leaves(jax.jit(_affine)(x, w))

    bare = rockjit.compile(_affine, backend="interpreter")

    @rockjit.compile
    def deco(x, w):
        return _affine(x, w)

    @rockjit.compile(static_argnums=(), backend="interpreter")
    def deco_args(x, w):
        return _affine(x, w)

    for f in (bare, deco_args):
        assert_close(leaves(f(x, w)), want)
    assert deco.__name__ == "deco"
    # the bare decorator's default backend is "auto": the NPU program (here the simulator or
    # the device), within the fp16 error bound of its graph
    from rockjit.oracle import tolerance as T

    assert deco.backend == "auto"
    got = np.asarray(deco(x, w), np.float64)
    c = deco.compiled(x, w)
    ref = np.asarray(want[0], np.float64)
    T.check(got, ref, T.graph_bound(c.graph, c.params, [x, w])[0] + 2.0 ** -23 * np.abs(ref),
            "@rockjit.compile default backend")
    assert c.stats()["npu_ops"] > 0


def test_keyword_arguments_are_dynamic() -> None:
    f = interp(_affine)
    x, w = rand(2, 4), rand(4, 3, seed=1)
    assert_close(leaves(f(x, w=w)), leaves(_affine(x, w)))


# ------------------------------------------------------------------ pytrees

def test_pytree_arguments_and_results() -> None:
    def fn(inp, cfg):
        a, (b, c) = inp["a"], inp["bc"]
        return {"sum": a + b, "pair": [a * c, (jnp.exp(b),)], "scaled": cfg["s"] * c}

    inp = {"a": rand(2, 3), "bc": (rand(2, 3, seed=1), rand(2, 3, seed=2))}
    cfg = {"s": np.float32(0.5)}
    got = interp(fn)(inp, cfg)
    want = jax.jit(fn)(inp, cfg)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert_close(leaves(got), leaves(want))


def test_python_scalars_and_float64_follow_jax_canonicalization() -> None:
    f = interp(lambda x, s: x * s)
    x64 = np.arange(6, dtype=np.float64).reshape(2, 3)
    got = f(x64, 3)
    want = np.asarray(jax.jit(lambda x, s: x * s)(x64, 3))
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ cache

def test_same_signature_traces_once_and_new_shape_retraces() -> None:
    traces = []

    @interp
    def f(x):
        traces.append(x.shape)
        return jnp.sum(x * x, axis=-1)

    a, b, c = rand(2, 3), rand(2, 3, seed=1), rand(4, 3)
    for x in (a, b, a):
        np.testing.assert_allclose(f(x), np.sum(x * x, axis=-1), rtol=1e-6)
    assert traces == [(2, 3)]
    np.testing.assert_allclose(f(c), np.sum(c * c, axis=-1), rtol=1e-6)
    assert traces == [(2, 3), (4, 3)]
    f(a)
    f(c.astype(np.int32))            # new dtype: a new signature
    assert traces == [(2, 3), (4, 3), (4, 3)]
    assert f.trace_count == 3


def test_new_pytree_structure_retraces() -> None:
    traces = []

    @interp
    def f(d):
        traces.append(sorted(d))
        return sum(d.values())

    f({"a": rand(2)})
    f({"a": rand(2), "b": rand(2)})
    f({"a": rand(2, seed=3)})
    assert traces == [["a"], ["a", "b"]]


# ------------------------------------------------------------------ static arguments

def test_static_argnums() -> None:
    traces = []

    @interp(static_argnums=(1, 2))
    def f(x, n, mode):
        traces.append((n, mode))
        for _ in range(n):
            x = jnp.sin(x) if mode == "sin" else jnp.cos(x)
        return x

    x = rand(5)
    np.testing.assert_allclose(f(x, 2, "sin"), np.sin(np.sin(x)), rtol=1e-6)
    np.testing.assert_allclose(f(x, 2, "sin"), np.sin(np.sin(x)), rtol=1e-6)
    np.testing.assert_allclose(f(x, 3, "sin"), np.sin(np.sin(np.sin(x))), rtol=1e-6)
    assert traces == [(2, "sin"), (3, "sin")]


def test_negative_static_argnum_and_strings() -> None:
    f = interp(lambda x, op: jnp.exp(x) if op == "exp" else jnp.tanh(x),
                        static_argnums=-1)
    x = rand(4)
    np.testing.assert_allclose(f(x, "exp"), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(f(x, "tanh"), np.tanh(x), rtol=1e-6)


def test_unhashable_static_argument_is_a_trace_error() -> None:
    f = interp(lambda x, cfg: x * cfg[0], static_argnums=1)
    with pytest.raises(TraceError, match=r"static argument 1 \('cfg'\) must be hashable"):
        f(rand(3), [2.0])


# ------------------------------------------------------------------ resident arguments

def _mlp(params, x):
    h = jax.nn.relu(x @ params["encoder.layers.0.fc1.weight"] + params["encoder.layers.0.fc1.bias"])
    return h @ params["encoder.layers.0.fc2.weight"]


def _mlp_params(seed: int = 0) -> dict[str, np.ndarray]:
    return {"encoder.layers.0.fc1.weight": rand(4, 8, seed=seed),
            "encoder.layers.0.fc1.bias": rand(8, seed=seed + 1),
            "encoder.layers.0.fc2.weight": rand(8, 3, seed=seed + 2)}


def test_resident_leaves_become_named_params() -> None:
    f = interp(_mlp, resident_argnums=0)
    params, x = _mlp_params(), rand(2, 4, seed=9)
    lowered = f.lower(params, x)
    g = lowered.graph
    assert g.params() == {
        "encoder.layers.0.fc1.weight": rockjit.ir.types.TensorType(rockjit.ir.types.DType.F32,
                                                                   (4, 8)),
        "encoder.layers.0.fc1.bias": rockjit.ir.types.TensorType(rockjit.ir.types.DType.F32,
                                                                 (8,)),
        "encoder.layers.0.fc2.weight": rockjit.ir.types.TensorType(rockjit.ir.types.DType.F32,
                                                                   (8, 3)),
    }
    assert [v.type.shape for v in g.inputs] == [(2, 4)]       # only x is a graph input
    assert sum(n.op is Op.PARAM for n in g.nodes) == 3
    assert 'param() {name="encoder.layers.0.fc1.weight"}' in lowered.as_text()
    assert_close([f(params, x)], [np.asarray(jax.jit(_mlp)(params, x))], atol=1e-5)


def test_nested_resident_pytree_names_join_keys_with_dots() -> None:
    def fn(w, x):
        return x @ w["layers"][1]["w"] + w["bias"] + w["scale"]

    w = {"layers": [{"w": rand(3, 3)}, {"w": rand(3, 3, seed=1)}], "bias": rand(3, seed=2),
         "scale": rand(seed=3)}
    g = interp(fn, resident_argnums=0).lower(w, rand(2, 3)).graph
    assert set(g.params()) == {"bias", "scale", "layers.1.w"}  # layers.0.w is unused -> dropped


def test_bare_resident_array_is_named_after_the_parameter() -> None:
    g = interp(lambda x, embed: embed[x], resident_argnums=1).lower(
        np.array([0, 2], np.int32), rand(4, 3)).graph
    assert set(g.params()) == {"embed"}


def test_resident_values_bound_once_and_rebound_without_retrace() -> None:
    traces = []

    def fn(params, x):
        traces.append(1)
        return _mlp(params, x)

    f = interp(fn, resident_argnums=0)
    p0, p1, x = _mlp_params(0), _mlp_params(10), rand(2, 4, seed=9)
    want0 = np.asarray(jax.jit(_mlp)(p0, x))
    want1 = np.asarray(jax.jit(_mlp)(p1, x))
    assert_close([f(p0, x)], [want0], atol=1e-5)
    # The Compiled object keeps its own copies: writing into the user's array after binding
    # does not change what runs (the same objects are passed, so nothing is re-copied).
    saved = p0["encoder.layers.0.fc1.bias"].copy()
    p0["encoder.layers.0.fc1.bias"][:] = 100.0
    assert_close([f(p0, x)], [want0], atol=1e-5)
    p0["encoder.layers.0.fc1.bias"][:] = saved
    # New arrays of the same shapes: new values, no new trace.
    assert_close([f(p1, x)], [want1], atol=1e-5)
    assert len(traces) == 1


def test_resident_floats_are_kept_as_float32_copies() -> None:
    def fn(w, x):
        return x @ w["w"]

    w16 = {"w": rand(3, 2).astype(np.float16)}
    lowered = interp(fn, resident_argnums=0).lower(w16, rand(1, 3))
    compiled = lowered.compile()
    assert lowered.graph.params()["w"].dtype is rockjit.ir.types.DType.F32
    bound = compiled.params["w"]
    assert bound.dtype == np.float32 and bound is not w16["w"]
    np.testing.assert_array_equal(bound, w16["w"].astype(np.float32))


def test_resident_jax_arrays_are_bound_without_a_copy() -> None:
    # A jax array cannot be written in place, so its host view stands in for the copy a numpy
    # array gets; the result must not depend on the array object living on.
    p0, x = _mlp_params(0), rand(2, 4, seed=9)
    want = np.asarray(jax.jit(_mlp)(p0, x))
    pj = {k: jnp.asarray(v) for k, v in p0.items()}
    compiled = interp(_mlp, resident_argnums=0).lower(pj, x).compile()
    for k, v in pj.items():
        bound = compiled.params[k]
        assert np.shares_memory(bound, np.asarray(v)) and not bound.flags.writeable, k
    assert_close([compiled(pj, x)], [want], atol=1e-5)
    for v in pj.values():
        v.delete()
    # the same (now deleted) objects again: nothing is rebound, the views are still read
    assert_close([compiled(pj, x)], [want], atol=1e-5)
    # another dtype still becomes the graph's float32, as a copy
    w16 = {"w": jnp.asarray(rand(3, 2), jnp.bfloat16)}
    c16 = interp(lambda w, x: x @ w["w"], resident_argnums=0).lower(w16, rand(1, 3)).compile()
    assert c16.params["w"].dtype == np.float32
    np.testing.assert_array_equal(c16.params["w"], np.asarray(w16["w"], np.float32))


def test_lowering_with_shape_dtype_structs() -> None:
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _mlp_params().items()}
    x_sds = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    f = interp(_mlp, resident_argnums=0)
    lowered = f.lower(params, x_sds)
    assert len(lowered.graph.params()) == 3
    compiled = lowered.compile()
    real, x = _mlp_params(), rand(2, 4, seed=9)
    assert_close([compiled(real, x)], [np.asarray(jax.jit(_mlp)(real, x))], atol=1e-5)
    with pytest.raises(TraceError, match="ShapeDtypeStruct has no value"):
        compiled(real, x_sds)


def test_resident_without_values_is_a_trace_error() -> None:
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _mlp_params().items()}
    compiled = interp(_mlp, resident_argnums=0).lower(params, rand(2, 4)).compile()
    with pytest.raises(TraceError, match="resident param 'encoder.layers.0.fc1.(weight|bias)'"):
        compiled(params, rand(2, 4))


# ------------------------------------------------------------------ lowering

def test_lowered_text_parses_back_to_the_graph() -> None:
    def fn(p, x, ids):
        e = p["embed"][ids]
        h = jax.nn.gelu(e @ p["w"] + x)
        return jax.nn.softmax(h, axis=-1), jnp.where(h > 0, h, -h).max()

    p = {"embed": rand(10, 4), "w": rand(4, 4, seed=1)}
    lowered = interp(fn, resident_argnums=0).lower(p, rand(3, 4),
                                                            np.array([1, 5, 9], np.int32))
    text = lowered.as_text()
    assert str(lowered) == text
    assert parse(text) == lowered.graph


def test_lower_compile_call_matches_jax() -> None:
    x, w = rand(3, 4), rand(4, 5, seed=1)
    compiled = interp(_affine).lower(x, w).compile()
    assert_close(leaves(compiled(x, w)), leaves(jax.jit(_affine)(x, w)))


def test_compiled_accepts_calls_with_or_without_static_arguments() -> None:
    f = interp(lambda x, k: x * k, static_argnums=1)
    compiled = f.lower(rand(3), 2.0).compile()
    x = rand(3, seed=5)
    np.testing.assert_array_equal(compiled(x), x * np.float32(2.0))
    np.testing.assert_array_equal(compiled(x, 2.0), x * np.float32(2.0))
    with pytest.raises(TraceError, match=r"static argument 1 \('k'\): compiled for 2.0, got 3.0"):
        compiled(x, 3.0)


def test_trace_spec_lower() -> None:
    spec = TraceSpec(lambda w, x: x @ w, (rand(3, 2), jax.ShapeDtypeStruct((5, 3), jnp.float32)),
                     resident_argnums=(0,))
    g = spec.lower().graph
    assert set(g.params()) == {"w"}


# ------------------------------------------------------------------ TraceError

def test_unsupported_input_dtype_names_argument_and_path() -> None:
    def fn(x, extra):
        return x + extra["b"].real

    f = interp(fn)
    with pytest.raises(TraceError) as e:
        f(rand(2), {"b": np.ones(2, np.complex64)})
    msg = str(e.value)
    assert "argument 1 ('extra') at pytree path ['b']" in msg
    # no cast keeps a complex value's meaning, so the advice is not .astype() (issue 10)
    assert "complex64" in msg and "f32" in msg and ".astype()" not in msg
    assert "real and imaginary parts" in msg


def test_non_array_leaf_suggests_static() -> None:
    f = interp(lambda x, name: x)
    with pytest.raises(TraceError, match=r"argument 1 \('name'\): expected an array, got str.*"
                                         r"static_argnums=1"):
        f(rand(2), "hello")


def test_compiled_rejects_other_shapes_dtypes_and_structures() -> None:
    def fn(inp):
        return inp["x"] * 2.0 + inp["y"].sum()

    compiled = interp(fn).lower({"x": rand(2, 3), "y": rand(4)}).compile()
    with pytest.raises(TraceError) as e:
        compiled({"x": rand(2, 4), "y": rand(4)})
    assert "argument 0 ('inp') at pytree path ['x']: expected f32[2,3], got f32[2,4]" in str(e.value)
    with pytest.raises(TraceError) as e:
        compiled({"x": rand(2, 3, 1), "y": rand(4)})   # wrong rank
    assert "argument 0 ('inp') at pytree path ['x']: expected f32[2,3], got f32[2,3,1]" in str(
        e.value)
    with pytest.raises(TraceError, match=r"\['y'\]: expected f32\[4\], got i32\[4\]"):
        compiled({"x": rand(2, 3), "y": np.ones(4, np.int32)})
    with pytest.raises(TraceError, match="pytree structure differs"):
        compiled({"x": rand(2, 3), "y": rand(4), "z": rand(1)})
    with pytest.raises(TraceError, match=r"compiled for 1 argument\(s\) \(0 static\), called "
                                         r"with 2"):
        compiled({"x": rand(2, 3), "y": rand(4)}, rand(1))


def test_argnums_out_of_range() -> None:
    f = interp(lambda x: x, resident_argnums=3)
    with pytest.raises(TraceError, match="resident_argnums names argument 3, but the call passes "
                                         "1 positional argument"):
        f(rand(2))


def test_duplicate_param_names_are_refused() -> None:
    f = interp(lambda a, b: a["w"] + b["w"], resident_argnums=(0, 1))
    with pytest.raises(TraceError, match="both map to the param name 'w'"):
        f.lower({"w": rand(2)}, {"w": rand(2)})


# ------------------------------------------------------------------ backends

def test_backend_registry_hook() -> None:
    calls = []

    @register_backend("test-recorder")
    def _factory(graph, params):
        calls.append(("build", sorted(params)))

        def runner(inputs):
            calls.append(("run", [a.shape for a in inputs]))
            from rockjit.ir.interpreter import run
            return run(graph, inputs, params)
        return runner

    try:
        f = rockjit.compile(lambda w, x: x @ w, resident_argnums=0, backend="test-recorder")
        w, x = rand(3, 2), rand(4, 3)
        np.testing.assert_allclose(f(w, x), x @ w, rtol=1e-6)
        f(w, x)
        assert calls == [("build", ["w"]), ("run", [(4, 3)]), ("run", [(4, 3)])]
    finally:
        del BACKENDS["test-recorder"]


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend 'npu-that-does-not-exist'"):
        rockjit.compile(lambda x: x, backend="npu-that-does-not-exist")
