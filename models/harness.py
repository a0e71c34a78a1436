"""What the example scripts share around a compiled encoder: their flags and the config and
weights those select, compiling and timing it, the figures that compare it with a reference
(cosine, max relative error, worst error over the fp16 bound), and the bundle round trip (save,
load, run back, compare bits)."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

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


def encoder_flags(description: str, out_dir: Path, config_name: str, layers: int
                  ) -> argparse.ArgumentParser:
    """The flags every encoder example takes: a checkpoint, its depth, other config fields, the
    backend, timed runs, the output folder and the optional fp16-bound check."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--weights", type=Path, help="safetensors checkpoint (HF tensor names)")
    ap.add_argument("--layers", type=int,
                    help=f"encoder layers (default: the checkpoint's {layers})")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help=f"other {config_name} fields, e.g. hidden_size=64")
    ap.add_argument("--backend", default="auto", help="auto, sim, rocket (default auto)")
    ap.add_argument("--runs", type=int, default=3, help="forwards timed after the first")
    ap.add_argument("--out", type=Path, default=out_dir, help="bundle and seeded weights")
    ap.add_argument("--check-bound", action="store_true",
                    help="also hold every output to the graph's fp16 error bound (slow on "
                         "the full model: float64 on the host)")
    return ap


def compile_and_time(fn: Callable[..., Any], params: Any, inputs: Sequence[Any], backend: str,
                     runs: int) -> tuple[Any, Any]:
    """(compiled program, its first output): ``fn(params, *inputs)`` traced and lowered to an
    NPU program with ``params`` resident, then called ``1 + runs`` times; prints the compile,
    first-call and steady times."""
    import rockjit

    t0 = time.perf_counter()
    lowered = rockjit.compile(fn, resident_argnums=0, backend=backend).lower(params, *inputs)
    compiled = lowered.compile().build_program(params, *inputs)
    t_compile = time.perf_counter() - t0
    out, t_first, steady = timed_calls(compiled, (params, *inputs), runs)
    print(f"compile     {t_compile:.2f} s")
    print(f"first call  {t_first:.3f} s")
    print(f"steady      {float(np.median(steady)):.4f} s per forward (median of {len(steady)})")
    return compiled, out


def print_stats(compiled: Any) -> None:
    st = compiled.stats()
    print("stats       " + ", ".join(f"{k}={st[k]}" for k in (
        "npu_ops", "host_ops", "jobs", "tasks", "host_steps", "macs", "cores_used")))


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


def load_weights(name: str, module: Any, config: Any, weights: Path | None, out_dir: Path,
                 overrides: Mapping[str, Any]) -> tuple[Path, Any] | None:
    """(file, params): the checkpoint ``weights``, or else the repo's seeded default for
    ``config``, through the module's checked loader; None, with the WeightError on stderr,
    when it does not load."""
    import rockjit

    from .presets import default_weights

    path = weights or default_weights(name, module, config, out_dir, overrides)
    try:
        return path, module.load_params(path, config)
    except rockjit.WeightError as e:
        print(f"{name}: WeightError: {e}", file=sys.stderr)
        return None


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
