"""Strict mode refuses the documented hardware quirks; each test mutates a conformance program
just enough to trip one quirk, and checks the unmodified program still runs."""
from __future__ import annotations

import numpy as np
import pytest

from harness import CONFORMANCE, RJ_EFAULT, RJ_EHAZARD, RJ_EINVAL, SimError, Simulator, open_case, run_case
from programs import (ConvGeometry, chain_to, drop_block, get, get_raw, indices, retarget, set_enable_mask,
                      set_fields, set_raw)
from rockjit.lowering.registers import emit

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")

CASE01, CASE03 = "01_matmul_fp16", "03_matmul_int8"


def only_task0(fn):
    return lambda j, t, w: fn(w) if (j, t) == (0, 0) else w


def expect_hazard(name: str, mutate, *needles: str, strict_code: int = RJ_EHAZARD) -> SimError:
    with pytest.raises(SimError) as ei:
        run_case(name, mutate=only_task0(mutate))
    assert ei.value.code == strict_code, ei.value
    for n in needles:
        assert n in ei.value.message, ei.value.message
    assert ei.value.message.startswith("job 0 task 0: "), ei.value.message
    return ei.value


@pytest.mark.parametrize("name", [CASE01, CASE03, "04_conv3x3_s2_fp16", "09_dwconv3x3_s2_fp16"])
def test_unmodified_programs_pass_strict(name: str) -> None:
    run = run_case(name)
    ok, msg = run.case.check(run.output())
    assert ok, msg


# ---- feature height < 4 ------------------------------------------------------------------

def test_feature_height_below_4_is_refused() -> None:
    g = ConvGeometry(C=64, H=2, W=1, N=32)
    case = open_case(CASE01)
    iova = {b["name"]: b["iova"] for b in case.meta["buffers"]}

    def mut(w):
        return retarget(w, g, iova["input"], iova["weight"], iova["output"])

    err = expect_hazard(CASE01, mut, "CNA_DATA_SIZE0", "feature height < 4", "DATAIN_HEIGHT=2")
    assert "Pad the rows" in err.message
    # without strict mode the same program is computed (a refusal, not a crash)
    run = run_case(CASE01, strict=False, mutate=only_task0(mut))
    assert run.sim.last_acc().shape == (2, 1, 32)


# ---- S_POINTER ----------------------------------------------------------------------------

@pytest.mark.parametrize("reg", ["CNA_S_POINTER", "CORE_S_POINTER"])
def test_userspace_s_pointer_write_is_refused(reg: str) -> None:
    word = emit(reg, POINTER_PP_EN=1, EXECUTER_PP_EN=1, POINTER_PP_MODE=1)
    expect_hazard(CASE01, lambda w: np.concatenate([w[:2], np.array([word], dtype="<u8"), w[2:]]),
                  reg, "userspace S_POINTER write")


# ---- MRDMA trap ---------------------------------------------------------------------------

def test_mrdma_trap_no_dpu_rdma_block() -> None:
    expect_hazard(CASE01, lambda w: drop_block(w, 0x2000), "MRDMA trap", "writes no DPU_RDMA")


def test_mrdma_trap_enable_mask_without_dpu_rdma() -> None:
    expect_hazard(CASE01, lambda w: set_enable_mask(w, 0x0D), "MRDMA trap", "DPU_RDMA enable bit")


def test_mrdma_trap_mrdma_left_enabled() -> None:
    expect_hazard(CASE01, lambda w: set_raw(w, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", 0),
                  "DPU_RDMA_RDMA_FEATURE_MODE_CFG", "MRDMA trap")


# ---- integer tasks self-chained ------------------------------------------------------------

def chained_pair_jobs(name: str):
    (iova, words), = open_case(name).jobs()[0]
    second = iova + 8 * len(words)  # contiguous layout, stride = the (even) word count
    first = chain_to(words, second, len(words))
    return [[(iova, first), (second, words.copy())]]


def test_int8_tasks_chained_in_one_kick_are_refused() -> None:
    with pytest.raises(SimError) as ei:
        run_case(CASE03, jobs=chained_pair_jobs(CASE03))
    e = ei.value
    assert e.code == RJ_EHAZARD
    assert e.message.startswith("job 0 task 1: CNA_CONV_CON1: integer tasks self-chained in one kick"), e.message


def test_int8_tasks_gapped_are_fine_and_fp16_chained_is_one_kick() -> None:
    (iova, words), = open_case(CASE03).jobs()[0]
    second = iova + 8 * len(words)
    run = run_case(CASE03, jobs=[[(iova, words), (second, words.copy())]])  # gapped: 2 kicks
    assert run.case.check(run.output())[0]
    assert (run.sim.stats()["tasks"], run.sim.stats()["kicks"]) == (2, 2)

    run = run_case(CASE01, jobs=chained_pair_jobs(CASE01))
    assert run.case.check(run.output())[0]
    assert (run.sim.stats()["tasks"], run.sim.stats()["kicks"]) == (2, 1)


# ---- CBUF ---------------------------------------------------------------------------------

def test_cbuf_banks_over_12_are_refused() -> None:
    expect_hazard(CASE01, lambda w: set_fields(w, "CNA_CBUF_CON0", DATA_BANK=6, WEIGHT_BANK=7),
                  "CNA_CBUF_CON0", "CBUF over-subscription", "exceed the 12 banks")


def test_int8_feature_without_slack_bank_is_refused() -> None:
    expect_hazard(CASE03, lambda w: set_fields(w, "CNA_CBUF_CON0", DATA_BANK=1, WEIGHT_BANK=11),
                  "CNA_CBUF_CON0", "int8 feature bank slack", "DATA_BANK >= 2")


def test_feature_larger_than_its_banks_is_refused() -> None:
    # M=512 rows x K=64 fp16 = 64 KB = 2 banks, declared as 1
    g = ConvGeometry(C=64, H=512, W=1, N=32)
    case = open_case(CASE01)
    iova = {b["name"]: b["iova"] for b in case.meta["buffers"]}

    def mut(w):
        w = retarget(w, g, iova["input"], iova["weight"], iova["output"])
        return set_fields(w, "CNA_CBUF_CON0", DATA_BANK=1, WEIGHT_BANK=11)

    expect_hazard(CASE01, mut, "CBUF over-subscription", "needs 2 bank(s)")


def test_weights_larger_than_their_banks_are_refused() -> None:
    expect_hazard(CASE01, lambda w: set_fields(w, "CNA_CBUF_CON0", DATA_BANK=1, WEIGHT_BANK=0),
                  "CBUF over-subscription", "weights need 1 bank(s)")


# ---- alignment ----------------------------------------------------------------------------

def test_unaligned_k_is_refused() -> None:
    expect_hazard(CASE01, lambda w: _shrink_k(w, 48), "CNA_DATA_SIZE1", "unaligned K", "DATAIN_CHANNEL=48")


def _shrink_k(w, k):
    w = set_fields(w, "CNA_DATA_SIZE1", DATAIN_CHANNEL=k, DATAIN_CHANNEL_REAL=k - 1)
    w = set_raw(w, "CNA_WEIGHT_SIZE1", k * 2)
    return set_raw(w, "CNA_WEIGHT_SIZE0", k * 2 * 32)


@pytest.mark.parametrize("name,kernels,group", [(CASE01, 24, 16), (CASE03, 48, 32)])
def test_unaligned_n_is_refused(name: str, kernels: int, group: int) -> None:
    def mut(w):
        per = get_raw(w, "CNA_WEIGHT_SIZE1")
        w = set_fields(w, "CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=kernels)
        w = set_raw(w, "CNA_WEIGHT_SIZE0", per * kernels)
        return set_fields(w, "CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=kernels - 1)

    expect_hazard(name, mut, "CNA_WEIGHT_SIZE2", "unaligned N", f"multiple of {group}")


def test_mesa_partial_kernel_group_is_the_watchdog_hazard() -> None:
    """Mesa packs OC that ends inside a kernel group as WEIGHT_KERNELS = OC with the CORE over the
    whole group (the notes' teflon-add-capture: OC 8, DATAOUT_CHANNEL 31); such a direct program does
    not complete on RK3588 (out-cvt-converter.md "Direct int8-output program", OC 16 and 48)."""
    def mut(w):
        per = get_raw(w, "CNA_WEIGHT_SIZE1")
        w = set_fields(w, "CNA_WEIGHT_SIZE2", WEIGHT_KERNELS=48)
        return set_raw(w, "CNA_WEIGHT_SIZE0", per * 48)          # the CORE still covers 64 channels

    expect_hazard(CASE03, mut, "CNA_WEIGHT_SIZE2", "partial kernel group", "does not complete")
    with pytest.raises(SimError) as ei:
        run_case(CASE03, mutate=only_task0(mut), strict=False)
    assert ei.value.code == RJ_EINVAL


# ---- addresses ----------------------------------------------------------------------------

def test_address_outside_every_bo() -> None:
    def mut(w):
        return set_raw(w, "CNA_FEATURE_DATA_ADDR", 0x0F000000)

    expect_hazard(CASE01, mut, "CNA_FEATURE_DATA_ADDR", "address outside every BO", "0x0f000000")
    with pytest.raises(SimError) as ei:
        run_case(CASE01, strict=False, mutate=only_task0(mut))
    assert ei.value.code == RJ_EFAULT


def test_weight_range_running_past_its_bo() -> None:
    # the weight buffer is 4096 B and holds exactly 4096 B of weights: start 16 B late
    case = open_case(CASE01)
    wbase = next(b["iova"] for b in case.meta["buffers"] if b["name"] == "weight")
    expect_hazard(CASE01, lambda w: set_raw(w, "CNA_DCOMP_ADDR0", wbase + 16), "CNA_DCOMP_ADDR0",
                  "address outside every BO")


# ---- stale register state (delta task) -----------------------------------------------------

def delta_job():
    (iova, words), = open_case(CASE01).jobs()[0]
    second = iova + 8 * 128
    # a delta task: only the DPU/RDMA pointers, the three addresses and the trailer (seed 003 s4)
    keep = ("DPU_S_POINTER", "DPU_RDMA_RDMA_S_POINTER", "CNA_FEATURE_DATA_ADDR", "CNA_DCOMP_ADDR0",
            "DPU_DST_BASE_ADDR")
    idx = sorted(i for r in keep for i in indices(words, r))
    delta = np.concatenate([words[idx], words[-4:]]).astype("<u8")
    return [[(iova, words)], [(second, delta)]]


def test_delta_task_relying_on_stale_registers_is_refused() -> None:
    with pytest.raises(SimError) as ei:
        run_case(CASE01, jobs=delta_job())
    e = ei.value
    assert e.code == RJ_EHAZARD
    assert e.message.startswith("job 1 task 0: "), e.message
    assert "stale register state (delta task)" in e.message


def test_delta_task_runs_on_persisted_state_without_strict() -> None:
    run = run_case(CASE01, strict=False, jobs=delta_job())
    ok, msg = run.case.check(run.output())
    assert ok, msg


# ---- trailer ------------------------------------------------------------------------------

def test_missing_op40_is_refused() -> None:
    expect_hazard(CASE01, lambda w: np.concatenate([w[:-2], w[-1:]]).astype("<u8"), "OP_40 missing")


# ---- CBUF reuse ---------------------------------------------------------------------------

def test_data_reuse_with_nothing_loaded_is_an_error() -> None:
    with pytest.raises(SimError) as ei:
        run_case(CASE01, mutate=only_task0(lambda w: set_fields(w, "CNA_CBUF_CON0", DATA_REUSE=1)))
    assert ei.value.code == RJ_EINVAL
    assert "DATA_REUSE is set but no feature tile is resident" in ei.value.message


def test_weight_reuse_with_nothing_loaded_is_an_error() -> None:
    with pytest.raises(SimError) as ei:
        run_case(CASE01, mutate=only_task0(lambda w: set_fields(w, "CNA_CBUF_CON0", WEIGHT_REUSE=1)))
    assert ei.value.code == RJ_EINVAL
    assert "WEIGHT_REUSE is set but no weights are resident" in ei.value.message


def test_data_reuse_of_another_address_is_refused() -> None:
    case = open_case("02_matmul_fp16_kacc")
    jobs = case.jobs()
    # job 0 task 1 re-uses job 0 task 0's feature (DATA_REUSE=1); point it somewhere else
    assert get(jobs[0][1][1], "CNA_CBUF_CON0")["DATA_REUSE"] == 1
    other = get_raw(jobs[0][1][1], "CNA_FEATURE_DATA_ADDR") + 0x800
    jobs[0][1] = (jobs[0][1][0], set_raw(jobs[0][1][1], "CNA_FEATURE_DATA_ADDR", other))
    with pytest.raises(SimError) as ei:
        run_case("02_matmul_fp16_kacc", jobs=jobs)
    assert ei.value.code == RJ_EHAZARD
    assert ei.value.message.startswith("job 0 task 1: CNA_FEATURE_DATA_ADDR: DATA_REUSE of a different tile")


def test_data_reuse_keeps_the_cbuf_contents() -> None:
    """With DATA_REUSE the CNA must not re-read memory: overwrite the feature between the two
    tasks of case 02 job 0 and the second task must still use the resident tile."""
    sim = Simulator()
    case = open_case("02_matmul_fp16_kacc")
    mem = case.initial_memory()
    (i0, w0), (i1, w1) = case.jobs()[0]
    case.write(mem, i0, w0.tobytes())
    case.write(mem, i1, w1.tobytes())
    sim.run_job(mem, [(i0, len(w0))])
    acc0 = sim.last_acc().copy()
    base, data = mem["input_tiles"]
    data[:2048] = bytes(2048)  # zero the resident tile's memory
    sim.run_job(mem, [(i1, len(w1))])
    acc1 = sim.last_acc()
    # task 1 multiplies the same A by the next N-tile of B: a zeroed A would give all zeros
    assert np.abs(acc1).sum() > 0 and np.abs(acc0).sum() > 0
    sim2 = Simulator()
    w1_noreuse = set_fields(w1, "CNA_CBUF_CON0", DATA_REUSE=0)
    case.write(mem, i1, w1_noreuse.tobytes())
    sim2.run_job(mem, [(i1, len(w1))])
    assert np.abs(sim2.last_acc()).sum() == 0
    del base


def test_reuse_across_a_changed_shape_is_an_error() -> None:
    (iova, words), = open_case(CASE01).jobs()[0]
    second = iova + 8 * 128
    g = ConvGeometry(C=64, H=4, W=1, N=32)
    case = open_case(CASE01)
    ad = {b["name"]: b["iova"] for b in case.meta["buffers"]}
    w2 = set_fields(retarget(words, g, ad["input"], ad["weight"], ad["output"]), "CNA_CBUF_CON0", DATA_REUSE=1)
    with pytest.raises(SimError) as ei:
        run_case(CASE01, jobs=[[(iova, words), (second, w2)]])
    assert ei.value.code == RJ_EINVAL
    assert "resident feature tile is 1x8x64" in ei.value.message


def test_hazard_message_names_job_and_task() -> None:
    err = expect_hazard(CASE01, lambda w: set_fields(w, "CNA_CBUF_CON0", DATA_BANK=6, WEIGHT_BANK=7))
    assert err.message.split(":")[0] == "job 0 task 0"
