"""The registry of environment flags and the one grammar their values follow (design.md
convention 11).

The flags the C runtime reads are rows of the C table (csrc/runtime/envflags.c); this module
reads that table through the C core, so a C flag is described in one place. Flags only Python
reads are registered here with ``flag(name, description, default)``. Reading an unregistered
name is an error, so a typo cannot silently read nothing.

A switch takes one of ``SWITCH_WORDS`` (1/0, true/false, yes/no, on/off, any case); empty is
the same as unset. Any other value raises ``FlagValueError`` naming the flag and the accepted
words, in Python exactly as in C (``rj_env_switch``): the word list below is checked against the
C one by tests/reliability/test_envflags.py.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Iterator

from .errors import RockjitError


class FlagError(RockjitError, KeyError):
    """A flag is read without being registered, or registered twice differently."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FlagValueError(RockjitError, ValueError):
    """A switch flag holds a value that is not one of the switch words."""


# (word, on) pairs, "on" word first; must equal csrc/runtime/envflags.c bool_words.
SWITCH_WORDS: tuple[tuple[str, bool], ...] = (
    ("1", True), ("0", False), ("true", True), ("false", False), ("yes", True), ("no", False),
    ("on", True), ("off", False))
ACCEPTED = "1/0, true/false, yes/no, on/off (any case), or empty/unset for off"

SWITCH, TEXT = "switch", "text"


@dataclass(frozen=True)
class Flag:
    name: str
    description: str
    default: str = ""
    kind: str = SWITCH      # SWITCH or TEXT
    side: str = "python"    # "python" (registered here) or "c" (a row of the C table)


_FLAGS: dict[str, Flag] = {}
_c_loaded = False
_c_lock = threading.Lock()


def flag(name: str, description: str, default: str = "", kind: str = SWITCH) -> Flag:
    """Register a Python-only flag (idempotent for an identical registration)."""
    f = Flag(name, description, default, kind)
    old = _FLAGS.get(name)
    if old is not None and old != f:
        raise FlagError(f"debug flag {name!r} is already registered with a different description "
                        f"or default; register each flag once, in rockjit/debugflags.py")
    _FLAGS[name] = f
    return f


def c_flags() -> dict[str, Flag]:
    """The C runtime's table (csrc/runtime/envflags.c), read through the C core."""
    from .runtime._ffi import ffi, lib

    info = ffi.new("rj_env_flag_info *")
    out = {}
    for i in range(lib.rj_env_flag_count()):
        lib.rj_env_flag_describe(i, info)
        name = ffi.string(info.name).decode()
        kind = SWITCH if info.kind == lib.RJ_ENV_BOOL else TEXT
        out[name] = Flag(name, ffi.string(info.description).decode(), "", kind, "c")
    return out


def c_switch_words() -> tuple[tuple[str, bool], ...]:
    """The C grammar's words (rj_env_bool_word), to check SWITCH_WORDS against."""
    from .runtime._ffi import ffi, lib

    on = ffi.new("int *")
    words = []
    i = 0
    while (w := lib.rj_env_bool_word(i, on)) != ffi.NULL:
        words.append((ffi.string(w).decode(), bool(on[0])))
        i += 1
    return tuple(words)


def _load_c() -> None:
    global _c_loaded
    if _c_loaded:
        return
    with _c_lock:
        if not _c_loaded:
            for name, f in c_flags().items():
                if name in _FLAGS and _FLAGS[name].side != "c":
                    raise FlagError(f"flag {name!r} is registered in rockjit/debugflags.py and in "
                                    f"csrc/runtime/envflags.c; keep it in the C table only")
                _FLAGS[name] = f
            _c_loaded = True


def _get(name: str) -> Flag:
    f = _FLAGS.get(name)
    if f is None:
        _load_c()
        f = _FLAGS.get(name)
    if f is None:
        raise FlagError(f"debug flag {name!r} is not registered; add it with flag() in "
                        f"rockjit/debugflags.py, or to the C table in csrc/runtime/envflags.c "
                        f"(known: {', '.join(sorted(_FLAGS))})")
    return f


def value(name: str) -> str:
    """The flag's environment value, or its default when unset or empty."""
    f = _get(name)
    v = os.environ.get(name, "")
    return v if v else f.default


def parse_switch(name: str, text: str) -> bool:
    """A switch value by the grammar; FlagValueError names the flag for any other word."""
    if text == "":
        return False
    # ASCII-only case folding, as C's strcasecmp: no Unicode letter may fold into a word
    t = text.lower() if text.isascii() else None
    for word, on in SWITCH_WORDS:
        if t == word:
            return on
    shown = text if len(text) <= 64 else text[:64] + "..."
    raise FlagValueError(f"environment flag {name}={shown} is not a switch value; use {ACCEPTED}")


def enabled(name: str) -> bool:
    """Whether switch flag ``name`` is on (FlagValueError for a value outside the grammar)."""
    f = _get(name)
    if f.kind != SWITCH:
        raise FlagError(f"{name} is a text flag ({f.description}); read it with value()")
    return parse_switch(name, value(name))


def check_all() -> None:
    """Refuse now any registered switch whose value is outside the grammar."""
    _load_c()
    for f in registered():
        if f.kind == SWITCH:
            enabled(f.name)


def registered() -> Iterator[Flag]:
    _load_c()
    return iter(sorted(_FLAGS.values(), key=lambda f: f.name))


# ---- the Python-only flags -------------------------------------------------------------------

UPDATE_GOLDEN = flag(
    "ROCKJIT_UPDATE_GOLDEN",
    "on: golden lowering tests (tests/lowering/test_golden_regcmd.py) rewrite their expected "
    "regcmd text files from the current emitters instead of comparing. A deliberate act: commit "
    "the diff with the reason for the change.",
    "0")

NPU_FIRST = flag(
    "ROCKJIT_NPU_FIRST",
    "on: every op the NPU has a form for runs on the NPU, as before the cost model took the "
    "host-or-NPU decision for one-row ops (rockjit/lowering/host_or_npu.py). For tests that "
    "exercise an NPU path at one row, and to compare both placements.",
    "0")

# Flags of the C table that Python reads too (described there).
FAKE_ROCKET = "RJ_FAKE_ROCKET"
SIM_FAITHFUL = "RJ_SIM_FAITHFUL"

PROGRESS = flag(
    "ROCKJIT_PROGRESS",
    "on: progress bars on stderr for lowering and image layout of whole models even when stderr "
    "is not a terminal; off: never. Unset: only on a terminal (rockjit/progress.py).",
    "")

NO_COALESCE = flag(
    "ROCKJIT_NO_COALESCE",
    "on: keep the schedule's step order and one NPU step per op step (no hoisting of "
    "independent host steps, no merging of adjacent context-0 NPU steps: "
    "rockjit/lowering/coalesce.py), for A/B comparisons.",
    "0")

NO_PLANE_SPLIT = flag(
    "ROCKJIT_NO_PLANE_SPLIT",
    "on: a feature reduce of a long cube keeps its row tiles instead of summing the flat "
    "split's channel planes on the cores that made them (rockjit/lowering/rules/reduce.py "
    "_plane_split_sum), for A/B comparisons: the outputs agree to fp32 rounding.",
    "0")

ROW_SPLIT = flag(
    "ROCKJIT_ROW_SPLIT",
    "on: the element-wise passes that make a feature reduce's operand (a norm's statistics) run "
    "split by the reduce's row ranges instead of the flat split, so each norm is 3 NPU steps "
    "(rockjit/lowering/rules/row_chain.py). Off by default: it runs one small self-chained task "
    "per channel plane and row range (SigLIP-224: ~3170 tasks per layer against ~330). The cost "
    "model charges each task that reads operands a CBUF fill (fill_us, fitted on a CNN whose "
    "tasks are convs) and models the row split at 397.5 against 208.4 ms per SigLIP-224 "
    "forward; with chained tasks free (the model before fill_us) it was 205.4 against 206.5. "
    "No published figure prices a small DPU-only task inside a chained kick: on a board, "
    "compare both. Where the channels are three equal whole K groups (768: SigLIP, ModernBERT) "
    "the default's plane-split reduces (rules/reduce.py) reach the same 3 steps in the flat "
    "split's tasks; the switch turns them off.",
    "0")

NO_COMPILE_CACHE = "ROCKJIT_NO_COMPILE_CACHE"
flag(NO_COMPILE_CACHE,
     "on: the lowering plans and emits every op afresh instead of reusing the tile plan or the "
     "program of an op of the same structure earlier in the same compile (the previous "
     "layer's; rockjit/lowering/compile_cache.py); the program is the same either way, only "
     "slower.",
     "0")

NO_HOST_FUSE = flag(
    "ROCKJIT_NO_HOST_FUSE",
    "on: every host op stays a step of its own instead of runs of small element-wise ones "
    "running as one fused step (rockjit/lowering/host_fuse.py); the same ops in the same "
    "order either way, so the same bits. For A/B comparisons of step counts and host time.",
    "0")

NO_JOB_MERGE = flag(
    "ROCKJIT_NO_JOB_MERGE",
    "on: every runtime job of an NPU step is submitted on its own instead of a core's runs of "
    "independent jobs being linked into one self-chained kick (rockjit/lowering/job_merge.py); "
    "the same tasks in the same order either way. For A/B comparisons of jobs, kicks and "
    "modelled time.",
    "0")

NO_ZERO_POOLS = flag(
    "ROCKJIT_NO_ZERO_POOLS",
    "on: every must-stay-zero arena buffer keeps a zero-filled range of its own for the whole "
    "program instead of alike ones sharing slots (rockjit/lowering/zero_pools.py); the same "
    "outputs either way. For A/B comparisons of arena size and first-call page faults.",
    "0")

EAGER_COPIES = flag(
    "ROCKJIT_EAGER_COPIES",
    "on: around every NPU step with jobs on contexts > 0, copy every arena run they read from "
    "context 0 in and every run they write back (the scheme before residency tracking, "
    "rockjit/lowering/residency_copies.py), and host steps read context 0 only. For A/B "
    "comparisons of copy bytes and results.",
    "0")
