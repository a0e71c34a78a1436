"""plan_arena against a direct transcription of its rule (largest first; lowest aligned offset
that clears every already placed buffer live at the same time), on random buffer sets."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from rockjit.lowering.memory import BufReq, check_plan, plan_arena


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _first_fit(reqs: list[BufReq]) -> dict[int, int]:
    placed: list[tuple[int, int, BufReq]] = []
    offsets = {}
    for r in sorted(reqs, key=lambda r: (not r.pinned, -r.size, r.first, r.id)):
        busy = sorted((s, e) for s, e, o in placed
                      if r.pinned or o.pinned or not (o.last < r.first or r.last < o.first))
        off = 0
        for s, e in busy:
            if align_up(off, r.align) + r.size <= s:
                break
            off = max(off, e)
        off = align_up(off, r.align)
        offsets[r.id] = off
        placed.append((off, off + r.size, r))
    return offsets


@st.composite
def _reqs(draw) -> list[BufReq]:
    out = []
    for i in range(draw(st.integers(0, 40))):
        a = draw(st.integers(0, 30))
        out.append(BufReq(i, draw(st.sampled_from([1, 64, 128, 192, 256, 1000])), draw(st.sampled_from([1, 64, 256])),
                          a, a + draw(st.integers(0, 10)), draw(st.booleans()) and
                          draw(st.integers(0, 5)) == 0))
    return out


@settings(max_examples=200, deadline=None)
@given(_reqs())
def test_plan_arena_is_first_fit(reqs: list[BufReq]) -> None:
    plan = plan_arena(reqs)
    assert plan.offsets == _first_fit(reqs)
    check_plan(reqs, plan)
