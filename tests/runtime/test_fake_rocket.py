"""The rocket ioctl fake checks what the kernel checks; PREP_BO deadline semantics; error
unwinding leaves no BO behind. Struct layouts and ioctl numbers come from the uAPI
(torvalds/linux include/uapi/drm/rocket_accel.h, drm.h)."""
from __future__ import annotations

import errno
import os
import time

import pytest

from rockjit.runtime import (DeviceError, DeviceMemoryError, DeviceTimeoutError, HazardError,
                             ProgramBuilder, RocketDevice)
from rockjit.runtime._ffi import ffi, lib

from .conftest import add_case, case_dir, check_output

PROT_RW = 0x1 | 0x2    # PROT_READ | PROT_WRITE (Linux)
MAP_SHARED, MAP_PRIVATE = 0x01, 0x02


def _ioc(direction: int, nr: int, size: int) -> int:
    """asm-generic/ioctl.h: dir << 30 | size << 16 | type << 8 | nr, type 'd' for DRM."""
    return (direction << 30) | (size << 16) | (ord("d") << 8) | nr


WRITE, READWRITE = 1, 3
# drm.h: driver ioctls start at DRM_COMMAND_BASE 0x40; rocket_accel.h: 0x00..0x03.
UAPI = {"CREATE_BO": _ioc(READWRITE, 0x40, 24), "SUBMIT": _ioc(WRITE, 0x41, 24),
        "PREP_BO": _ioc(WRITE, 0x42, 16), "FINI_BO": _ioc(WRITE, 0x43, 8),
        "GEM_CLOSE": _ioc(WRITE, 0x09, 8)}


class Raw:
    """Speak the uAPI to the fake directly, as a userspace driver would."""

    def __init__(self, fake) -> None:
        self.ops = fake.sys_ops()
        self.fd = self.ops.open(b"/dev/accel/accel0", os.O_RDWR)
        assert self.fd >= 0

    def ioctl(self, name: str, arg) -> int:
        rc = self.ops.ioctl(self.fd, UAPI[name], arg)
        return 0 if rc == 0 else ffi.errno

    def create(self, size: int):
        cb = ffi.new("rj_drm_rocket_create_bo *", {"size": size})
        assert self.ioctl("CREATE_BO", cb) == 0
        return cb

    def close(self) -> None:
        assert self.ops.close(self.fd) == 0


def test_ioctl_numbers_and_struct_sizes(fake):
    for name, req in UAPI.items():
        assert fake.ioctl_request(name) == req, name
    sizes = {"rj_drm_rocket_create_bo": 24, "rj_drm_rocket_submit": 24, "rj_drm_rocket_job": 40,
             "rj_drm_rocket_task": 8, "rj_drm_rocket_prep_bo": 16, "rj_drm_rocket_fini_bo": 8,
             "rj_drm_gem_close": 8}
    for name, size in sizes.items():
        assert ffi.sizeof(name) == size, name
    assert ffi.offsetof("rj_drm_rocket_prep_bo", "timeout_ns") == 8


def test_every_validation_fires(fake):
    k = Raw(fake)
    assert k.ioctl("CREATE_BO", ffi.new("rj_drm_rocket_create_bo *", {"size": 0})) == errno.EINVAL
    a, b = k.create(4096), k.create(100)
    assert (a.handle, a.dma_address, b.dma_address) == (1, 0, 4096)
    # a struct-size drift in the request number is refused, as is a foreign fd
    assert k.ops.ioctl(k.fd, UAPI["CREATE_BO"] + (1 << 16), a) == -1 and ffi.errno == errno.EINVAL
    assert k.ops.ioctl(k.fd + 999, UAPI["CREATE_BO"], a) == -1 and ffi.errno == errno.EBADF

    prep = ffi.new("rj_drm_rocket_prep_bo *", {"handle": a.handle, "reserved": 1})
    assert k.ioctl("PREP_BO", prep) == errno.EINVAL
    prep.reserved, prep.handle = 0, 77
    assert k.ioctl("PREP_BO", prep) == errno.ENOENT
    fini = ffi.new("rj_drm_rocket_fini_bo *", {"handle": a.handle, "reserved": 3})
    assert k.ioctl("FINI_BO", fini) == errno.EINVAL
    fini.reserved, fini.handle = 0, 99
    assert k.ioctl("FINI_BO", fini) == errno.ENOENT
    assert k.ioctl("GEM_CLOSE", ffi.new("rj_drm_gem_close *", {"handle": 55})) == errno.EINVAL

    task = ffi.new("rj_drm_rocket_task *", {"regcmd": 0, "regcmd_count": 4})
    ins, outs, bad = (ffi.new("uint32_t[1]", [h]) for h in (a.handle, b.handle, 42))
    job = ffi.new("rj_drm_rocket_job *", {
        "tasks": int(ffi.cast("uintptr_t", task)), "in_bo_handles": int(ffi.cast("uintptr_t", ins)),
        "out_bo_handles": int(ffi.cast("uintptr_t", outs)), "task_count": 1, "task_struct_size": 8,
        "in_bo_handle_count": 1, "out_bo_handle_count": 1})
    sub = ffi.new("rj_drm_rocket_submit *", {"jobs": int(ffi.cast("uintptr_t", job)), "job_count": 1,
                                              "job_struct_size": 40, "reserved": 1})
    assert k.ioctl("SUBMIT", sub) == errno.EINVAL
    sub.reserved, sub.job_struct_size = 0, 32
    assert k.ioctl("SUBMIT", sub) == errno.EINVAL
    sub.job_struct_size = 40

    # Per-job failures: the kernel drops the job and SUBMIT still returns 0.
    def dropped(mutate, restore, want_errno, text):
        before = fake.stats()["jobs_dropped"]
        mutate()
        assert k.ioctl("SUBMIT", sub) == 0
        s = fake.stats()
        restore()
        assert s["jobs_dropped"] == before + 1 and text in s["last_error"], s
        if want_errno is not None:
            assert s["last_errno"] == want_errno

    dropped(lambda: setattr(job, "in_bo_handles", int(ffi.cast("uintptr_t", bad))),
            lambda: setattr(job, "in_bo_handles", int(ffi.cast("uintptr_t", ins))),
            errno.ENOENT, "handle 42")
    dropped(lambda: setattr(job, "task_count", 0), lambda: setattr(job, "task_count", 1),
            errno.EINVAL, "task_count")
    dropped(lambda: setattr(job, "task_struct_size", 4), lambda: setattr(job, "task_struct_size", 8),
            errno.EINVAL, "task_struct_size")
    dropped(lambda: setattr(task, "regcmd_count", 0), lambda: setattr(task, "regcmd_count", 4),
            errno.EINVAL, "regcmd_count")
    dropped(lambda: setattr(job, "out_bo_handles", int(ffi.cast("uintptr_t", ins))),
            lambda: setattr(job, "out_bo_handles", int(ffi.cast("uintptr_t", outs))),
            None, "both the in- and out-list")

    # mmap: offset, sharing and length are checked; a closed-but-mapped BO lives on
    assert k.ops.mmap(ffi.NULL, 4096, PROT_RW, MAP_SHARED, k.fd, 12345) == ffi.cast("void *", -1)
    assert k.ops.mmap(ffi.NULL, 4096, PROT_RW, MAP_PRIVATE, k.fd, a.offset) == ffi.cast("void *", -1)
    assert k.ops.mmap(ffi.NULL, 8192, PROT_RW, MAP_SHARED, k.fd, a.offset) == ffi.cast("void *", -1)
    m = k.ops.mmap(ffi.NULL, 4096, PROT_RW, MAP_SHARED, k.fd, a.offset)
    assert m != ffi.cast("void *", -1)
    assert k.ioctl("GEM_CLOSE", ffi.new("rj_drm_gem_close *", {"handle": a.handle})) == 0
    assert fake.stats()["live_bos"] == 2
    assert k.ops.munmap(m, 4096) == 0
    k.close()


@pytest.fixture
def case01_program(fake):
    case_dir("01_matmul_fp16")  # skip before opening the fake, so a skip leaks no fd
    dev = RocketDevice(fake=True)
    b = ProgramBuilder(dev)
    lc = add_case(b, "01_matmul_fp16")
    b.add_npu_step(lc.jobs)
    prog = b.build()
    yield prog, lc
    prog.close()
    dev.close()


def test_prep_bo_eintr_is_retried_to_the_same_deadline(case01_program, fake):
    prog, lc = case01_program
    fake.set_faults(prep_eintr=1)
    prog.run()
    s = fake.stats()
    assert s["eintr_returned"] == 1
    d = s["prep_deadlines"]
    assert len(d) >= 2 and d[-1] == d[-2]  # same absolute deadline on the retry
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert now < d[-1] < now + 11 * 10**9  # absolute CLOCK_MONOTONIC, ~10 s ahead
    check_output(prog, lc)


def test_prep_bo_timeout_is_a_clear_error(case01_program, fake):
    prog, _ = case01_program
    fake.set_faults(hang_jobs=1)
    prog.set_timeout(0.05)
    t0 = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match="did not finish before the deadline") as exc:
        prog.run()
    waited = time.monotonic() - t0
    assert 0.045 <= waited < 1.0
    assert "step 0" in str(exc.value) and "500 ms" in str(exc.value)
    assert isinstance(exc.value, DeviceError)


def test_failing_submit_leaks_no_bo(fake):
    case_dir("01_matmul_fp16")
    dev = RocketDevice(fake=True)
    b = ProgramBuilder(dev)
    add_case(b, "01_matmul_fp16")
    b.add_npu_step([0])
    prog = b.build()
    fake.set_faults(fail_submit=1)
    with pytest.raises(DeviceError, match="SUBMIT"):
        prog.run()
    assert dev.stats()["bos_live"] == 5 and fake.stats()["live_bos"] == 5
    prog.close()
    assert dev.stats()["bos_live"] == 0 and fake.stats()["live_bos"] == 0
    dev.close()


@pytest.mark.parametrize("fault,at", [("fail_create_at", 3), ("fail_mmap_at", 2)])
def test_failing_bo_creation_unwinds(fault, at, fake):
    case_dir("01_matmul_fp16")
    dev = RocketDevice(fake=True)
    b = ProgramBuilder(dev)
    fake.set_faults(**{fault: at})
    with pytest.raises(DeviceMemoryError):
        add_case(b, "01_matmul_fp16")
    # the BO whose mmap failed had its handle closed again
    assert fake.stats()["live_bos"] == at - 1 == dev.stats()["bos_live"]
    del b
    dev.close()  # closes the builder's program, then the device


def test_missing_node_is_explained():
    with pytest.raises(DeviceError, match="modprobe rocket"):
        RocketDevice(fake=False, path="/dev/accel/accel_does_not_exist")


def test_bo_in_both_lists_is_a_hazard(fake):
    with RocketDevice(fake=True) as dev:
        b = ProgramBuilder(dev)
        lc = add_case(b, "01_matmul_fp16")
        h = b._h.get()
        err = ffi.new("rj_err *")
        job = lc.jobs[0]
        assert lib.rj_program_job_add_bo(h, job, lc.out_bo, lib.RJ_JOB_IN, err) == 0
        b.add_npu_step([job])
        with pytest.raises(HazardError, match="both in and out"):
            b.build()


def test_prep_bo_blocks_until_the_job_completes(fake):
    """SUBMIT queues the job on the fd's core and returns; PREP_BO on its out-BO is the fence:
    a past deadline polls (EBUSY while the job runs), a near deadline expires (ETIMEDOUT), a
    far one returns once the job is done. Deadlines are absolute CLOCK_MONOTONIC."""
    k = Raw(fake)
    regcmd, out = k.create(4096), k.create(4096)
    task = ffi.new("rj_drm_rocket_task *", {"regcmd": regcmd.dma_address, "regcmd_count": 2})
    outs = ffi.new("uint32_t[1]", [out.handle])
    job = ffi.new("rj_drm_rocket_job *", {
        "tasks": int(ffi.cast("uintptr_t", task)), "out_bo_handles": int(ffi.cast("uintptr_t", outs)),
        "task_count": 1, "task_struct_size": 8, "out_bo_handle_count": 1})
    sub = ffi.new("rj_drm_rocket_submit *", {"jobs": int(ffi.cast("uintptr_t", job)), "job_count": 1,
                                              "job_struct_size": 40})
    fake.set_faults(job_delay_us=400_000)
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert k.ioctl("SUBMIT", sub) == 0
    assert time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t0 < 200_000_000  # SUBMIT did not wait
    prep = ffi.new("rj_drm_rocket_prep_bo *", {"handle": out.handle, "timeout_ns": 0})
    assert k.ioctl("PREP_BO", prep) == errno.EBUSY
    prep.timeout_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 50_000_000
    assert k.ioctl("PREP_BO", prep) == errno.ETIMEDOUT
    assert time.clock_gettime_ns(time.CLOCK_MONOTONIC) >= prep.timeout_ns
    prep.timeout_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 5_000_000_000
    assert k.ioctl("PREP_BO", prep) == 0
    done = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert 400_000_000 <= done - t0 < 3_000_000_000
    assert fake.stats()["jobs_run"] == 1
    fake.set_faults()
    # the job's two zero words have no OP_ENABLE trailer: the core reports it after the fence
    err = ffi.new("rj_err *")
    assert k.ops.job_error(k.fd, err) != 0 and b"PC_OPERATION_ENABLE" in ffi.string(err.msg)
    for h in (regcmd.handle, out.handle):
        assert k.ioctl("GEM_CLOSE", ffi.new("rj_drm_gem_close *", {"handle": h})) == 0
    k.close()
