"""TaskBuilder assembly: trailer and enable mask against every conformance program; relocation
patching; self-chained kicks laid out as the notes describe."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.lowering.emitters.matmul import emit_matmul, plan_matmul_tile
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import (TRAILER_WORDS, LoweringError, Reloc, TaskBuilder, enable_mask, link,
                                     pc_data_amount)

from lowering_testutil import CONF, meta, task_words

P = get_profile("rk3588")


def _foreign_tasks():
    for d in sorted(CONF.glob("0*_*")):
        m = meta(d.name[:2])
        for j, job in enumerate(m["jobs"]):
            for t, task in enumerate(job["tasks"]):
                yield d.name[:2], j, t, int(task["enable_mask"], 16)


FOREIGN = list(_foreign_tasks())


def _blocks(words: np.ndarray) -> set[str]:
    out = set()
    for w in words.tolist():
        op, _, offset = R.decode(w)
        if op & 0xFF == R.OP_WRITE:
            reg = R.lookup(op & 0xFF00, offset)
            if reg is not None:
                out.add(reg.block)
    return out


@pytest.mark.parametrize("prefix,job,task,enable", FOREIGN,
                         ids=[f"{p}-j{j}t{t}" for p, j, t, _ in FOREIGN])
def test_enable_mask_and_trailer_match_foreign(prefix, job, task, enable) -> None:
    words = task_words(prefix, job, task)
    blocks = _blocks(words[:-TRAILER_WORDS])
    assert enable_mask(P, blocks) == enable
    # a task that writes one register of each block the foreign one drives gets its trailer
    first = {}
    for w in words[:-TRAILER_WORDS].tolist():
        op, _, offset = R.decode(w)
        reg = R.lookup(op & 0xFF00, offset)
        if reg is not None and reg.block != "PC":
            first.setdefault(reg.block, reg.full_name)
    t = TaskBuilder("probe", P)
    for name in first.values():
        t.write_raw(name, 0)
    prog = t.finish()
    assert prog.words[-TRAILER_WORDS:] == tuple(words[-TRAILER_WORDS:].tolist())


def test_enable_refuses_half_a_conv() -> None:
    with pytest.raises(LoweringError, match="CORE"):
        enable_mask(P, {"CNA", "DPU"})
    with pytest.raises(LoweringError, match="at least one block"):
        TaskBuilder("empty", P).finish()


def test_task_refuses_kernel_owned_registers() -> None:
    t = TaskBuilder("bad", P)
    with pytest.raises(LoweringError, match="per-core bit"):
        t.write("CNA_S_POINTER", POINTER_PP_EN=1)
    with pytest.raises(LoweringError, match="PC register"):
        t.write_raw("PC_BASE_ADDRESS", 0x1000)
    t.write("DPU_S_POINTER", POINTER_PP_EN=1)   # the DPU ones are the program's to arm


def _fp16_task(name: str, off: int = 0):
    tile = plan_matmul_tile(8, 64, 32, DType.F16, DType.F16, P)
    return emit_matmul(tile, P, Reloc("a"), Reloc("b"), Reloc("c", off), name=name)


def test_pc_data_amount() -> None:
    # the kernel programs (count + 1) / 2 - 1 for a first task (rocket_job.c); for the
    # 126-word conv task Mesa's chained formula ALIGN((count - 4) / 2, 2) gives the same
    assert pc_data_amount(126) == 62 == -(-((126 - 4) // 2) // 2) * 2
    assert pc_data_amount(30) == 14 and pc_data_amount(1070) == 534
    with pytest.raises(LoweringError):
        pc_data_amount(3)


def test_link_lays_out_and_redirects() -> None:
    t = TaskBuilder("odd", P)
    for name in ("DPU_S_POINTER", "DPU_RDMA_RDMA_S_POINTER", "DPU_DATA_FORMAT",
                 "DPU_BS_CFG", "DPU_BN_CFG"):
        t.write_raw(name, 0)
    odd = t.finish()
    assert len(odd) % 2 == 1
    tasks = [_fp16_task("t0", 0), odd, _fp16_task("t2", 0x200)]
    base = 0x40
    kick = link(tasks, P, "regcmd", base_offset=base)
    # segments start at the even-rounded word counts (regcmd-task-model.md)
    assert kick.task_offsets == (0, 126, 126 + len(odd) + 1)
    assert kick.task_number == 3 and kick.first_count == 126
    assert len(kick.words) == 126 + len(odd) + 1 + 126
    addrs = {"regcmd": 0x01000000, "a": 0x02000000, "b": 0x03000000, "c": 0x04000000}
    words = kick.array(addrs)
    for i, t in enumerate(tasks):
        off, n = kick.task_offsets[i], len(t)
        seg = words[off:off + n]
        # the body is the task's own body, relocations placed
        assert np.array_equal(seg[:-TRAILER_WORDS], t.array(addrs)[:-TRAILER_WORDS])
        op40, enable = R.decode(int(seg[-2])), R.decode(int(seg[-1]))
        assert op40 == (0x0041, 0, 0) and enable == (0x0081, t.enable, 0x0008)
        f_op, f_val, f_off = R.decode(int(seg[-4]))
        a_op, a_val, a_off = R.decode(int(seg[-3]))
        assert (a_op, a_off) == (0x0101, 0x0014)
        if i + 1 < len(tasks):
            # filler -> PC_BASE_ADDRESS of the next segment; amounts = next segment's length
            assert (f_op, f_off) == (0x0101, 0x0010)
            assert f_val == addrs["regcmd"] + base + 8 * kick.task_offsets[i + 1]
            assert a_val == (len(tasks[i + 1]) + 1) // 2 - 1
        else:
            assert (f_op, f_val, f_off) == (0, 0, 0) and a_val == 0   # the chain seal
    # the padding word between the odd task and the next is filler
    assert words[126 + len(odd)] == 0


def test_link_refuses_misalignment() -> None:
    with pytest.raises(LoweringError, match="16-byte aligned"):
        link([_fp16_task("a"), _fp16_task("b")], P, "regcmd", base_offset=8)
    kick = link([_fp16_task("a"), _fp16_task("b")], P, "regcmd")
    with pytest.raises(LoweringError, match="PC_BASE_ADDRESS needs a 16-byte aligned"):
        kick.array({"regcmd": 0x1008, "a": 0, "b": 0, "c": 0})
    with pytest.raises(LoweringError, match="at least one task"):
        link([], P, "regcmd")


def test_address_outside_32_bits_is_refused() -> None:
    prog = _fp16_task("t")
    with pytest.raises(LoweringError, match="32-bit address space"):
        prog.array({"a": 1 << 32, "b": 0, "c": 0})
