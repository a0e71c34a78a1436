"""Errors the C runtime reports, as Python exceptions carrying the C message.

Each RJ_E* code of csrc/rj_err.h maps to one class; all derive from RuntimeCError, itself a
rockjit.errors.RockjitError, so callers can catch the family or one kind."""
from __future__ import annotations

from ..errors import RockjitError, UnsupportedError


class RuntimeCError(RockjitError):
    """A C runtime call failed; ``code`` is the RJ_E* value, ``message`` the C message."""

    code: int = 0

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ProgramError(RuntimeCError):
    """RJ_EINVAL: a malformed program or argument (bad index, offset, alignment, context)."""

    code = -1


class DeviceMemoryError(RuntimeCError):
    """RJ_ENOMEM: no memory or IOVA space left for a BO."""

    code = -2


class AddressError(RuntimeCError):
    """RJ_EFAULT: an address outside every buffer."""

    code = -3


class HazardError(RuntimeCError):
    """RJ_EHAZARD: a program the hardware is known to mishandle (refused, not reproduced)."""

    code = -4


class SimUnsupportedError(RuntimeCError, UnsupportedError):
    """RJ_EUNSUPP: a register setting or host step this build does not model."""

    code = -5


class DeviceError(RuntimeCError):
    """RJ_EIO: the device (an ioctl, open or mmap) failed."""

    code = -6


class DeviceTimeoutError(DeviceError):
    """RJ_ETIMEDOUT: a job did not finish before its fence deadline."""

    code = -7


ERROR_CLASSES: dict[int, type[RuntimeCError]] = {
    cls.code: cls
    for cls in (ProgramError, DeviceMemoryError, AddressError, HazardError, SimUnsupportedError,
                DeviceError, DeviceTimeoutError)
}


def error_for(code: int, message: str) -> RuntimeCError:
    cls = ERROR_CLASSES.get(code, RuntimeCError)
    return cls(message or f"C runtime error {code} without a message", code)


class BundleError(RockjitError):
    """A bundle cannot be written, read or run: damaged, from a newer rockjit, for another
    chip, or called with inputs of the wrong shape or dtype. The message says which."""
