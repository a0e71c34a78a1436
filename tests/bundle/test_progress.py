"""Progress bars: quiet when stderr is not a terminal (CI, pipes), shown when forced."""
from __future__ import annotations

import io
import sys

from rockjit import progress


def test_quiet_when_not_a_tty(monkeypatch) -> None:
    monkeypatch.delenv("ROCKJIT_PROGRESS", raising=False)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert not progress.enabled()
    assert list(progress.progress(range(1000), "lowering")) == list(range(1000))
    assert err.getvalue() == ""


def test_forced_on_draws_a_bar(monkeypatch) -> None:
    monkeypatch.setenv("ROCKJIT_PROGRESS", "1")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert list(progress.progress(range(1000), "lowering")) == list(range(1000))
    assert "rockjit: lowering" in err.getvalue()
    # a short loop draws nothing even when forced
    err.truncate(0)
    assert list(progress.progress(range(5), "lowering")) == list(range(5))
    assert err.getvalue() == ""
