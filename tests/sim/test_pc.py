"""The PC model: word decode, trailer, enable bitmap, self-chained kicks, job/kick/task counts."""
from __future__ import annotations

import numpy as np
import pytest

from harness import CONFORMANCE, RJ_EINVAL, RJ_EUNSUPP, SimError, open_case, run_case
from programs import chain_to, set_enable_mask
from rockjit._rjc import lib
from rockjit.lowering.registers import emit, word

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")

CASE01 = "01_matmul_fp16"


def task0(fn):
    return lambda j, t, w: fn(w) if (j, t) == (0, 0) else w


def run_err(fn, name: str = CASE01) -> SimError:
    with pytest.raises(SimError) as ei:
        run_case(name, mutate=task0(fn))
    return ei.value


def test_fp16_conversions_match_portable_reference() -> None:
    assert lib.rj_sim_f16_selftest() == 0


def test_op_target_must_match_register_block() -> None:
    def mut(w):
        w = w.copy()
        # word 2 writes CNA_CONV_CON1 (0x100c) but claim the CORE block (0x08)
        w[2] = word(0x0801, 0x120, 0x100C)
        return w

    e = run_err(mut)
    assert e.code == RJ_EINVAL
    assert "word 2 (0x0801000001201" in e.message and "names block CORE" in e.message \
        and "belongs to block CNA" in e.message, e.message


def test_unknown_op_is_refused_with_its_index() -> None:
    e = run_err(lambda w: np.concatenate([w[:5], np.array([word(0x0203, 1, 0x100C)], "<u8"), w[5:]]))
    assert e.code == RJ_EINVAL and "word 5" in e.message and "unknown op 0x0203" in e.message


def test_task_without_trailer_is_refused() -> None:
    e = run_err(lambda w: w[:-1])
    assert e.code == RJ_EINVAL and "without the PC_OPERATION_ENABLE trailer" in e.message


def test_words_after_op_enable_are_refused_but_filler_is_fine() -> None:
    run = run_case(CASE01, mutate=task0(lambda w: np.concatenate([w, np.zeros(3, "<u8")])))
    assert run.case.check(run.output())[0]
    e = run_err(lambda w: np.concatenate([w, np.array([emit("CNA_FC_CON0")], "<u8")]))
    assert e.code == RJ_EINVAL and "follows the PC_OPERATION_ENABLE word" in e.message


def test_undocumented_enable_bit_is_refused() -> None:
    e = run_err(lambda w: set_enable_mask(w, 0x1F))
    assert e.code == RJ_EUNSUPP and "bit(s) 0x2" in e.message


def test_cna_without_dpu_is_refused() -> None:
    e = run_err(lambda w: set_enable_mask(w, 0x15))
    assert e.code == RJ_EUNSUPP and "without the DPU" in e.message


def test_pc_task_con_write_is_refused() -> None:
    e = run_err(lambda w: np.concatenate([w[:2], np.array([emit("PC_TASK_CON", TASK_NUMBER=2)], "<u8"), w[2:]]))
    assert e.code == RJ_EUNSUPP and "PC_TASK_CON" in e.message


def test_enable_bit0_is_neither_needed_nor_sufficient() -> None:
    # seed 003 section 3: the conv fires on 0x1C as well (bit0 = PC is not what starts it)
    run = run_case(CASE01, mutate=task0(lambda w: set_enable_mask(w, 0x1C)))
    assert run.case.check(run.output())[0]


# ---- self-chaining -----------------------------------------------------------------------

def kacc_chain(n_link: int | None = None, bad_link: bool = False):
    """Case 02's 3 jobs x 2 tasks laid contiguously and self-chained into one job / one kick:
    each K-step reads the partial an earlier task of the same kick wrote (notes:
    regcmd-task-model.md "Chained tasks honor an in-kick data dependency")."""
    case = open_case("02_matmul_fp16_kacc")
    tasks = [words for job in case.jobs() for _iova, words in job]
    base = case.jobs()[0][0][0]
    stride = 8 * ((len(tasks[0]) + 1) & ~1)
    addrs = [base + i * stride for i in range(len(tasks))]
    out = []
    for i, w in enumerate(tasks):
        if i + 1 < len(tasks) and (n_link is None or i != n_link):
            target = addrs[i + 1] + (0x100 if bad_link and i == 0 else 0)
            w = chain_to(w, target, len(tasks[i + 1]))
        out.append((addrs[i], w))
    return [out]


def test_self_chained_kick_runs_all_tasks_with_in_kick_dependency() -> None:
    run = run_case("02_matmul_fp16_kacc", jobs=kacc_chain())
    ok, msg = run.case.check(run.output())
    assert ok, msg
    s = run.sim.stats()
    assert (s["jobs"], s["tasks"], s["kicks"]) == (1, 6, 1)


def test_chain_without_redirect_stops_and_is_an_error() -> None:
    with pytest.raises(SimError) as ei:
        run_case("02_matmul_fp16_kacc", jobs=kacc_chain(n_link=2))
    e = ei.value
    assert e.code == RJ_EINVAL
    assert e.message.startswith("job 0 task 2:") and "no PC_BASE_ADDRESS redirect" in e.message


def test_chain_link_must_agree_with_task_list() -> None:
    with pytest.raises(SimError) as ei:
        run_case("02_matmul_fp16_kacc", jobs=kacc_chain(bad_link=True))
    assert ei.value.code == RJ_EINVAL and "must agree" in ei.value.message


def test_dangling_link_on_last_task_is_harmless() -> None:
    jobs = kacc_chain()
    last_iova, last = jobs[0][-1]
    jobs[0][-1] = (last_iova, chain_to(last, last_iova + 0x2000, 126))
    run = run_case("02_matmul_fp16_kacc", jobs=jobs)
    assert run.case.check(run.output())[0]
    assert run.sim.stats()["kicks"] == 1


def test_unchained_multi_task_job_is_one_kick_per_task() -> None:
    run = run_case("02_matmul_fp16_kacc")
    assert run.sim.stats()["kicks"] == 6


def test_redirect_in_a_gapped_job_after_task0_is_ignored() -> None:
    # TASK_NUMBER = 1 per kick on the stock kernel: a later task's link does not chain
    jobs = kacc_chain()
    first_iova, first = jobs[0][0]
    ops = first.copy()
    ops[-4] = 0  # unlink task 0 -> the job is gapped
    ops[-3] = emit("PC_REGISTER_AMOUNTS")
    jobs[0][0] = (first_iova, ops)
    run = run_case("02_matmul_fp16_kacc", jobs=jobs)
    assert run.case.check(run.output())[0]
    assert run.sim.stats()["kicks"] == 6
