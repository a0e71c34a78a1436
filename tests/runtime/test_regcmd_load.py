"""Loading a program image's regcmd words (runtime/program.py: ``_written_runs``): every word
a task fetches and every non-zero word are written; all-zero gaps outside every task are
skipped when they span a page or more (a context's regcmd BO reserves each call's whole region,
of which its own kicks fill about a third on three cores), shorter ones are written with their
neighbours (one write for many 64-byte aligned job spans)."""
from __future__ import annotations

import numpy as np

from rockjit.runtime.program import _written_runs


def _covered(runs, n):
    out = np.zeros(n, bool)
    for a, b in runs:
        assert 0 <= a < b <= n
        out[a:b] = True
    return out


def test_tasks_written_long_zero_gaps_skipped_short_ones_joined() -> None:
    P = 512                                # words per 4 KB page
    words = np.zeros(8 * P, "<u8")
    words[10:20] = 7                       # a task's words
    words[30:34] = 0                       # a task of zero words is still written
    words[3 * P] = 5                       # a stray non-zero word outside every task
    words[6 * P:6 * P + 10] = 9            # a task placed from BO word 1000 + 6 * P
    tasks = [(1010, 1015), (1012, 1020), (1030, 1034), (1000 + 6 * P, 1000 + 6 * P + 10),
             (1000 + 9 * P, 1000 + 9 * P + 10)]
    runs = _written_runs(words, tasks, 1000)
    cov = _covered(runs, words.size)
    assert not words[~cov].any(), "a non-zero word was skipped"
    assert cov[10:20].all() and cov[30:34].all() and cov[6 * P:6 * P + 10].all() and cov[3 * P]
    # the short gap between the first tasks is joined; the page-long gaps are skipped
    want = np.zeros(words.size, bool)
    want[10:34] = want[3 * P] = want[6 * P:6 * P + 10] = True
    assert (cov == want).all(), f"runs {runs}"
    assert len(runs) == 3


def test_no_tasks_writes_every_nonzero_word() -> None:
    words = np.arange(16, dtype="<u8")
    runs = _written_runs(words, [], 0)
    assert _covered(runs, 16)[1:].all()
