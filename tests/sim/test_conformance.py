"""The nine foreign conformance programs must leave their expected output on the simulator
(README contract: exact or within the stated tolerance)."""
from __future__ import annotations

import pytest

from harness import CASE_NAMES, CONFORMANCE, run_case


@pytest.mark.parametrize("name", CASE_NAMES)
def test_conformance_case(name: str) -> None:
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance set not present at {CONFORMANCE} (expected ../shared/conformance "
                    "next to the repository)")
    assert (CONFORMANCE / name / "program" / "buffers.json").is_file(), \
        f"conformance case {name} is missing from {CONFORMANCE}"
    run = run_case(name)
    ok, msg = run.case.check(run.output())
    assert ok, f"{name}: {msg}"


def test_conformance_stats_count_work() -> None:
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance set not present at {CONFORMANCE}")
    run = run_case("02_matmul_fp16_kacc")
    s = run.sim.stats()
    # 3 jobs x 2 unchained tasks: every task is its own kick (rocket_job.c TASK_NUMBER=1)
    assert (s["jobs"], s["tasks"], s["kicks"]) == (3, 6, 6)
    # each task is a 16x64 by 16x64 matmul tile
    assert s["macs"] == 6 * 16 * 64 * 16
