"""``rockjit.compile``'s default backend is "auto": the rocket device when /dev/accel/accel0
opens (or RJ_FAKE_ROCKET serves it), else the simulator -- said once per process; never the
interpreter unless asked for."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import rockjit
from rockjit.runtime.device_choice import accel_available

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import jax.numpy as jnp, numpy as np, rockjit
f = rockjit.compile(lambda x: jnp.tanh(x) * 2.0)
g = rockjit.compile(lambda x: x @ x.T)
x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(4, 16)
f(x); g(x); f(x + 1)
c = f.compiled(x)
print("backend", f.backend, "npu_ops", c.stats()["npu_ops"], "device", c._runner.device.kind)
"""


def _run(env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RJ_FAKE_ROCKET", None)
    env.update(PYTHONPATH=str(REPO), **env_extra)
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)


def test_auto_says_once_what_it_chose() -> None:
    r = _run({})
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "backend 'auto'" in ln]
    assert len(said) == 1, r.stderr
    has_npu, _ = accel_available()
    want = "rocket" if has_npu else "sim"
    assert ("rocket NPU device" if has_npu else "C simulator") in said[0]
    assert r.stdout.split()[:2] == ["backend", "auto"]
    assert r.stdout.split()[-1] == want
    assert int(r.stdout.split()[3]) > 0          # the NPU program ran, not numpy


def test_auto_takes_the_rocket_fake_when_asked() -> None:
    r = _run({"RJ_FAKE_ROCKET": "1"})
    assert r.returncode == 0, r.stderr
    assert "RJ_FAKE_ROCKET=1" in r.stderr
    assert r.stdout.split()[-1] == "rocket"


def test_interpreter_only_when_asked() -> None:
    import inspect

    assert inspect.signature(rockjit.compile).parameters["backend"].default == "auto"
    f = rockjit.compile(lambda x: x + 1, backend="interpreter")
    assert f.backend == "interpreter"
