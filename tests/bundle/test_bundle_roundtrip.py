"""Bundles round-trip: compiled.save -> rockjit.load runs the same program, bit for bit, on
the simulator and on the rocket device through the ioctl fake; rockjit.export compiles from
ShapeDtypeStructs alone; results are checked against JAX on the CPU within the graph's fp16
bound (the independent reference), and the bundle's signature refuses wrong inputs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.runtime import fake_rocket

from .bundle_testutil import block, check_against_jax, example, weights


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), f"{k} differs"


@pytest.fixture(scope="module")
def sim_case(tmp_path_factory):
    p, x = weights(), example()
    f = rockjit.compile(block, resident_argnums=0, backend="sim")
    y = f(p, x)
    c = f.compiled(p, x)
    path = tmp_path_factory.mktemp("sim") / "block.rjb"
    manifest = c.save(str(path))
    return c, p, x, y, path, manifest


def test_sim_bundle_equals_compiled_bit_for_bit(sim_case) -> None:
    c, p, x, y, path, manifest = sim_case
    check_against_jax(c, p, x, y)
    with rockjit.load(path, backend="sim") as b:
        _equal(b(x), y)
        # another input through both: still the same program
        x2 = example(seed=5)
        _equal(b(x2), c(p, x2))
        assert b.stats()["npu_ops"] == c.stats()["npu_ops"] > 0
        assert b.stats()["rt_runs"] == 2


def test_manifest_describes_the_program(sim_case) -> None:
    c, p, x, y, path, m = sim_case
    assert m["format_version"] == 1 and m["chip_profile"] == "rk3588"
    assert m["compiler"]["version"] == rockjit.__version__
    assert "submit" in m["uapi_features"]
    assert m["signature"]["inputs"] == [{"name": "x", "shape": [16, 64], "dtype": "float32"}]
    assert {o["dtype"] for o in m["signature"]["outputs"]} == {"float32"}
    assert set(m["parts"]) == {"image.json", "image.safetensors", "weights.safetensors"}
    assert all(len(v["sha256"]) == 64 for v in m["parts"].values())


def test_weights_part_is_safetensors_holding_the_packed_weights(sim_case) -> None:
    """The weights part opens with the safetensors library; the resident fp16 weights are in
    it (checked against the user's weights rounded to fp16, not against our packer)."""
    from safetensors.numpy import load

    from .bundle_testutil import part

    c, p, x, y, path, m = sim_case
    tensors = load(part(path.read_bytes(), "weights.safetensors"))
    assert tensors and all(a.dtype == np.uint8 for a in tensors.values())
    total = sum(a.size for a in tensors.values())
    # every weight element is stored at least once, in fp16 (2 bytes)
    assert total >= 2 * sum(a.size for a in p.values())
    b1 = p["b1"].astype(np.float16).tobytes()
    assert any(b1[:32] in a.tobytes() for a in tensors.values()), "bias bytes not found"


def test_rocket_fake_bundle_equals_compiled_bit_for_bit(sim_case, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RJ_FAKE_ROCKET", "1")
    fake_rocket.reset()
    _, p, x, y_sim, _, _ = sim_case
    f = rockjit.compile(block, resident_argnums=0, backend="rocket")
    y = f(p, x)
    path = tmp_path / "block_rocket.rjb"
    f.compiled(p, x).save(str(path))
    before = fake_rocket.stats()["submits"]
    with rockjit.load(path, backend="rocket") as b:
        assert b.backend == "rocket"
        _equal(b(x), y)
    assert fake_rocket.stats()["submits"] > before      # it ran through the ioctl fake
    _equal(y, y_sim)        # the fake runs the simulator: the same bits as the sim backend


def test_export_from_shape_dtype_structs(tmp_path) -> None:
    p, x = weights(seed=3), example(seed=4)
    spec = jax.ShapeDtypeStruct(x.shape, jnp.float32)
    e = rockjit.export(block, p, spec, resident_argnums=0, backend="sim")
    assert e.image is not None              # compiled without any example data
    path = tmp_path / "exported.rjb"
    e.save(str(path))
    with rockjit.load(path, backend="sim") as b:
        got = b(x)
    _equal(got, e(p, x))
    check_against_jax(e, p, x, got)


def _heads(p, x):
    q = (x @ p["wq"]).reshape(48, 6, 32).transpose(1, 0, 2)
    k = (x @ p["wk"]).reshape(48, 6, 32).transpose(1, 0, 2)
    return jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k), axis=-1)


def test_multi_context_program_round_trips(tmp_path) -> None:
    """Attention heads spread over the three cores' contexts (own BOs, host copies between
    them): the bundle keeps all of it."""
    rng = np.random.default_rng(8)
    p = {n: (rng.standard_normal((192, 192)) / 14).astype(np.float32) for n in ("wq", "wk")}
    x = rng.standard_normal((48, 192)).astype(np.float32)
    f = rockjit.compile(_heads, resident_argnums=0, backend="sim")
    y = f(p, x)
    c = f.compiled(p, x)
    assert c.stats()["cores_used"] > 1
    m = c.save(str(tmp_path / "heads.rjb"))
    assert "multi-context" in m["uapi_features"]
    with rockjit.load(tmp_path / "heads.rjb", backend="sim") as b:
        assert np.array_equal(b(x), y)


def test_signature_refuses_wrong_inputs(sim_case) -> None:
    c, p, x, y, path, _ = sim_case
    with rockjit.load(path, backend="sim") as b:
        with pytest.raises(rockjit.BundleError, match=r"input x: .*float32\[16, 64\].*\[8, 64\]"):
            b(x[:8])
        with pytest.raises(rockjit.BundleError, match=r"input x: .*int32"):
            b(x.astype(np.int32))
        with pytest.raises(rockjit.BundleError, match="takes 1 argument"):
            b(x, x)
        with pytest.raises(rockjit.BundleError, match="expected an array"):
            b("x")
        # float64 is taken as float32, as jax.jit does with x64 off
        _equal(b(x.astype(np.float64)), y)


def test_placement_report_is_public(sim_case) -> None:
    c, p, x, y, path, _ = sim_case
    places = c.placement()
    assert {pl.where for pl in places} <= {"npu", "host", "view", "const"}
    assert any(pl.where == "npu" and "matmul" in pl.how for pl in places)
    assert all("bundle_testutil.py" in pl.loc for pl in places if pl.where == "npu")
    with rockjit.load(path, backend="sim") as b:
        assert b.placement() == places
        # every NPU step names the user's line it came from
        steps = b.step_list().splitlines()
        assert steps and all("bundle_testutil.py:" in s for s in steps if " npu " in s)


def test_save_needs_an_npu_backend(tmp_path) -> None:
    f = rockjit.compile(block, resident_argnums=0, backend="interpreter")
    c = f.compiled(weights(), example())
    with pytest.raises(rockjit.TraceError, match="needs an NPU program"):
        c.save(str(tmp_path / "x.rjb"))
