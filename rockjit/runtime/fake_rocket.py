"""Control of the in-process rocket ioctl fake (csrc/rocket/fake_rocket.c): fault injection,
counters, the raw system-call table (for tests that speak the uAPI directly)."""
from __future__ import annotations

from ._ffi import call, ffi, lib

FAULTS = ("prep_eintr", "hang_jobs", "fail_create_at", "fail_mmap_at", "fail_submit",
          "job_delay_us", "submit_errno", "prep_timeout", "short_bo_at", "drop_jobs",
          "device_gone")
"""Each is a field of rj_fake_rocket_faults (csrc/rocket/rj_rocket.h, where each is described)."""
STATS = ("open_fds", "live_bos", "live_bytes", "ioctls", "ioctl_errors", "bos_created", "submits",
         "jobs_run", "jobs_dropped", "preps", "finis", "eintr_returned", "timeouts", "last_errno",
         "max_running")


def reset() -> None:
    """Forget counters and faults (every RocketDevice on the fake must be closed)."""
    call(lib.rj_fake_rocket_reset)


def set_faults(**faults: int) -> None:
    """E.g. set_faults(prep_eintr=1): the next PREP_BO returns EINTR. Unnamed faults clear."""
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown fake rocket faults {sorted(unknown)}; known: {FAULTS}")
    f = ffi.new("rj_fake_rocket_faults *")
    for name, value in faults.items():
        setattr(f, name, value)
    lib.rj_fake_rocket_set_faults(f)


def stats() -> dict:
    s = ffi.new("rj_fake_rocket_stats *")
    lib.rj_fake_rocket_get_stats(s)
    out = {name: int(getattr(s, name)) for name in STATS}
    out["prep_deadlines"] = [int(s.prep_deadlines[i]) for i in range(s.n_prep_deadlines)]
    out["last_error"] = ffi.string(s.last_error).decode()
    return out


def sys_ops():
    """The fake's open/close/ioctl/mmap/munmap table (cffi function pointers)."""
    return lib.rj_sys_fake_rocket()


def ioctl_request(name: str) -> int:
    """The request number of CREATE_BO, SUBMIT, PREP_BO, FINI_BO or GEM_CLOSE."""
    return int(lib.rj_rocket_ioctl_request(getattr(lib, f"RJ_ROCKET_IOCTL_{name}")))
