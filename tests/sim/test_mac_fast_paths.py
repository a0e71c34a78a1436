"""The CNA/CORE fast paths against numpy: the register-transposed weight unpacking on ragged
shapes (a short last channel group, channel counts off the 8-lane grid, a partial last kernel
panel), the packed-feature cache across DATA_REUSE tasks whose taps differ, the two-thread MAC
split on a product large enough to use it, and the per-phase profile counters.

Data are small integers (every fp16 product and partial sum exact), so the accumulator and
the fp16 output must equal a float64 numpy convolution exactly."""
from __future__ import annotations

import numpy as np
import pytest

from harness import CONFORMANCE, Simulator
from programs import ConvGeometry, conv_ref, pack_feature, pack_weights_direct, retarget, set_fields
from rockjit._rjc import ffi, lib
from test_conv_variants import FEATURE, OUTPUT, WEIGHT, check, run_program, template

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")


def _case(g: ConvGeometry, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(g.C, g.H, g.W)).astype(np.float16)
    w = rng.integers(-2, 3, size=(g.N, g.C, g.KH, g.KW)).astype(np.float16)
    oh, ow = g.out_hw
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow))
    return x, w, ref


def _phases(sim: Simulator) -> dict[str, int]:
    p = ffi.new("rj_sim_phase_ns *")
    lib.rj_sim_get_phase_ns(sim._sim, p)
    return {k: getattr(p, k) for k in ("conv_tasks", "feature", "weights", "columns", "mac", "dpu")}


RAGGED = [
    # C = 40: the second 32-channel weight group holds 8 channels; N = 24: the second panel 8 kernels
    pytest.param(ConvGeometry(C=40, H=6, W=5, N=24, KH=3, KW=3, pad=(1, 1)), id="C40-N24-3x3"),
    # C = 36: a 4-channel tail off the 8-lane grid; N = 20: a 4-kernel last panel
    pytest.param(ConvGeometry(C=36, H=5, W=7, N=20, KH=1, KW=2), id="C36-N20-1x2"),
    # C = 12 < 32: one short channel group; N = 40: two full panels and a half one
    pytest.param(ConvGeometry(C=12, H=4, W=9, N=40, KH=2, KW=3, pad=(1, 1)), id="C12-N40-2x3"),
]


@pytest.mark.parametrize("g", RAGGED)
def test_weight_unpacking_on_ragged_shapes(g: ConvGeometry) -> None:
    # lenient mode: these shapes break the hardware's K/N alignment rule, but the unpacking of
    # whatever the registers describe must still be exact
    x, w, ref = _case(g, seed=g.C * 1000 + g.N)
    words = retarget(template("04_conv3x3_s2_fp16"), g, FEATURE, WEIGHT, OUTPUT)
    sim, out = run_program(words, g, pack_feature(x, np.float16), pack_weights_direct(w, np.float16),
                           Simulator(strict=False))
    check(sim, out, g, ref, np.float16)


def test_data_reuse_with_other_taps_repacks_the_feature() -> None:
    """DATA_REUSE keeps the feature tile; a reusing task with other taps (3x3 padded after a
    1x1) must not see the 1x1 task's packed operand, and a third 1x1 task must not see the 3x3
    one's. The feature memory is zeroed after the first task: a re-read would show."""
    g1 = ConvGeometry(C=64, H=6, W=6, N=32)
    g3 = ConvGeometry(C=64, H=6, W=6, N=16, KH=3, KW=3, pad=(1, 1))
    x, w1, ref1 = _case(g1, seed=1)
    _, w3, _ = _case(g3, seed=3)
    ref3 = conv_ref(x.astype(np.float64), w3.astype(np.float64), g3.stride, g3.pad, g3.dil, g3.out_hw)
    w1b = np.random.default_rng(5).integers(-2, 3, size=w1.shape).astype(np.float16)
    ref1b = conv_ref(x.astype(np.float64), w1b.astype(np.float64), out_hw=g1.out_hw)
    zeros = bytes(len(pack_feature(x, np.float16)))

    sim = Simulator()
    words1 = retarget(template("04_conv3x3_s2_fp16"), g1, FEATURE, WEIGHT, OUTPUT)
    sim, out = run_program(words1, g1, pack_feature(x, np.float16), pack_weights_direct(w1, np.float16), sim)
    check(sim, out, g1, ref1, np.float16)
    fetched = _phases(sim)["feature"]

    words3 = set_fields(retarget(template("04_conv3x3_s2_fp16"), g3, FEATURE, WEIGHT, OUTPUT), "CNA_CBUF_CON0",
                        DATA_REUSE=1)
    sim, out = run_program(words3, g3, zeros, pack_weights_direct(w3, np.float16), sim)
    check(sim, out, g3, ref3, np.float16)

    words1b = set_fields(words1, "CNA_CBUF_CON0", DATA_REUSE=1)
    sim, out = run_program(words1b, g1, zeros, pack_weights_direct(w1b, np.float16), sim)
    check(sim, out, g1, ref1b, np.float16)

    ph = _phases(sim)
    assert ph["conv_tasks"] == 3
    assert ph["feature"] == fetched, "a DATA_REUSE task fetched the feature cube again"
    assert ph["mac"] > 0 and ph["weights"] > 0 and ph["dpu"] > 0


def test_large_product_on_two_threads_is_exact() -> None:
    """M x N x K = 190 x 176 x 256 is above the size where the MAC work is shared with the helper
    thread; N = 176 leaves an unpaired 16-column panel and M = 190 a 10-row last row panel."""
    g = ConvGeometry(C=256, H=19, W=10, N=176)
    x, w, ref = _case(g, seed=11)
    words = retarget(template("01_matmul_fp16"), g, FEATURE, WEIGHT, OUTPUT)
    sim, out = run_program(words, g, pack_feature(x, np.float16), pack_weights_direct(w, np.float16),
                           Simulator(strict=False))
    check(sim, out, g, ref, np.float16)
