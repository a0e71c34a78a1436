"""Differential fuzzing of the lowering for as long as asked (issue 13).

    PYTHONPATH=. python bench/fuzz_lowering.py --minutes 30 [--profile rk3588|fuzz-small|mixed]
                                               [--seed 0] [--chunk 100]

Draws graphs from tests/lowering/fuzz_graphs.py (single ops and small chains, leading batch dims
1-4), compiles each for the strict simulator and the IR interpreter and compares under
tolerance.graph_bound. Runs hypothesis in chunks of ``--chunk`` examples with successive seeds;
a failing chunk is shrunk by hypothesis and its minimal spec printed (paste it into
tests/lowering/test_fuzz_lowering.py as a regression case). Prints a summary table: examples
tried per profile and op, refusals, failures, and the failing shapes.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "lowering"))
# The JAX-on-CPU reference runs op by op, and almost every drawn shape is new, so XLA compiles
# each op afresh: that compile was ~40 % of an example's time. LLVM's O0 cut its CPU time by
# ~15 % for the same IEEE float32 arithmetic (fp32 results within 4e-7 relative of the default
# level over 300 drawn graphs; the interpreter is compared with rtol 1e-4). Set before jax loads.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings  # noqa: E402

import fuzz_graphs as FG  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--profile", default="mixed", choices=["mixed", *FG.PROFILES])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    a = ap.parse_args()

    strategy = FG.specs()
    if a.profile != "mixed":
        strategy = strategy.map(lambda s: {**s, "profile": a.profile})
    tried = collections.Counter()          # (profile, op) -> examples run to the end
    refused = collections.Counter()        # (profile, op) -> UnsupportedError
    refusals: collections.Counter = collections.Counter()
    refused_example: dict[str, dict] = {}   # reason -> the first spec refused for it
    failures: list[tuple[dict, str]] = []
    seen_fail: set[str] = set()
    seen: set[str] = set()                 # distinct specs run, so shrink replays count once
    last_fail: dict = {}
    deadline = time.monotonic() + a.minutes * 60
    t0 = time.monotonic()

    def body(spec: dict) -> None:
        if time.monotonic() > deadline and not last_fail:
            return                          # out of time: let the chunk run out cheaply
        key = (spec["profile"], spec["op"])
        try:
            out = FG.run_spec(spec)
        except Exception as e:
            last_fail.clear()
            last_fail.update(spec=spec, err=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            raise
        r = repr(spec)
        if r in seen:
            return                          # a shrink or replay of a graph already counted
        seen.add(r)
        tried[key] += 1
        if out.startswith("refused"):
            refused[key] += 1
            # the reason, not the shape that precedes it, so equal limits group together
            why = out.split("no NPU form (", 1)[-1] if "no NPU form (" in out else out
            reason = re.sub(r"\d+", "#", why)[:150]
            refusals[reason] += 1
            refused_example.setdefault(reason, spec)

    phases = [Phase.generate] if a.no_shrink else [Phase.generate, Phase.shrink]
    chunk = 0
    while time.monotonic() < deadline:
        s = a.seed * 1_000_003 + chunk
        run = settings(max_examples=a.chunk, deadline=None, database=None, phases=phases,
                       suppress_health_check=list(HealthCheck), print_blob=False)(
            hseed(s)(given(spec=strategy)(body)))
        last_fail.clear()
        try:
            run()
        except Exception:
            if not last_fail:
                traceback.print_exc()
                last_fail.update(spec={"op": "?", "profile": "?"}, err="see traceback")
            spec, err = last_fail["spec"], last_fail["err"]
            tag = FG.describe(spec) + spec["profile"]
            if tag not in seen_fail:
                seen_fail.add(tag)
                failures.append((spec, err))
                print(f"FAIL (chunk seed {s}): {spec!r}\n    {err}", flush=True)
            last_fail.clear()
        chunk += 1
        n = sum(tried.values())
        print(f"[{(time.monotonic() - t0) / 60:6.1f} min] chunk {chunk}: {n} examples, "
              f"{sum(refused.values())} refused, {len(failures)} failures", flush=True)

    print("\n== fuzz_lowering summary ==")
    print(f"minutes {(time.monotonic() - t0) / 60:.1f}, seed {a.seed}, chunks {chunk}, "
          f"profile {a.profile}")
    print(f"{'profile':<12}{'op':<8}{'examples':>10}{'refused':>10}")
    for key in sorted(set(tried) | set(refused)):
        print(f"{key[0]:<12}{key[1]:<8}{tried[key]:>10}{refused[key]:>10}")
    per_prof = collections.Counter()
    for (p, _), n in tried.items():
        per_prof[p] += n
    for p, n in sorted(per_prof.items()):
        print(f"total {p}: {n} examples")
    print(f"total: {sum(tried.values())} examples, {sum(refused.values())} refused, "
          f"{len(failures)} distinct failures")
    if refusals:
        print("\nrefusals (most common):")
        for msg, n in refusals.most_common(12):
            print(f"  {n:6d}  {msg}\n          e.g. {refused_example[msg]!r}")
    if failures:
        print("\nfailures (shrunk spec, error):")
        for spec, err in failures:
            print(f"  {spec!r}\n      {err}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
