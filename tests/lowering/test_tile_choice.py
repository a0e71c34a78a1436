"""Tilings chosen by modelled cost (rockjit/lowering/tile_choice.py).

The model's ranking itself is checked against the published tile-shape A/B in
tests/cost/test_tile_ordering.py; here: the choice is the least modelled plan among the legal
ones at least as tall as wide with the rule's K steps, and keeps the rule where the model does
not find it clearly slower; short-and-wide tiles and other K steps (other output bits) are never
picked over the rule, the overruled plan
computes the product within the fp16 bound against numpy on the simulator, and every decision
is counted in the program's stats and listed in its image.
"""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import pytest

import rockjit
from op_lowering_sim import MISSING, run_matmul
from rockjit.ir.types import DType
from rockjit.lowering import tile_choice as TC
from rockjit.lowering.emitters.matmul import _matmul_shape, build_matmul, plan_matmul
from rockjit.lowering.loaded_graph import LoadedGraph
from rockjit.lowering.pipeline import lower_graph
from rockjit.lowering.profile import get_profile
from rockjit.lowering.tiling import candidates, rule_choice
from rockjit.oracle import tolerance as T
from rockjit.runtime import SimDevice
from rockjit.runtime.image import ProgramImage

P = get_profile("rk3588")
F16 = DType.F16
sim = pytest.mark.skipif(bool(MISSING), reason=f"simulator not built: {MISSING}")


@pytest.mark.parametrize("mkn", [(512, 2048, 4096), (196, 768, 3072), (1024, 3072, 768),
                                 (16, 8192, 32)])
def test_choice_is_the_least_modelled_and_overrules_only_by_a_margin(mkn):
    m, k, n = mkn
    plan, _ = plan_matmul(m, k, n, F16, F16, P)
    plans = candidates(_matmul_shape(m, k, n, F16, F16, P), P)
    # the model may pick among the tiles at least as tall as wide with the rule's K steps,
    # or keep the rule
    rule = rule_choice(plans)
    every = [TC.modelled_ms(p, P, True) for p in plans
             if (TC._tall(p) and TC._same_k_steps(p, rule)) or p == rule]
    ch = plan.choice
    assert ch.rule_plan == rule.describe()
    assert ch.modelled_ms == pytest.approx(min(every)), ch.describe()
    if ch.agrees:
        assert plan == rule and "rule kept" in ch.describe()
    else:
        assert ch.modelled_ms < ch.rule_ms * (1 - TC.MARGIN)
        assert "overruled" in ch.describe() and rule.describe() in ch.describe()


def test_the_published_asymmetric_tile_ranks_first_but_the_rules_k_steps_are_run():
    # notes perf/asymmetric-tile.md: Mt=256 / Nt=128 / Kt=512 beats Mt=Nt=256 / Kt=384 on
    # 512x2048x4096 (+13.8 %). The model ranks it first among the tall tiles; the rule splits K
    # into 8 x 256, and the plan run keeps those K steps (so its output bits), taking the
    # model's best N tiling among them
    shape = _matmul_shape(512, 2048, 4096, F16, F16, P)
    plans = candidates(shape, P)
    best = min((p for p in plans if TC._tall(p)), key=lambda p: TC.modelled_ms(p, P, True))
    assert (max(r.out_rows for r in best.rows), max(k.size for k in best.kernels),
            max(c.size for c in best.channels)) == (256, 128, 512)
    plan, _ = plan_matmul(512, 2048, 4096, F16, F16, P)
    rule = rule_choice(plans)
    assert not plan.choice.agrees
    assert plan.channels == rule.channels and max(c.size for c in plan.channels) == 256
    assert max(k.size for k in plan.kernels) == 128


def test_a_margin_keeps_the_rule():
    plans = candidates(_matmul_shape(196, 3072, 768, F16, F16, P), P)
    rule = rule_choice(plans)
    best = min((p for p in plans if TC._tall(p) and TC._same_k_steps(p, rule)),
               key=lambda p: TC.modelled_ms(p, P, True))
    assert best != rule
    gain = 1 - TC.modelled_ms(best, P, True) / TC.modelled_ms(rule, P, True)
    old = TC.MARGIN
    try:
        TC.MARGIN = gain + 0.01
        kept = TC._choose(plans, P, True, 1)
    finally:
        TC.MARGIN = old
    assert kept == rule and kept.choice.agrees


@pytest.mark.parametrize("mkn", [(196, 768, 3072), (196, 3072, 768), (1024, 768, 3072),
                                 (1500, 512, 2048), (512, 2048, 4096)])
def test_the_rules_k_steps_are_kept(mkn):
    # the model alone would take SigLIP's fc1 (196 x 768 -> 3072) into one K pass of 32-channel
    # tiles; other K steps add every output's partial sums in another order (other bits), so
    # the plan run has the rule's K steps whichever N and M tiling it takes
    plans = candidates(_matmul_shape(*mkn, F16, F16, P), P)
    rule = rule_choice(plans)
    plan = plan_matmul(*mkn, F16, F16, P)[0]
    assert plan.channels == rule.channels
    if mkn == (196, 768, 3072):
        assert rule.k_steps > 1
        assert min(plans, key=lambda p: TC.modelled_ms(p, P, True)).k_steps == 1


def test_short_wide_tiles_are_not_picked():
    # the model alone would cut Whisper-base's fc2 (1500 x 2048 -> 512) into 17 row tiles of
    # 92 rows x 176 channels; the measured direction keeps the rows taller than the channels
    plans = candidates(_matmul_shape(1500, 2048, 512, F16, F16, P), P)
    assert not TC._tall(min(plans, key=lambda p: TC.modelled_ms(p, P, True)))
    plan, _ = plan_matmul(1500, 2048, 512, F16, F16, P)
    assert TC._tall(plan)
    assert max(r.out_rows for r in plan.rows) >= max(k.size for k in plan.kernels)


@sim
def test_overruled_tiling_matches_numpy_on_the_simulator():
    m, k, n = 128, 512, 512
    assert not plan_matmul(m, k, n, F16, F16, P)[0].choice.agrees
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    prog = build_matmul(m, k, n, F16, F16, P, b=b)
    assert len(prog.tile_choices) == 1 and not prog.tile_choices[0].agrees
    got, _ = run_matmul(prog, a)
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    T.check(got, ref, T.matmul_bound(a, b, fp16_out=True), "overruled tiling")


def test_decisions_are_counted_and_listed():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((512, 512)) / 30).astype(np.float32)
    x = rng.standard_normal((128, 512)).astype(np.float32)
    comp = rockjit.compile(lambda w, x: jnp.tanh(x @ w), resident_argnums=0).compiled(w, x)
    dev = SimDevice(cores=3)
    try:
        img = LoadedGraph(lower_graph(comp.graph, comp.params), dev).builder.image
    finally:
        dev.close()
    assert img.stats["tile_plans"] == len(img.tilings) == 1
    assert img.stats["tile_rule_overruled"] == 1 and "overruled" in img.tilings[0].why
    assert ProgramImage.from_json(img.to_json(), img.arrays).tilings == img.tilings
