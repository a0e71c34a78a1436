"""The runtime: devices, programs and their step lists, over the C core (cffi).

    dev = SimDevice()                      # or RocketDevice(fake=True), NullDevice()
    b = ProgramBuilder(dev)
    arena = b.add_bo(1 << 20, role="arena")
    ...                                    # regcmd words, relocations, jobs, host steps
    prog = b.build()
    prog.run()                             # the whole step list in one C call
"""
from __future__ import annotations

from . import host_steps
from .device import Bo, BufferInfo, Device, NullDevice, RocketDevice, SimDevice
from .errors import (AddressError, DeviceError, DeviceMemoryError, DeviceTimeoutError, HazardError,
                     ProgramError, RuntimeCError, SimUnsupportedError)
from .host_steps import HOST_STEPS, Operand
from .host_threads import host_threads, set_host_threads
from .program import Program, ProgramBuilder, PlacedTask
from ._ffi import ffi as ffi, lib as lib  # the cffi module, for tests and tools


def env_flags() -> dict[str, str]:
    """Every environment flag the C runtime reads, with its description (csrc/runtime/envflags.c)."""
    from ..debugflags import c_flags

    return {name: f.description for name, f in c_flags().items()}


__all__ = ["Bo", "BufferInfo", "Device", "SimDevice", "RocketDevice", "NullDevice", "Program",
           "ProgramBuilder", "PlacedTask", "Operand", "HOST_STEPS", "host_steps", "env_flags",
           "RuntimeCError", "ProgramError", "DeviceMemoryError", "AddressError", "HazardError",
           "SimUnsupportedError", "DeviceError", "DeviceTimeoutError", "host_threads",
           "set_host_threads"]
