"""Devices behind one interface: SimDevice, RocketDevice (kernel or ioctl fake), NullDevice.

A device has ``cores`` execution contexts. On the rocket driver a context is one open fd:
one scheduling entity (so one core at a time) with its own 32-bit IOVA window, so a BO lives
in one context and a job may only touch BOs of its own context (notes:
perf/iova-and-multicore.md). Every device enforces this, so a program that mixes contexts
fails the same way on the simulator as on silicon."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ._ffi import call, ffi, lib
from .errors import ProgramError


def _stats_dict(cdata, fields: tuple[str, ...]) -> dict[str, int]:
    return {name: int(getattr(cdata, name)) for name in fields}


DEVICE_STATS_FIELDS = ("jobs", "tasks", "kicks", "submits", "waits", "syncs", "regcmd_bytes",
                       "in_bytes", "out_bytes", "bos_live", "bo_bytes_live", "bos_created")


@dataclass(frozen=True)
class BufferInfo:
    """Where a BO lives: device address, size, context and device handle."""

    iova: int
    size: int
    ctx: int
    handle: int


class Bo:
    """A buffer object created directly on a device (programs manage their own)."""

    def __init__(self, device: "Device", ptr) -> None:
        self._device = device
        self._dev_ptr = device._handle()  # the C device outlives its BOs (rj_device_destroy)
        self._ptr = ptr

    @property
    def info(self) -> BufferInfo:
        self._alive()
        return BufferInfo(int(self._ptr.iova), int(self._ptr.size), int(self._ptr.ctx),
                          int(self._ptr.handle))

    @property
    def iova(self) -> int:
        return self.info.iova

    @property
    def size(self) -> int:
        return self.info.size

    def memory(self) -> memoryview:
        """The BO's CPU mapping (valid until close)."""
        self._alive()
        return memoryview(ffi.buffer(self._ptr.host, int(self._ptr.size)))

    def close(self) -> None:
        if self._ptr is not None:
            lib.rj_bo_destroy(self._dev_ptr, self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _alive(self) -> None:
        if self._ptr is None:
            raise ProgramError("this BO was closed; create a new one")


class Device:
    """Common part of every device: the C handle, stats, BOs, lifetime."""

    kind = "device"

    def __init__(self, ptr) -> None:
        self._ptr = ptr
        self._programs: weakref.WeakSet = weakref.WeakSet()

    def _handle(self):
        if self._ptr is None:
            raise ProgramError(f"this {self.kind} device was closed; create a new one")
        return self._ptr

    @property
    def cores(self) -> int:
        """Execution contexts (rocket: open fds)."""
        return int(lib.rj_device_nctx(self._handle()))

    def stats(self) -> dict[str, int]:
        out = ffi.new("rj_device_stats *")
        lib.rj_device_get_stats(self._handle(), out)
        return _stats_dict(out, DEVICE_STATS_FIELDS)

    def create_bo(self, size: int, core: int = 0) -> Bo:
        out = ffi.new("rj_bo **")
        call(lib.rj_bo_create, self._handle(), core, size, out)
        return Bo(self, out[0])

    def close(self) -> None:
        """Free the device; programs built on it are closed first (they own BOs on it)."""
        if self._ptr is None:
            return
        for prog in list(self._programs):
            prog.close()
        lib.rj_device_destroy(self._ptr)
        self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the C side is gone with the process
            pass


class SimDevice(Device):
    """The C functional simulator: BOs in host memory, jobs run synchronously."""

    kind = "sim"

    def __init__(self, cores: int = 1, strict: bool = True) -> None:
        out = ffi.new("rj_device **")
        call(lib.rj_sim_device_create, out, cores, lib.RJ_SIM_STRICT if strict else 0)
        super().__init__(out[0])


class NullDevice(Device):
    """Counts jobs, tasks, kicks and bytes; computes nothing (host-cost benchmarks)."""

    kind = "null"

    def __init__(self, cores: int = 1) -> None:
        out = ffi.new("rj_device **")
        call(lib.rj_null_device_create, out, cores)
        super().__init__(out[0])


class RocketDevice(Device):
    """The NPU through /dev/accel/accel0 and the rocket uAPI, one fd per core.

    ``fake=True`` routes every open/ioctl/mmap through the in-process fake of the kernel
    (csrc/rocket/fake_rocket.c), which checks each struct as the kernel does and runs jobs on
    the simulator; RJ_FAKE_ROCKET=1 in the environment does the same for ``fake=False``."""

    kind = "rocket"

    def __init__(self, fake: bool = False, cores: int = 1, path: str | None = None) -> None:
        out = ffi.new("rj_device **")
        flags = lib.RJ_ROCKET_USE_FAKE if fake else 0
        cpath = path.encode() if path else ffi.NULL
        call(lib.rj_rocket_device_create, out, cpath, cores, flags)
        super().__init__(out[0])
        self.fake = fake

    def fd(self, core: int = 0) -> int:
        return int(lib.rj_rocket_device_fd(self._handle(), core))
