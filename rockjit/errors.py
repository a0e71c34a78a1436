"""User-facing errors.  Each says what was wrong, where, and what to do."""
from __future__ import annotations


class RockjitError(Exception):
    """Base class of every error rockjit raises on purpose."""


class UnsupportedError(RockjitError):
    """A traced primitive or an op that rockjit cannot compile in any form."""


class TraceError(RockjitError):
    """A call's arguments do not fit the compiled function (dtype, rank, pytree)."""


class WeightError(RockjitError):
    """A safetensors file lacks a tensor, or holds one of the wrong shape or dtype."""


class IRSyntaxError(RockjitError):
    """Malformed IR text; the message carries line and column."""


class VerifyError(RockjitError):
    """An IR graph breaks a typing, ordering or shape rule."""


class NumericsError(RockjitError):
    """A program computed a non-finite value from finite inputs: an fp16 value left its range
    where the range plan could only assume it would not (the message lists those values)."""
