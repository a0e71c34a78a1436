"""Device faults injected through the rocket ioctl fake (csrc/rocket/fake_rocket.c): each gives
a DeviceError naming the step and the job, never hangs past the program timeout, frees every BO,
and the compiled function works again once the fault clears (issue 10)."""
from __future__ import annotations

import errno
import gc
import time

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.runtime import DeviceError, DeviceTimeoutError, fake_rocket

TIMEOUT_S = 0.3


def _fn(x):
    return jnp.tanh(x * 2.0) + x


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("RJ_FAKE_ROCKET", "1")
    gc.collect()  # compiled functions of earlier tests hold fds until collected
    fake_rocket.reset()
    yield fake_rocket
    fake_rocket.set_faults()
    gc.collect()
    s = fake_rocket.stats()
    assert s["open_fds"] == 0 and s["live_bos"] == 0, f"fake rocket leaked: {s}"


@pytest.fixture
def warm(fake):
    """A compiled function on the fake, called once, with a short fence timeout; returns
    (f, x, expected) where expected is its serial result, checked against numpy."""
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    f = rockjit.compile(_fn, backend="rocket")
    want = np.asarray(f(x))
    np.testing.assert_allclose(want, np.tanh(2 * x) + x, atol=2e-2)
    _set_timeout(f, x)
    yield f, x, want
    f.clear_cache()


def _set_timeout(f, x) -> None:
    runner = f.compiled(x)._runner
    runner.loaded_graph.program.set_timeout(TIMEOUT_S)


def _no_bos_left() -> None:
    s = fake_rocket.stats()
    assert s["live_bos"] == 0 and s["open_fds"] == 0, s


def _recovers(f, x, want) -> None:
    fake_rocket.set_faults()
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    np.testing.assert_array_equal(np.asarray(f(x)), want)


@pytest.mark.parametrize("code,text", [(errno.EINVAL, "Invalid argument"),
                                       (errno.ENOMEM, "Cannot allocate memory")])
def test_submit_fails(warm, code, text):
    f, x, want = warm
    fake_rocket.set_faults(fail_submit=1, submit_errno=code)
    with pytest.raises(DeviceError) as e:
        f(x)
    msg = str(e.value)
    assert msg.startswith("step ") and "(NPU, job " in msg and "SUBMIT" in msg and text in msg
    _no_bos_left()
    _recovers(f, x, want)


def test_prep_bo_times_out(warm):
    f, x, want = warm
    fake_rocket.set_faults(prep_timeout=1)
    with pytest.raises(DeviceTimeoutError, match=r"^step \d+ \(NPU, job \d+.*did not finish before "
                                                 r"the deadline"):
        f(x)
    _no_bos_left()
    _recovers(f, x, want)


def test_job_never_completes(warm):
    f, x, want = warm
    fake_rocket.set_faults(hang_jobs=1)
    t0 = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match=r"^step \d+ \(NPU, job \d+.*500 ms"):
        f(x)
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0  # no hang beyond the timeout
    _no_bos_left()
    _recovers(f, x, want)


def test_dropped_job_is_not_a_silent_stale_result(warm):
    """The kernel drops a job whose BO handle is gone and SUBMIT still returns 0; the fence
    then signals at once. The fake reports it, so the call fails instead of returning the
    previous call's output."""
    f, x, want = warm
    fake_rocket.set_faults(drop_jobs=1)
    with pytest.raises(DeviceError, match=r"^step \d+ \(NPU, job \d+.*dropped 1 job.*handle of the "
                                          r"job was closed"):
        f(x + 1)
    _no_bos_left()
    _recovers(f, x, want)


def test_short_bo_faults_on_the_device(fake):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    f = rockjit.compile(_fn, backend="rocket")
    fake_rocket.set_faults(short_bo_at=1)   # the first BO of the program: context 0's arena
    with pytest.raises(DeviceError, match=r"^step \d+ \(NPU, job \d+.*faulted: the NPU reached memory "
                                          r"outside its BOs"):
        f(x)
    _no_bos_left()
    fake_rocket.set_faults()
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(2 * x) + x, atol=2e-2)
    f.clear_cache()


def test_device_goes_away_between_calls(warm):
    f, x, want = warm
    fake_rocket.set_faults(device_gone=1)
    with pytest.raises(DeviceError, match=r"^step \d+ \(NPU, job \d+.*No such device.*went away"):
        f(x)
    _no_bos_left()
    # still gone: the reload fails cleanly too, and leaks nothing
    with pytest.raises(DeviceError, match="No such device"):
        f(x)
    _no_bos_left()
    _recovers(f, x, want)


def test_device_gone_at_the_first_call(fake):
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    f = rockjit.compile(_fn, backend="rocket")
    fake_rocket.set_faults(device_gone=1)
    with pytest.raises(DeviceError, match=r"CREATE_BO .* No such device.*went away"):
        f(x)
    _no_bos_left()  # the half-built program's BOs were freed with the device
    fake_rocket.set_faults()
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(2 * x) + x, atol=2e-2)
    f.clear_cache()
