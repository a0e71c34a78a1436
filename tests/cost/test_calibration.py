"""The cost model against the published figures: the fitted ones are met, every held-out one
lands within 1.5x, and the CNN descriptions carry the published MAC totals.

Fitted (each sets one constant): "1-task submit, keep-attached" -> submit_us, "1-task submit,
stock" -> job_us, "64-task job, stock" -> kick_us, "ResNet-18-224 int8, one kick" -> dma_gbps, "MobileNetV2-224 int8, one kick" -> fill_us.
Held out (set nothing): the keep-attached 64-task job, the single-fd fp16 matmul's NPU wait,
MobileNetV1 and Inception V1 as one kick, and the resident fp16/int8/int4 3-core matmuls
(tests/cost/test_tile_ordering.py holds out the published tile-shape A/B as well).
"""
from __future__ import annotations

import pytest

from rockjit.cost import calibrated
from rockjit.cost.calibrate import modelled_ms
from rockjit.cost.networks import NETWORKS
from rockjit.cost.published import FIGURES

FITTED = {"1-task submit, keep-attached": "submit_us", "1-task submit, stock": "job_us",
          "64-task job, stock": "kick_us", "ResNet-18-224 int8, one kick": "dma_gbps",
          "MobileNetV2-224 int8, one kick": "fill_us"}
HELD_OUT = [f for f in FIGURES if not f.fits]
# the int4 description is uncertain (which K-tile cap the published run used is not stated)
# and the model misses it: it lands at ~0.54x. Kept visible as a strict xfail.
KNOWN_MISS = {"int4 matmul 512x3840x4096 resident, 3 cores"}


def test_fitted_set_is_the_documented_one():
    assert {f.name: f.fits for f in FIGURES if f.fits} == FITTED
    assert len(HELD_OUT) >= 6


@pytest.mark.parametrize("fig", [f for f in FIGURES if f.fits], ids=lambda f: f"fit:{f.name}")
def test_fitted_figure_is_met(fig):
    assert modelled_ms(fig, calibrated()) == pytest.approx(fig.ms, rel=1e-6)


@pytest.mark.parametrize("fig", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason="int4 description uncertain"))
    if f.name in KNOWN_MISS else f for f in HELD_OUT], ids=lambda f: f"held_out:{f.name}")
def test_held_out_figure_within_1_5x(fig):
    m = modelled_ms(fig, calibrated())
    assert fig.ms / 1.5 <= m <= fig.ms * 1.5, (
        f"{fig.name}: modelled {m:.4g} ms vs published {fig.ms:.4g} ms ({fig.source})")


def test_constants_are_physical():
    c = calibrated()
    for name in ("submit_us", "job_us", "kick_us", "dma_gbps", "fill_us"):
        assert getattr(c, name) > 0, name
    # the notes' figure: the IOMMU attach + detach is ~15-20 us per job
    assert 15 <= c.job_us <= 21


# published totals: MobileNetV1 569 M mult-adds (Howard et al. 2017), MobileNetV2 300 M
# (Sandler et al. 2018), ResNet-18 1.8 G (He et al. 2015), GoogLeNet 1.5 G (Szegedy et al. 2014);
# compute-layer counts from the seeds README ("Whole networks" table)
@pytest.mark.parametrize("name,macs,layers", [
    ("MobileNetV1-224", 569e6, 29), ("MobileNetV2-224", 300e6, 64),
    ("ResNet-18-224", 1.8e9, 31), ("Inception V1-224", 1.5e9, None)])
def test_network_descriptions_match_published_totals(name, macs, layers):
    ls = NETWORKS[name]()
    assert sum(l.macs for l in ls) == pytest.approx(macs, rel=0.06)
    if layers is not None:
        assert len(ls) == layers
    else:
        # the README counts 81 compute layers (with its concatenation nodes); the
        # description has the 57 convolutions, 13 pools, the average pool and the classifier
        assert sum(l.kind == "conv" for l in ls) == 57 and sum(l.kind == "pool" for l in ls) == 14


def test_an_impossible_figure_stops_the_fit_and_names_it():
    import dataclasses

    from rockjit.cost.calibrate import _solve

    resnet = next(f for f in FIGURES if f.fits == "dma_gbps")
    # faster than its MACs at the datapath's peak rate: no DMA bandwidth can explain it
    with pytest.raises(ValueError, match="ResNet-18-224 int8, one kick"):
        _solve(dataclasses.replace(resnet, ms=1.0), calibrated())


def test_error_band_brackets_the_held_out_misses():
    """The band the benchmarks print beside a modelled time: published over modelled on the
    held-out figures, by the precision their MACs run at (dispatch probes run none and count
    for every precision)."""
    from rockjit.cost.calibrate import error_band, held_out_ratios

    c = calibrated()
    ratios = held_out_ratios(c)
    assert set(ratios) == {f.name for f in HELD_OUT}
    for f in HELD_OUT:
        assert ratios[f.name] == pytest.approx(f.ms / modelled_ms(f, c))
    # by name: the fp16 matmuls and the dispatch probe are what an fp16 program is judged by
    fp16 = [r for n, r in ratios.items() if "fp16" in n or "task job" in n]
    assert len(fp16) == 3
    assert error_band("fp16") == (pytest.approx(min(fp16)), pytest.approx(max(fp16)))
    assert error_band() == (pytest.approx(min(ratios.values())),
                            pytest.approx(max(ratios.values())))
    int8 = [r for n, r in ratios.items() if "int8" in n or "task job" in n]
    assert error_band("int8") == (pytest.approx(min(int8)), pytest.approx(max(int8)))
    with pytest.raises(ValueError, match="no held-out figure runs MACs at precision 'bf16'"):
        error_band("bf16")
