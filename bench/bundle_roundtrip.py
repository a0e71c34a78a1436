#!/usr/bin/env python3
"""Bundle figures per encoder: compile, save, load, first call and steady time per forward
from the loaded bundle, bundle size, and whether the loaded bundle's outputs equal the
in-process compiled function's bit for bit.

    python bench/bundle_roundtrip.py                          # the three encoders, full size
    python bench/bundle_roundtrip.py --model whisper-tiny --set encoder_layers=1
    python bench/bundle_roundtrip.py --backend rocket          # RJ_FAKE_ROCKET=1 for the fake

Seeded weights (models/presets.py) unless --weights is given.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rockjit  # noqa: E402
from models.presets import MODELS, default_weights  # noqa: E402
from rockjit.cli import parse_assignments  # noqa: E402


def one(name: str, overrides: dict, args: argparse.Namespace, tmp: Path) -> None:
    entry = MODELS[name]
    config = entry.configure(overrides)
    path = args.weights or default_weights(name, entry.module, config, ROOT / "out", overrides)
    params = entry.module.load_params(path, config)
    inputs = entry.make_inputs(np.random.default_rng(1), config, args.seq_len)
    fn = entry.forward(config)
    t0 = time.perf_counter()
    c = rockjit.compile(fn, resident_argnums=0, backend=args.backend).lower(params, *inputs) \
        .compile().build_program(params, *inputs)
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = jax.tree_util.tree_leaves(c(params, *inputs))
    t_first_inproc = time.perf_counter() - t0
    bundle = tmp / f"{name}.rjb"
    t0 = time.perf_counter()
    c.save(str(bundle))
    t_save = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = rockjit.load(bundle, backend=args.backend)
    t_load = time.perf_counter() - t0
    with b:
        t0 = time.perf_counter()
        got = b.call_flat(list(inputs))
        t_first = time.perf_counter() - t0
        steady = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            b.call_flat(list(inputs))
            steady.append(time.perf_counter() - t0)
    same = len(got) == len(want) and all(np.array_equal(g, np.asarray(w))
                                         for g, w in zip(got, want))
    st = c.stats()
    size = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "full size"
    print(f"{name} ({size}) on {b.backend}: "
          f"bundle {bundle.stat().st_size / 2**20:.2f} MiB; compile {t_compile:.1f} s; "
          f"save {t_save:.2f} s; load {t_load:.2f} s; in-process first call "
          f"{t_first_inproc:.2f} s; loaded first call {t_first:.3f} s; steady "
          f"{statistics.median(steady):.3f} s/forward (median of {len(steady)}); "
          f"jobs {st['jobs']} host_steps {st['host_steps']}; "
          f"bit-identical: {same}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), action="append")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE")
    ap.add_argument("--weights", type=Path)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    overrides = parse_assignments(args.set)
    with tempfile.TemporaryDirectory() as d:
        for name in args.model or ("whisper-tiny", "siglip", "modernbert"):
            one(name, overrides, args, Path(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
