"""The same job tests on every computing device: the simulator (SimDevice) and the real
RocketDevice code path over the ioctl fake (struct layouts, ioctl numbers, CREATE_BO + mmap,
SUBMIT, PREP_BO, FINI_BO). Every conformance program runs through the runtime (our BOs, our
IOVAs, relocations) and must leave its expected output. The null device must count, not compute."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rockjit.runtime import HazardError, NullDevice, ProgramBuilder, RocketDevice, SimDevice

from .conftest import add_case, add_case_chained, check_output

ALL_CASES = ["01_matmul_fp16", "02_matmul_fp16_kacc", "03_matmul_int8", "04_conv3x3_s2_fp16",
             "05_lut_sigmoid_fp16", "06_ew_mul_fp16", "07_maxpool3x3_s2_fp16", "08_avgpool3x3_fp16",
             "09_dwconv3x3_s2_fp16"]
CASES = ["01_matmul_fp16", "03_matmul_int8"]


@pytest.fixture(params=["sim", "rocket_fake"])
def make_device(request, fake):
    """A factory of the device under test; the fake fixture checks that nothing leaks."""
    def make(cores: int = 1):
        return SimDevice(cores=cores) if request.param == "sim" else RocketDevice(fake=True, cores=cores)
    make.kind = request.param
    return make


def run_case(dev, name):
    b = ProgramBuilder(dev)
    lc = add_case(b, name)
    for j in lc.jobs:
        b.add_npu_step([j])
    prog = b.build()
    prog.run()
    return prog, lc


@pytest.mark.parametrize("name", ALL_CASES)
def test_conformance_case_through_the_runtime(make_device, name):
    with make_device() as dev:
        b = ProgramBuilder(dev)
        b.add_bo(3 * 4096, "io")  # shifts every later IOVA away from the stand-in driver's
        lc = add_case(b, name)
        for j in lc.jobs:
            b.add_npu_step([j])
        prog = b.build()
        prog.run()
        check_output(prog, lc)
        st = prog.stats()
        assert st["jobs"] == len(lc.jobs) and st["npu_steps"] == len(lc.jobs)
        assert st["kicks"] == st["tasks"]  # unchained: one kick per task (rocket_job.c)
        # The relocations mattered: no buffer sits where the foreign program's words point.
        assert lc.relocated_words >= 2
        for buf, idx in lc.bos.items():
            assert prog.bo_info(idx).iova != lc.original_iova[buf], buf
        prog.close()


def test_relocated_words_of_a_single_task_case(make_device):
    with make_device() as dev:
        prog, lc = run_case(dev, "01_matmul_fp16")
        assert lc.relocated_words == 3  # CNA_FEATURE_DATA_ADDR, CNA_DCOMP_ADDR0, DPU_DST_BASE_ADDR
        assert (prog.stats()["jobs"], prog.stats()["tasks"], prog.stats()["kicks"]) == (1, 1, 1)
        prog.close()


def test_self_chained_kacc_is_one_kick_with_in_kick_dependency(make_device):
    """Case 02's six tasks (three K-steps x two N-tiles) chained into one job: each K-step's EW
    add reads the partial an earlier task of the SAME kick wrote (notes:
    encodings/regcmd-task-model.md "Chained tasks honor an in-kick data dependency")."""
    with make_device() as dev:
        b = ProgramBuilder(dev)
        lc = add_case_chained(b, "02_matmul_fp16_kacc")
        b.add_npu_step(lc.jobs)
        prog = b.build()
        prog.run()
        check_output(prog, lc)
        st, ds = prog.stats(), dev.stats()
        assert (st["jobs"], st["tasks"], st["kicks"]) == (1, 6, 1)
        assert (ds["jobs"], ds["tasks"], ds["kicks"]) == (1, 6, 1)
        prog.close()


def test_chained_flag_must_match_the_words():
    """A job flagged self-chained whose trailers do not link would run as six kicks while the
    runtime counts one: the simulator, which sees the words, refuses it. (Simulator only: the
    rocket uAPI carries no chained flag to compare the words with.)"""
    from rockjit.runtime import ProgramError
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        lc = add_case_chained(b, "02_matmul_fp16_kacc", link=False)
        b.add_npu_step(lc.jobs)
        prog = b.build()
        with pytest.raises(ProgramError, match="flagged self-chained"):
            prog.run()
        prog.close()


def test_three_cores_three_jobs_in_one_step(make_device, fake):
    """One NPU step, three jobs on three contexts (fds); each context has its own BOs and IOVA
    window, so the same layout lands at the same addresses in each."""
    with make_device(cores=3) as dev:
        b = ProgramBuilder(dev)
        cases = [add_case(b, n, core=c) for c, n in enumerate(["01_matmul_fp16", "03_matmul_int8",
                                                                "01_matmul_fp16"])]
        b.add_npu_step([lc.jobs[0] for lc in cases])
        prog = b.build()
        prog.run()
        for lc in cases:
            check_output(prog, lc)
        iovas = [prog.bo_info(lc.out_bo).iova for lc in cases]
        assert iovas[0] == iovas[2]
        assert [prog.bo_info(lc.out_bo).ctx for lc in cases] == [0, 1, 2]
        assert dev.stats()["submits"] == 1 and dev.stats()["jobs"] == 3
        if make_device.kind == "rocket_fake":
            assert fake.stats()["submits"] == 3  # one SUBMIT ioctl per fd
            assert len({dev.fd(c) for c in range(3)}) == 3
        prog.close()


def test_three_fds_run_three_jobs_in_parallel(fake):
    """Each fd is its own scheduling entity (notes: perf/iova-and-multicore.md): with every job
    taking 200 ms of NPU time, three jobs on one fd serialize (~600 ms, one at a time), while
    three jobs on three fds finish in ~200 ms with all three running at one moment."""
    def step_time(cores: int) -> float:
        with RocketDevice(fake=True, cores=cores) as dev:
            b = ProgramBuilder(dev)
            cases = [add_case(b, "01_matmul_fp16", core=c % cores) for c in range(3)]
            b.add_npu_step([lc.jobs[0] for lc in cases])
            prog = b.build()
            fake.set_faults(job_delay_us=200_000)
            t0 = time.monotonic()
            prog.run()
            took = time.monotonic() - t0
            fake.set_faults()
            for lc in cases:
                check_output(prog, lc)
            prog.close()
            return took

    took1 = step_time(1)
    assert fake.stats()["max_running"] == 1  # (a running maximum since the fixture's reset)
    took3 = step_time(3)
    assert fake.stats()["max_running"] == 3
    assert took1 >= 0.6, took1
    assert 0.2 <= took3 < 0.5, took3  # serial would be >= 0.6; margin for a loaded CI machine


def test_device_refusal_reaches_the_caller_with_task_and_register(make_device, fake):
    """A strict-mode hazard in a job surfaces as HazardError naming the step, job, task and
    register, through the simulator and through the fake kernel alike."""
    from rockjit.lowering.registers import emit
    s_pointer = np.array([emit("CNA_S_POINTER", POINTER_PP_EN=1)], dtype="<u8")

    def insert_s_pointer(job, task, words):  # seed page 003 section 4: the kernel owns it
        return np.concatenate([words[:2], s_pointer, words[2:]])

    with make_device() as dev:
        b = ProgramBuilder(dev)
        lc = add_case(b, "01_matmul_fp16", mutate=insert_s_pointer)
        b.add_npu_step(lc.jobs)
        prog = b.build()
        with pytest.raises(HazardError) as ei:
            prog.run()
        msg = str(ei.value)
        assert msg.startswith("step 0 (NPU, job 0): job ") and \
            "task 0: CNA_S_POINTER: userspace S_POINTER write" in msg, msg
        prog.close()
    if make_device.kind == "rocket_fake":
        assert fake.stats()["jobs_run"] == 1  # the kernel ran (and "hung" on) the job


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


def test_job_must_use_bos_of_its_core():
    from rockjit.runtime import ProgramError
    with SimDevice(cores=2) as dev:
        b = ProgramBuilder(dev)
        add_case(b, "01_matmul_fp16", core=0)
        other = b.add_bo(4096, "io", core=1)
        rc = b.add_bo(4096, "regcmd", core=0)
        b.write_words(rc, np.array([0x0201_0000_0000_1070], dtype="<u8"))
        with pytest.raises(ProgramError, match="IOVA space"):
            b.add_reloc(rc, 0, other, 0)
        b.add_job([(rc, 0, 1)], writes=[other], core=0)
        with pytest.raises(ProgramError, match="context 1"):
            b.build()


def test_self_chained_job_counts_one_kick_and_must_be_contiguous():
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
