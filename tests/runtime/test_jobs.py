"""Conformance programs through every device: the simulator, the real RocketDevice path over
the ioctl fake, and the null device (which must count but not compute)."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.runtime import NullDevice, ProgramBuilder, RocketDevice, SimDevice

from .conftest import add_case, check_output

CASES = ["01_matmul_fp16", "03_matmul_int8"]


def run_case(dev, name):
    b = ProgramBuilder(dev)
    lc = add_case(b, name)
    for j in lc.jobs:
        b.add_npu_step([j])
    prog = b.build()
    prog.run()
    return prog, lc


@pytest.mark.parametrize("name", CASES)
def test_sim_device(name):
    with SimDevice() as dev:
        prog, lc = run_case(dev, name)
        check_output(prog, lc)
        st = prog.stats()
        assert (st["jobs"], st["tasks"], st["kicks"], st["npu_steps"]) == (1, 1, 1, 1)
        # The relocations mattered: our IOVAs are not the stand-in driver's.
        assert lc.relocated_words == 3
        assert prog.bo_info(lc.out_bo).iova != lc.original_iova["output"]


def test_sim_device_multi_job_case():
    """Case 02: three jobs of two tasks, K-accumulation through ping-pong BOs."""
    with SimDevice() as dev:
        prog, lc = run_case(dev, "02_matmul_fp16_kacc")
        check_output(prog, lc)
        assert prog.stats()["jobs"] == 3 and prog.stats()["tasks"] == 6


@pytest.mark.parametrize("name", CASES)
def test_rocket_fake(name, fake):
    with RocketDevice(fake=True) as dev:
        prog, lc = run_case(dev, name)
        check_output(prog, lc)
        s = fake.stats()
        assert s["jobs_run"] == 1 and s["jobs_dropped"] == 0, s
        assert s["preps"] >= 1 and s["finis"] >= 4  # fence on the out-BO; hand-over of every BO
        # The fake's per-fd IOVA space starts at 0, so every address was really relocated.
        assert prog.bo_info(lc.out_bo).iova < 0x01000000
        prog.close()


def test_rocket_env_flag_selects_fake(fake, monkeypatch):
    monkeypatch.setenv("RJ_FAKE_ROCKET", "1")
    with RocketDevice(fake=False) as dev:
        prog, lc = run_case(dev, "01_matmul_fp16")
        check_output(prog, lc)
        prog.close()
    assert fake.stats()["jobs_run"] == 1


@pytest.mark.parametrize("name", CASES)
def test_null_device_counts_only(name):
    with NullDevice() as dev:
        b = ProgramBuilder(dev)
        lc = add_case(b, name)
        b.add_npu_step(lc.jobs)
        prog = b.build()
        before = prog.read(lc.out_bo, len(lc.expected), lc.out_offset)
        prog.run()
        prog.run()
        after = prog.read(lc.out_bo, len(lc.expected), lc.out_offset)
        assert after == before and after != lc.expected  # nothing computed
        st, ds = prog.stats(), dev.stats()
        assert (st["runs"], st["jobs"], st["tasks"], st["kicks"]) == (2, 2, 2, 2)
        assert ds["jobs"] == 2 and ds["regcmd_bytes"] == 2 * 126 * 8
        out_size = prog.bo_info(lc.out_bo).size
        assert ds["out_bytes"] == 2 * out_size


def test_three_fds_three_jobs(fake):
    """One NPU step, three jobs on three contexts (fds); each context its own BOs and IOVAs."""
    with RocketDevice(fake=True, cores=3) as dev:
        b = ProgramBuilder(dev)
        cases = [add_case(b, n, core=c) for c, n in enumerate(["01_matmul_fp16", "03_matmul_int8",
                                                                "01_matmul_fp16"])]
        b.add_npu_step([lc.jobs[0] for lc in cases])
        assert fake.stats()["open_fds"] == 3
        assert len({dev.fd(c) for c in range(3)}) == 3
        prog = b.build()
        prog.run()
        for lc in cases:
            check_output(prog, lc)
        iovas = [prog.bo_info(lc.out_bo).iova for lc in cases]
        assert iovas[0] == iovas[2]  # same layout in two independent IOVA spaces
        assert fake.stats()["submits"] == 3 and dev.stats()["submits"] == 1
        prog.close()


def test_job_must_use_bos_of_its_core():
    with SimDevice(cores=2) as dev:
        b = ProgramBuilder(dev)
        lc = add_case(b, "01_matmul_fp16", core=0)
        other = b.add_bo(4096, "io", core=1)
        rc = b.add_bo(4096, "regcmd", core=0)
        b.write_words(rc, np.array([0x0201_0000_0000_1070], dtype="<u8"))
        from rockjit.runtime import ProgramError
        with pytest.raises(ProgramError, match="IOVA space"):
            b.add_reloc(rc, 0, other, 0)
        b.add_job([(rc, 0, 1)], writes=[other], core=0)
        with pytest.raises(ProgramError, match="context 1"):
            b.build()
        del lc


def test_self_chained_job_is_one_kick_and_must_be_contiguous():
    from rockjit.runtime import ProgramError
    with NullDevice() as dev:
        b = ProgramBuilder(dev)
        rc = b.add_bo(4096, "regcmd")
        out = b.add_bo(4096, "io")
        # 126-word tasks laid back to back (stride = even word count; notes:
        # encodings/regcmd-task-model.md "Contiguous chaining")
        j = b.add_job([(rc, 0, 126), (rc, 126 * 8, 126), (rc, 2 * 126 * 8, 126)], writes=[out],
                      chained=True)
        g = b.add_job([(rc, 0, 126), (rc, 1024, 126)], writes=[out])
        b.add_npu_step([j])
        b.add_npu_step([g])
        prog = b.build()
        prog.run()
        st = prog.stats()
        assert (st["jobs"], st["tasks"], st["kicks"]) == (2, 5, 1 + 2)
        assert dev.stats()["kicks"] == 3
        prog.close()

        b = ProgramBuilder(dev)
        rc = b.add_bo(4096, "regcmd")
        out = b.add_bo(4096, "io")
        b.add_job([(rc, 0, 125), (rc, 1024, 126)], writes=[out], chained=True)
        with pytest.raises(ProgramError, match="contiguous: expected BO 0 byte 1008"):
            b.build()


def test_job_must_list_every_bo_its_words_address():
    from rockjit.lowering.registers import emit_raw
    from rockjit.runtime import ProgramError
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        rc = b.add_bo(4096, "regcmd")
        src, out = b.add_bo(4096, "io"), b.add_bo(4096, "io")
        b.write_words(rc, [emit_raw("CNA_FEATURE_DATA_ADDR", 0), emit_raw("DPU_DST_BASE_ADDR", 0)])
        b.add_reloc(rc, 0, src)
        b.add_reloc(rc, 1, out)
        b.add_job([(rc, 0, 2)], writes=[out])
        with pytest.raises(ProgramError, match="word 0 addresses BO 1, which the job lists neither"):
            b.build()


def test_dump_regcmd_writes_relocated_words(tmp_path, monkeypatch):
    monkeypatch.setenv("RJ_DUMP_REGCMD", str(tmp_path))
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        lc = add_case(b, "01_matmul_fp16")
        b.add_npu_step(lc.jobs)
        prog = b.build()
        dumped = np.fromfile(tmp_path / "job0000_task0000.regcmd", dtype="<u8")
        assert len(dumped) == 126
        # the output address word now holds our output BO's IOVA
        values = (dumped >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
        assert prog.bo_info(lc.out_bo).iova in values.tolist()
        prog.close()
