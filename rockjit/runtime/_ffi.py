"""The cffi module and the one place C return codes become Python exceptions."""
from __future__ import annotations

from .errors import error_for

try:
    from .._rjc import ffi, lib  # noqa: F401 (lib: re-exported, the C functions)
except ImportError as exc:  # the C core is built by `pip install -e .`
    raise ImportError(
        "rockjit's C core (rockjit._rjc) is missing or failed to load: run "
        "`pip install -e . --no-build-isolation` in the repository to build it "
        f"({exc})") from exc


def new_err():
    return ffi.new("rj_err *")


def check(rc: int, err) -> None:
    """Raise the exception of an RJ_E* code, with the C message."""
    if rc != 0:
        raise error_for(int(rc), ffi.string(err.msg).decode("utf-8", "replace"))


def call(fn, *args) -> None:
    """Call an rj_ function whose last argument is rj_err* and raise on failure."""
    err = new_err()
    check(fn(*args, err), err)
