"""The one registry of Python-side debug / environment flags (design.md convention 11).

Every environment variable the Python side reads is registered here once with ``flag(name,
description, default)`` and read through ``value``/``enabled``; reading an unregistered name is an
error, so a typo cannot silently read nothing. (The C runtime keeps its own table in
csrc/runtime/envflags.c; a flag both sides read must be registered in both.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from .errors import RockjitError


class FlagError(RockjitError, KeyError):
    """A flag is read without being registered, or registered twice differently."""


@dataclass(frozen=True)
class Flag:
    name: str
    description: str
    default: str


_FLAGS: dict[str, Flag] = {}


def flag(name: str, description: str, default: str = "") -> Flag:
    """Register ``name`` (idempotent for an identical registration)."""
    f = Flag(name, description, default)
    old = _FLAGS.get(name)
    if old is not None and old != f:
        raise FlagError(f"debug flag {name!r} is already registered with a different description "
                        f"or default; register each flag once, in rockjit/debugflags.py")
    _FLAGS[name] = f
    return f


def _get(name: str) -> Flag:
    try:
        return _FLAGS[name]
    except KeyError:
        raise FlagError(f"debug flag {name!r} is not registered; add it with flag() in "
                        f"rockjit/debugflags.py (known: {', '.join(sorted(_FLAGS))})") from None


def value(name: str) -> str:
    """The flag's environment value, or its default when unset or empty."""
    f = _get(name)
    v = os.environ.get(name, "")
    return v if v else f.default


def enabled(name: str) -> bool:
    """True when the flag's value is set to something other than '', '0', 'false', 'no', 'off'."""
    return value(name).strip().lower() not in ("", "0", "false", "no", "off")


def registered() -> Iterator[Flag]:
    return iter(sorted(_FLAGS.values(), key=lambda f: f.name))


# ---- the flags -------------------------------------------------------------------------------

UPDATE_GOLDEN = flag(
    "ROCKJIT_UPDATE_GOLDEN",
    "1: golden lowering tests (tests/lowering/test_golden_regcmd.py) rewrite their expected regcmd "
    "text files from the current emitters instead of comparing. A deliberate act: commit the diff "
    "with the reason for the change.",
    "0")

FAKE_ROCKET = flag(
    "RJ_FAKE_ROCKET",
    "1: backend='rocket' serves /dev/accel/accel0 from the ioctl-level fake backed by the "
    "simulator (the C runtime reads the same flag; csrc/runtime/envflags.c).",
    "0")

PROGRESS = flag(
    "ROCKJIT_PROGRESS",
    "1: progress bars on stderr for lowering and image layout of whole models even when stderr "
    "is not a terminal; 0: never. Unset: only on a terminal (rockjit/progress.py).",
    "")
