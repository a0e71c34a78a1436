"""One grammar for every environment flag, in C and in Python: the same words, the same table
of C flags, the same verdict on any value, and an unknown value is an error naming the flag."""
from __future__ import annotations


import pytest
from hypothesis import given, settings, strategies as st

from rockjit import debugflags
from rockjit.runtime import ProgramBuilder, ProgramError, SimDevice, env_flags
from rockjit.runtime._ffi import ffi, lib


def _c_parse(text: str):
    on = ffi.new("int *")
    rc = lib.rj_env_parse_bool(text.encode("utf-8", "surrogatepass"), on)
    return bool(on[0]) if rc == 0 else "error"


def _py_parse(text: str):
    try:
        return debugflags.parse_switch("RJ_X", text)
    except debugflags.FlagValueError:
        return "error"


def test_python_words_are_the_c_words():
    assert debugflags.SWITCH_WORDS == debugflags.c_switch_words()


def test_c_table_is_the_python_registry():
    reg = {f.name: f for f in debugflags.registered()}
    c = debugflags.c_flags()
    assert set(c) <= set(reg) and set(c) == set(env_flags())
    for name, f in c.items():
        assert reg[name] == f and f.side == "c"
    assert {"RJ_FAKE_ROCKET", "RJ_TRACE_STEPS", "RJ_POISON_BOS"} <= {
        n for n, f in c.items() if f.kind == debugflags.SWITCH}
    assert c["RJ_DUMP_REGCMD"].kind == debugflags.TEXT


@pytest.mark.parametrize("text,want", [
    ("1", True), ("0", False), ("TRUE", True), ("False", False), ("yEs", True), ("NO", False),
    ("On", True), ("off", False), ("", False), ("banana", "error"), ("2", "error"),
    (" 1", "error"), ("onn", "error"), ("y", "error")])
def test_both_sides_agree_on_listed_values(text, want):
    assert _c_parse(text) == want
    assert _py_parse(text) == want


_near_words = st.sampled_from([w for w, _ in debugflags.SWITCH_WORDS]).flatmap(
    lambda w: st.sampled_from([w, w.upper(), w.capitalize(), w + " ", w[:-1], w + w[-1:]]))


@settings(max_examples=500, deadline=None)
@given(st.one_of(_near_words, st.text(alphabet=st.characters(blacklist_characters="\x00",
                                                              blacklist_categories=("Cs",)),
                                      max_size=8)))
def test_both_sides_agree_on_any_value(text):
    assert _c_parse(text) == _py_parse(text)


def test_unknown_value_is_an_error_in_python(monkeypatch):
    monkeypatch.setenv("RJ_FAKE_ROCKET", "banana")
    with pytest.raises(debugflags.FlagValueError, match=r"RJ_FAKE_ROCKET=banana .*true/false.*on/off"):
        debugflags.enabled("RJ_FAKE_ROCKET")
    with pytest.raises(debugflags.FlagValueError, match="RJ_FAKE_ROCKET=banana"):
        debugflags.check_all()


def test_unknown_value_is_an_error_in_c(monkeypatch):
    monkeypatch.setenv("RJ_TRACE_STEPS", "banana")
    with SimDevice() as dev:
        b = ProgramBuilder(dev)
        b.add_bo(4096)
        with pytest.raises(ProgramError, match=r"RJ_TRACE_STEPS=banana is not a switch value; use 1/0"):
            b.build()
    monkeypatch.setenv("RJ_POISON_BOS", "maybe")
    with SimDevice() as dev:
        with pytest.raises(ProgramError, match="RJ_POISON_BOS=maybe"):
            dev.create_bo(4096)


@pytest.mark.parametrize("off", ["false", "no", "off", "OFF", "0"])
def test_fake_rocket_off_words_mean_off_in_c(off, monkeypatch):
    """RJ_FAKE_ROCKET=false used to be off for Python and on for C (any value but '0')."""
    monkeypatch.setenv("RJ_FAKE_ROCKET", off)
    assert debugflags.enabled("RJ_FAKE_ROCKET") is False
    assert lib.rj_sys_current() == lib.rj_sys_libc()


def test_poison_on_words(monkeypatch):
    monkeypatch.setenv("RJ_POISON_BOS", "Yes")
    with SimDevice() as dev:
        bo = dev.create_bo(4096)
        assert bytes(bo.memory()[:4]) == b"\xaa" * 4
        bo.close()
    monkeypatch.setenv("RJ_POISON_BOS", "off")
    with SimDevice() as dev:
        bo = dev.create_bo(4096)
        assert bytes(bo.memory()[:4]) == b"\x00" * 4
        bo.close()


def test_unregistered_flag_is_refused():
    with pytest.raises(debugflags.FlagError, match="not registered.*csrc/runtime/envflags.c"):
        debugflags.enabled("RJ_NO_SUCH_FLAG")
