"""User-facing errors.  Each says what was wrong, where, and what to do."""
from __future__ import annotations


class RockjitError(Exception):
    """Base class of every error rockjit raises on purpose."""


class UnsupportedError(RockjitError):
    """A traced primitive or an op that rockjit cannot compile in any form."""


class TraceError(RockjitError):
    """A call's arguments do not fit the compiled function (dtype, rank, pytree)."""


class WeightError(RockjitError):
    """A safetensors file lacks a tensor, or holds one of the wrong shape or dtype; or a
    resident weight holds values the backend cannot compute with (``param``: its name)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class IRSyntaxError(RockjitError):
    """Malformed IR text; the message carries line and column."""


class VerifyError(RockjitError):
    """An IR graph breaks a typing, ordering or shape rule."""


class InputRangeError(RockjitError):
    """A call's float input holds NaN, Inf or a value beyond what the backend computes in
    (fp16 on the NPU backends: |x| <= 65504). ``index`` is the graph input's position."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class NumericsError(RockjitError):
    """A program computed a non-finite value from finite inputs: an fp16 value left its range
    where the range plan could only assume it would not (the message lists those values)."""
