"""Compiled functions are safe to call from several threads: every result is bit-identical to
the same call made serially, a signature is traced and compiled once even when the first calls
race, and two compiled functions run side by side (issue 10)."""
from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit

THREADS, CALLS = 8, 50


def _tanh_res(x):
    return jnp.tanh(x * 2.0) + x


def _scaled_sum(x):
    return x * 0.5 - jnp.sum(x, axis=-1, keepdims=True)


def _inputs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(n)]


def _hammer(fns_and_inputs, threads: int) -> tuple[dict, list[BaseException]]:
    """Call every (fn, x) job from `threads` threads released together; returns results by
    (fn index, input index) and every exception raised."""
    jobs = [(fi, i) for fi, (_, xs) in enumerate(fns_and_inputs) for i in range(len(xs))]
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(k: int) -> None:
        start.wait()
        for fi, i in jobs[k::threads]:
            fn, xs = fns_and_inputs[fi]
            try:
                results[(fi, i)] = np.asarray(fn(xs[i]))
            except BaseException as e:  # collected: a thread's exception must fail the test
                errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a calling thread hung"
    return results, errors


@pytest.fixture(params=["sim", "rocket"])
def backend(request, monkeypatch):
    if request.param == "rocket":
        monkeypatch.setenv("RJ_FAKE_ROCKET", "1")
    return request.param


def test_warm_calls_from_8_threads_match_serial(backend):
    f = rockjit.compile(_tanh_res, backend=backend)
    xs = _inputs(THREADS * CALLS, seed=1)
    serial = [np.asarray(f(x)) for x in xs]
    # the serial results are right in the first place (independent reference: numpy)
    np.testing.assert_allclose(serial[0], np.tanh(xs[0] * 2.0) + xs[0], atol=2e-2)
    results, errors = _hammer([(f, xs)], THREADS)
    assert not errors, errors[:3]
    wrong = [i for i in range(len(xs)) if not np.array_equal(results[(0, i)], serial[i])]
    assert not wrong, f"{len(wrong)} of {len(xs)} concurrent results differ from the serial call"
    assert f.trace_count == 1


def test_two_compiled_functions_at_once(backend):
    f = rockjit.compile(_tanh_res, backend=backend)
    g = rockjit.compile(_scaled_sum, backend=backend)
    xf, xg = _inputs(100, seed=2), _inputs(100, seed=3)
    sf = [np.asarray(f(x)) for x in xf]
    sg = [np.asarray(g(x)) for x in xg]
    results, errors = _hammer([(f, xf), (g, xg)], THREADS)
    assert not errors, errors[:3]
    for fi, serial in ((0, sf), (1, sg)):
        wrong = [i for i in range(100) if not np.array_equal(results[(fi, i)], serial[i])]
        assert not wrong, f"function {fi}: {len(wrong)} concurrent results differ"


def test_cold_first_calls_race_compile_once(backend):
    """The first calls of a fresh function race: one trace + compile, no spurious errors."""
    xs = _inputs(THREADS * 4, seed=4)
    f = rockjit.compile(_tanh_res, backend=backend)
    results, errors = _hammer([(f, xs)], THREADS)
    assert not errors, errors[:3]
    assert f.trace_count == 1
    # the same program called serially afterwards (a second compiled function could calibrate
    # its LUT domains on another first input, rockjit/lowering/calibrate.py)
    wrong = [i for i in range(len(xs)) if not np.array_equal(results[(0, i)], np.asarray(f(xs[i])))]
    assert not wrong
    np.testing.assert_allclose(results[(0, 0)], np.tanh(xs[0] * 2.0) + xs[0], atol=2e-2)
