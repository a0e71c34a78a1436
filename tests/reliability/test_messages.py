"""Every refusal of issue 10 says what was wrong, where, and what to do."""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import rockjit
from models.weights import load_safetensors
from rockjit.errors import TraceError, UnsupportedError, WeightError
from rockjit.runtime import DeviceError

HERE = os.path.basename(__file__)


# ---- weights -------------------------------------------------------------------------------

@pytest.fixture
def good_file(tmp_path):
    p = tmp_path / "good.safetensors"
    save_file({"enc.w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(p))
    return p


@pytest.mark.parametrize("damage,what", [
    (lambda b: b[:-4], "not a readable safetensors file"),     # truncated data
    (lambda b: b[:10], "not a readable safetensors file"),     # truncated header
    (lambda b: b"", "is empty (0 bytes)"),
    (lambda b: b"PK\x03\x04" + b"\0" * 60, "not a readable safetensors file"),  # a zip (.pt)
])
def test_broken_weight_files_name_the_path(good_file, damage, what):
    bad = good_file.with_name("bad.safetensors")
    bad.write_bytes(damage(good_file.read_bytes()))
    with pytest.raises(WeightError) as e:
        load_safetensors(bad, {"enc.w": (2, 3)})
    msg = str(e.value)
    assert str(bad) in msg and what in msg
    assert "re-download" in msg or "write it again" in msg


@pytest.mark.parametrize("dt,tag", [(np.int8, "I8"), (np.bool_, "BOOL"), (np.int32, "I32")])
def test_non_float_weights_are_refused(tmp_path, dt, tag):
    p = tmp_path / "q.safetensors"
    save_file({"enc.w": np.ones((2, 3), dt)}, str(p))
    with pytest.raises(WeightError, match=rf"tensor 'enc.w' is stored as {tag}, but the model "
                                          r"expects floating-point weights.*dequantized"):
        load_safetensors(p, {"enc.w": (2, 3)})


def test_good_file_still_loads(good_file):
    got = load_safetensors(good_file, {"enc.w": (2, 3)})
    np.testing.assert_array_equal(got["enc.w"], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_directory_is_not_reported_missing(good_file):
    with pytest.raises(WeightError, match=r"is a directory, not a safetensors file; pass the "
                                          r"\.safetensors file itself; it holds good\.safetensors"):
        load_safetensors(good_file.parent, {"enc.w": (2, 3)})


def test_missing_file(tmp_path):
    with pytest.raises(WeightError, match="does not exist; check the path"):
        load_safetensors(tmp_path / "nope.safetensors", {"enc.w": (2, 3)})


# ---- backends ------------------------------------------------------------------------------

def test_rocket_without_device_is_refused_at_compile(monkeypatch):
    from rockjit.lowering import backend as B

    monkeypatch.delenv("RJ_FAKE_ROCKET", raising=False)
    monkeypatch.setattr(B, "ROCKET_NODE", "/dev/accel/no_such_node")
    with pytest.raises(DeviceError, match=r'needs the NPU device node /dev/accel/no_such_node.*'
                                          r'backend="sim"'):
        rockjit.compile(lambda x: x + 1, backend="rocket")
    # with the fake the same compile is accepted
    monkeypatch.setenv("RJ_FAKE_ROCKET", "1")
    f = rockjit.compile(lambda x: x + 1, backend="rocket")
    np.testing.assert_array_equal(f(np.ones((2, 8), np.float32)), np.full((2, 8), 2, np.float32))


def test_rocket_bad_flag_value_is_refused_at_compile(monkeypatch):
    monkeypatch.setenv("RJ_FAKE_ROCKET", "ture")
    with pytest.raises(ValueError, match="RJ_FAKE_ROCKET=ture is not a switch value"):
        rockjit.compile(lambda x: x + 1, backend="rocket")


# ---- ops and dtypes ------------------------------------------------------------------------

def test_fft_is_not_told_to_cast():
    f = rockjit.compile(lambda x: jnp.abs(jnp.fft.fft(x)), backend="interpreter")
    with pytest.raises(UnsupportedError) as e:
        f(np.ones((4, 8), np.float32))
    msg = str(e.value)
    assert ".astype()" not in msg and "complex64" in msg
    assert f"{HERE}:" in msg and "outside the compiled function" in msg


def test_complex_argument_is_not_told_to_cast():
    f = rockjit.compile(lambda x: x * 2, backend="interpreter")
    with pytest.raises(TraceError) as e:
        f(np.ones(4, np.complex64))
    assert ".astype()" not in str(e.value) and "argument 0 ('x')" in str(e.value)


def test_float64_argument_is_still_told_to_cast():
    # a real dtype outside the IR can be cast; x64 is off so jax sees f32 for f64 arrays,
    # int64 too (i32): uint16 has no IR type and no canonical twin
    f = rockjit.compile(lambda x: x * 2, backend="interpreter")
    with pytest.raises(TraceError, match=r"dtype uint16 .*cast it with \.astype\(\) before the call"):
        f(np.ones(4, np.uint16))


def test_no_lowering_names_real_registries(monkeypatch):
    """The refusal used to cite 'docs of rockjit.lowering.rules', which do not exist."""
    from rockjit.lowering import partition
    from rockjit.lowering.rules import LOWER_RULES

    graph = rockjit.compile(lambda x: jnp.exp(x), backend="interpreter").lower(
        np.ones((2, 4), np.float32)).graph
    node = next(n for n in graph.nodes if n.op.text == "exp")
    monkeypatch.setattr(partition, "host_rules", lambda: {})
    monkeypatch.setattr(partition, "host_rule", lambda op: None)   # the per-node lookup
    with pytest.raises(UnsupportedError) as e:
        partition.host_result(node, None, "test: pretend the NPU refused")
    msg = str(e.value)
    assert "docs of" not in msg and "LOWER_RULES" in msg and "HOST_RULES" in msg
    assert f"{HERE}:" in msg
    assert next(iter(LOWER_RULES)).text in msg
