"""Compile time: rockjit (trace + import + lowering + program build) against XLA
(``jax.jit(f).lower(...).compile()``) on the same JAX function, measured in the same run.

    python bench/compile_vs_xla.py [--model siglip-224] [--layers 1]

rockjit's compile is trace + ``Lowered.compile()`` (which lowers and builds the program image
when every resident value is bound) + the first ``null`` call minus a warm ``null`` run (loading
the image: its uploads); each part is printed apart.

The weight work inside those parts (rockjit/weight_timing.py: binding the resident values,
folding norm gains and power-of-two prescales into weights, fp16 cast + tile packing,
uploading into the weight BOs, the range plan's scans of every weight's values: min/max and
L1 norms, once per weight) is timed where it happens and printed apart, with its MB/s beside
a numpy memcpy (``np.copyto`` into a fresh array) of the same bytes in the same run; "compile
excluding weight work" is the total minus it, and its ratio to XLA is the issue-9 figure.

Module imports, JAX's CPU backend start-up and other first-use costs happen once per process:
both compilers first compile the encoder at one layer, untimed (its time is printed), so
neither pays for them in the measured compile.
Default depth is 1 layer (--layers N for more).

``--repeat N`` runs the whole measurement N times, each in a fresh process (so no cache of
either compiler survives from one to the next), one after the other, and prints each run's
two compile times and the ratio of their minima: on a shared machine XLA's time moves with
the load more than rockjit's, and the minimum of each is the least disturbed figure.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

import numpy as np

from _encoders import ENCODERS, setup
from _timing import median_s, xla_compile_s

import rockjit
from rockjit import weight_timing

BUCKETS = (("bind", "bind resident values (f32 copies)"),
           ("fold", "fold gains, 2^k prescales into weights"),
           ("pack", "fp16 cast + packing (weights, consts)"),
           ("upload", "upload into weight BOs"),
           ("scan", "range scans of weights (min/max, L1)"))


def _warm_up(enc) -> float:
    """One-time process costs, paid by neither measurement: both compilers compile the
    encoder at one layer once (JAX's backend start, rockjit's lazily imported modules)."""
    t0 = time.perf_counter()
    fn, params, inputs = setup(enc, 1)
    xla_compile_s(fn, params, inputs)
    rockjit.compile(fn, resident_argnums=0, backend="null")(params, *inputs)
    return time.perf_counter() - t0


def _memcpy_s(nbytes: int) -> float:
    """Median time of np.copyto of ``nbytes`` into a freshly allocated array."""
    src = np.ones(max(nbytes, 1), np.uint8)

    def once():
        dst = np.empty_like(src)
        np.copyto(dst, src)
    return median_s(once, 3)


def _first_touch_gbps(nbytes: int = 256 << 20) -> float:
    """GB/s of a first write into ``nbytes`` of new memory. On a VM whose host backs guest
    memory lazily (this kind of CI machine) a page written for the first time since the host
    reclaimed it costs far more than one the guest has used since (0.7-3.7 against 8.8-11.4
    GB/s measured here), and the weight buckets below allocate gigabytes, so their MB/s says as
    much about the machine's history as about rockjit; ``--prefault`` evens that out."""
    t0 = time.perf_counter()
    a = np.empty(nbytes, np.uint8)
    a[::4096] = 1
    s = time.perf_counter() - t0
    del a
    return nbytes / s / 1e9


def _prefault(gb: float) -> None:
    """Touch ``gb`` GB (rounded up to whole GB) once, page by page, and free it: the guest
    pages are backed after."""
    held = []
    for _ in range(math.ceil(gb)):
        a = np.empty(1 << 30, np.uint8)
        a[::4096] = 1
        held.append(a)
    del held


def _mbs(nbytes: float, s: float) -> str:
    return f"{nbytes / 1e6 / s:8.0f} MB/s" if s > 0 else "      -"


def _repeat(args) -> int:
    """``args.repeat`` fresh-process runs; each prints its figures as one JSON line last."""
    runs = []
    for i in range(args.repeat):
        cores = [] if args.cores is None else ["--cores", str(args.cores)]
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--layers",
                              str(args.layers), "--prefault", str(args.prefault), "--json",
                              *cores],
                             capture_output=True, text=True,
                             check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        runs.append(r)
        print(f"  run {i + 1}: rockjit excl. weights {r['rockjit_excl_s']:6.2f} s   "
              f"XLA {r['xla_s']:6.2f} s   ratio {r['rockjit_excl_s'] / r['xla_s']:5.2f} x")
    rj = min(r["rockjit_excl_s"] for r in runs)
    xla = min(r["xla_s"] for r in runs)
    on = "" if args.cores is None else f", rockjit on {args.cores} core(s)"
    print(f"{ENCODERS[args.model].name}, {args.layers} layer(s), {args.repeat} runs{on}")
    print(f"  rockjit compile excl. weights, min {rj:8.2f} s")
    print(f"  XLA jit lower + compile, min      {xla:8.2f} s")
    print(f"  ratio of the minima               {rj / xla:8.2f} x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="siglip-224", choices=sorted(ENCODERS))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="N fresh-process runs; print each and the ratio of the minima")
    ap.add_argument("--prefault", type=float, default=0.0, metavar="GB",
                    help="touch GB of memory once before timing (see _first_touch_gbps)")
    ap.add_argument("--cores", type=int, default=None,
                    help="compile rockjit's program for N cores (rockjit.compile(..., cores=N); "
                         "default: all of the chip's)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.repeat > 1:
        return _repeat(args)
    enc = ENCODERS[args.model]
    if args.prefault > 0:
        _prefault(args.prefault)
    touch = _first_touch_gbps()
    t_warm = _warm_up(enc)
    fn, params, inputs = setup(enc, args.layers)
    f = rockjit.compile(fn, resident_argnums=0, backend="null", cores=args.cores)
    with weight_timing.recording() as rec:
        t0 = time.perf_counter()
        lowered = f.lower(params, *inputs)
        t_trace = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = lowered.compile()
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(params, *inputs)
        t_first = time.perf_counter() - t0
    t_run = median_s(lambda: compiled(params, *inputs), 3)
    t_rj = t_trace + t_build + t_first - t_run
    t_xla, _ = xla_compile_s(fn, params, inputs)
    t_w = sum(s for s, _ in rec.values())
    w_bytes = sum(b for _, b in rec.values())
    on = "" if args.cores is None else f", rockjit on {args.cores} core(s)"
    print(f"{enc.name}, {args.layers} layer(s){on}   [warm-up: both compile 1 layer, untimed: "
          f"{t_warm:.2f} s]")
    print(f"  rockjit trace + import        {t_trace:8.2f} s")
    print(f"  rockjit lowering + image      {t_build:8.2f} s  (Lowered.compile())")
    print(f"  rockjit load                  {t_first - t_run:8.2f} s  (first null call {t_first:.2f} s "
          f"- warm null run {t_run:.3f} s)")
    print(f"  rockjit compile total         {t_rj:8.2f} s")
    print(f"  XLA jit lower + compile (CPU) {t_xla:8.2f} s")
    print(f"  ratio rockjit / XLA           {t_rj / t_xla:8.1f} x")
    print(f"  weight work inside the compile (first write into new memory before the run: "
          f"{touch:.2f} GB/s):")
    for key, what in BUCKETS:
        s, b = rec.get(key, (0.0, 0))
        mc = _memcpy_s(int(b)) if b else 0.0
        print(f"    {what:38s} {s:6.2f} s  {b / 1e6:8.1f} MB {_mbs(b, s)}"
              + (f"  (memcpy of the same bytes: {mc:.3f} s, {_mbs(b, mc).strip()})" if b else ""))
    mc = _memcpy_s(int(w_bytes)) if w_bytes else 0.0
    print(f"    {'all weight work':38s} {t_w:6.2f} s  {w_bytes / 1e6:8.1f} MB {_mbs(w_bytes, t_w)}"
          f"  (memcpy: {mc:.3f} s)")
    print(f"  rockjit compile excl. weights {t_rj - t_w:8.2f} s")
    print(f"  ratio excl. weights / XLA     {(t_rj - t_w) / t_xla:8.2f} x")
    if args.json:
        print(json.dumps({"rockjit_s": t_rj, "rockjit_excl_s": t_rj - t_w, "xla_s": t_xla,
                          "weights_s": t_w}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
