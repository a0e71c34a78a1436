"""Loading a program image's regcmd words (runtime/program.py: ``_written_runs``): every word
a task fetches and every non-zero word are written; only all-zero gaps outside every task are
skipped (a context's regcmd BO reserves each call's whole region, of which its own kicks fill
about a third on three cores)."""
from __future__ import annotations

import numpy as np

from rockjit.runtime.program import _written_runs


def _covered(runs, n):
    out = np.zeros(n, bool)
    for a, b in runs:
        assert 0 <= a < b <= n
        out[a:b] = True
    return out


def test_tasks_written_zero_gaps_skipped_nonzero_gaps_kept() -> None:
    words = np.zeros(100, "<u8")
    words[10:20] = 7                       # a task's words
    words[30:34] = 0                       # a task of zero words is still written
    words[60] = 5                          # a stray non-zero word outside every task
    words[80:90] = 9                       # a task placed from BO word 1000 + 80
    tasks = [(1010, 1015), (1012, 1020), (1030, 1034), (1080, 1090), (2000, 2010)]
    runs = _written_runs(words, tasks, 1000)
    cov = _covered(runs, words.size)
    assert cov[10:20].all() and cov[30:34].all() and cov[80:90].all() and cov[60]
    skipped = ~cov
    assert not words[skipped].any(), "a non-zero word was skipped"
    # the gaps before, between and after the tasks (a gap with a non-zero word is written whole)
    want = np.zeros(100, bool)
    want[0:10] = want[20:30] = want[90:100] = True
    assert (skipped == want).all(), f"the zero gaps were written: {runs}"


def test_no_tasks_writes_every_nonzero_word() -> None:
    words = np.arange(16, dtype="<u8")
    runs = _written_runs(words, [], 0)
    assert _covered(runs, 16)[1:].all()
