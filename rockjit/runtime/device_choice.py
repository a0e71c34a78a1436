"""Which device a backend name means: ``auto`` (rocket when /dev/accel/accel0 opens, else the
simulator, said once per process), ``sim``, ``null``, ``rocket``."""
from __future__ import annotations

import os
import sys

from .errors import BundleError

_AUTO_SAID = False


def _say_once(msg: str) -> None:
    global _AUTO_SAID
    if not _AUTO_SAID:
        _AUTO_SAID = True
        print(f"rockjit: {msg}", file=sys.stderr)


def accel_available(path: str = "/dev/accel/accel0") -> tuple[bool, str]:
    """Whether the NPU device node opens (read-write), and why not."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return False, f"{path}: {e.strerror}"
    os.close(fd)
    return True, f"{path} opens"


def resolve_auto() -> tuple[str, str]:
    """``"auto"`` -> ("rocket" | "sim", why): the rocket device when /dev/accel/accel0 opens
    (or RJ_FAKE_ROCKET serves it), else the simulator. Says once per process what it chose."""
    from .. import debugflags

    if debugflags.enabled(debugflags.FAKE_ROCKET):
        kind, why = "rocket", "RJ_FAKE_ROCKET=1 serves /dev/accel/accel0 from the ioctl fake"
    else:
        ok, why = accel_available()
        kind = "rocket" if ok else "sim"
    _say_once(f"backend 'auto' runs on the {'rocket NPU device' if kind == 'rocket' else 'C simulator'}"
              f" ({why}); pass backend='sim', 'rocket' or 'interpreter' to choose")
    return kind, why


def make_device(kind: str, contexts: int):
    """A device of ``kind`` ("sim", "null", "rocket", "auto") with ``contexts`` contexts."""
    from .. import debugflags
    from .device import NullDevice, RocketDevice, SimDevice

    if kind == "auto":
        kind, _ = resolve_auto()
    if kind == "sim":
        return SimDevice(cores=contexts, strict=True)
    if kind == "null":
        return NullDevice(cores=contexts)
    if kind == "rocket":
        return RocketDevice(fake=debugflags.enabled(debugflags.FAKE_ROCKET), cores=contexts)
    raise BundleError(f"unknown backend {kind!r} for a bundle; use 'auto', 'sim', 'rocket' or "
                      f"'null' (optionally ':CHIP')")
