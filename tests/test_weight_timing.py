"""weight_timing: a block inside another counts its bytes in its own bucket and its time once
(in the outer block's), so the buckets' sum is never more than the time spent."""
from __future__ import annotations

import time

from rockjit import weight_timing


def test_nested_blocks_count_their_time_once() -> None:
    with weight_timing.recording() as rec:
        t0 = time.perf_counter()
        with weight_timing.timed("pack") as outer:
            with weight_timing.timed("scan") as inner:
                time.sleep(0.02)
                inner[0] = 5
            outer[0] = 7
        wall = time.perf_counter() - t0
    assert rec["scan"][1] == 5 and rec["pack"][1] == 7
    assert rec["scan"][0] == 0.0
    assert 0.02 <= rec["pack"][0] <= wall
    assert rec["pack"][0] + rec["scan"][0] <= wall


def test_a_later_block_counts_again() -> None:
    with weight_timing.recording() as rec:
        with weight_timing.timed("pack"):
            pass
        with weight_timing.timed("scan"):
            time.sleep(0.01)
    assert rec["scan"][0] >= 0.01
