"""Differential fuzzing of the lowering (issue 13): random single ops and small graphs (matmul,
batched matmul, conv/conv1d/depthwise, pooling, element-wise with every broadcast form, LUT
activations, reductions, data movement, short chains), each with leading batch dims 1-4, built
as plain JAX functions, compiled for the strict simulator (a quarter on the derived 6-bank,
2-core profile) and compared with the IR interpreter under tolerance.graph_bound; the
interpreter itself is checked against JAX on CPU. The strategies are in fuzz_graphs.py.

CI runs a fixed, derandomized set plus a few fresh examples; bench/fuzz_lowering.py runs for
as long as asked. A shrunk failure goes into REGRESSIONS below with the fix at its root.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_graphs as FG
from rockjit.lowering import tolerance as T
from opprogram_sim import MISSING

sim = pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")

# Graphs that failed once (shrunk by hypothesis), each kept with its fix. Each entry:
# (spec, what was wrong).
REGRESSIONS: list[tuple[dict, str]] = [
]

_CI = dict(deadline=None, database=None, print_blob=True,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(spec: dict) -> None:
    out = FG.run_spec(spec)
    assert out == "ok" or out.startswith("refused"), out


@sim
@pytest.mark.slow
@settings(max_examples=110, derandomize=True, **_CI)
@given(spec=FG.specs())
def test_fuzz_fixed_set(spec: dict) -> None:
    """A fixed (derandomized) set: the same graphs on every run. ~45 s on 2 shared cores."""
    _check(spec)


@sim
@pytest.mark.slow
@settings(max_examples=25, **_CI)
@given(spec=FG.specs())
def test_fuzz_fresh(spec: dict) -> None:
    """A few fresh graphs per run, so CI keeps exploring; a failure prints its spec to paste
    into REGRESSIONS."""
    _check(spec)


@sim
@pytest.mark.parametrize("spec", [s for s, _ in REGRESSIONS] or [None],
                         ids=[FG.describe(s)[:60] for s, _ in REGRESSIONS] or ["none"])
def test_fuzz_regressions(spec: dict | None) -> None:
    if spec is None:
        pytest.skip("no regression cases recorded")
    assert FG.run_spec(spec) == "ok"


def test_comparison_can_fail() -> None:
    """The differential check rejects a wrong answer: a matmul result with one element moved by
    a few bounds fails T.check under the same bound run_spec uses."""
    spec = dict(op="matmul", batch=(2,), m=5, k=40, n=7, bias=False, weight="resident",
                seed=3, profile="rk3588")
    fn, p, xs = FG.build(spec)
    ref = np.asarray(fn(p, *xs), np.float64)
    bound = T.matmul_bound(xs[0], np.swapaxes(p["w"], 0, 1))
    bad = ref.copy()
    bad[1, 2, 3] += 4 * bound[1, 2, 3]
    T.check(ref, ref, bound)
    with pytest.raises(AssertionError):
        T.check(bad, ref, bound)


@sim
def test_second_profile_is_used_and_removed() -> None:
    """A fuzz-small example really compiles for 2 cores, and the profile is gone afterwards
    (test_second_profile.py registers its own and expects a clean registry)."""
    import rockjit
    from rockjit.lowering.profile import profile_names

    spec = dict(op="matmul", batch=(3,), m=64, k=256, n=1536, bias=False, weight="resident",
                seed=5, profile=FG.SMALL)
    fn, p, xs = FG.build(spec)
    with FG.profile_registered(FG.SMALL):
        f = rockjit.compile(fn, resident_argnums=0, backend=FG.backend_for(FG.SMALL))
        f(p, *xs)
        assert f.stats(p, *xs)["cores_used"] == 2
    assert FG.SMALL not in profile_names()
    assert FG.run_spec(spec) == "ok"
