"""What the example scripts share around a compiled encoder: its config from the command line,
the figures that compare it with a reference (cosine, max relative error, worst error over the
fp16 bound), timed calls, and the bundle round trip (save, load, run back, compare bits)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# JAX on the CPU rounds its float32 result too: a bound on the fp16 program's error against the
# exact value is widened by that much before it is compared with |ours - jax|.
F32_ROUNDING = 2.0 ** -23


def cosine(a: Any, b: Any) -> float:
    """Cosine of two tensors flattened, in float64."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def max_rel_err(ours: Any, ref: Any) -> float:
    """max |ours - ref| / max |ref| over the whole tensor, in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def bound_ratio(ours: Any, ref: Any, bound: Any) -> float:
    """Worst |ours - ref| / bound element by element (<= 1: within it), ``bound`` an fp16
    program's error bound (``tolerance.graph_bound``) widened by ``ref``'s float32 rounding;
    inf when ``ours`` has a non-finite value."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if not np.isfinite(ours).all():
        return float("inf")
    return float(np.max(np.abs(ours - ref) / (bound + F32_ROUNDING * np.abs(ref))))


def configure_from_flags(ap: argparse.ArgumentParser, config: Any, assignments: Sequence[str],
                         fields: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(config, overrides): ``config`` with the ``--set NAME=VALUE`` ``assignments`` and the
    script's own flags (``fields``, None where not given) applied; a bad field or value is a
    usage error (``ap.error`` exits)."""
    from rockjit.cli import parse_assignments

    from .specs import configure

    try:
        overrides = parse_assignments(assignments)
        overrides.update({k: v for k, v in fields.items() if v is not None})
        return configure(config, overrides), overrides
    except ValueError as e:
        ap.error(str(e))


def timed_calls(fn: Callable[..., Any], args: Sequence[Any], runs: int
                ) -> tuple[Any, float, list[float]]:
    """(first output, seconds of the first call, seconds of each of ``runs`` calls after it):
    the first call of a compiled function also loads its program onto the device."""
    t0 = time.perf_counter()
    out = fn(*args)
    t_first = time.perf_counter() - t0
    steady = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(*args)
        steady.append(time.perf_counter() - t0)
    return out, t_first, steady


def _leaves(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def bundle_roundtrip(compiled: Any, path: Path, backend: str, inputs: Sequence[Any],
                     outputs: Any) -> bool:
    """Save ``compiled`` as a bundle at ``path``, load it back with the runtime alone (no JAX
    on that side), run it on ``inputs`` and print one line of sizes and times; True when it
    gives ``outputs`` bit for bit."""
    import rockjit

    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    compiled.save(str(path))
    t_save = time.perf_counter() - t0
    t0 = time.perf_counter()
    with rockjit.load(path, backend=backend) as b:
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = b(*inputs)
        t_b = time.perf_counter() - t0
    got, want = _leaves(again), _leaves(outputs)
    same = len(got) == len(want) and all(np.array_equal(np.asarray(g), np.asarray(w))
                                         for g, w in zip(got, want))
    print(f"bundle      {path} {path.stat().st_size / 2**20:.1f} MiB, save {t_save:.2f} s, "
          f"load {t_load:.2f} s, first call {t_b:.3f} s, "
          f"{'bit-identical' if same else 'DIFFERS from the in-process run'}")
    return same
