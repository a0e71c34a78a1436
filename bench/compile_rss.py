"""Resident memory of a whole compile + one forward on the simulator (issue 9, memory): the
process's RSS at each phase boundary and the peak inside each phase (a sampling thread reads
/proc/self/status every 20 ms), what the compiled function holds, and what is given back when
it is dropped.

    python bench/compile_rss.py [--model siglip-224] [--layers 12] [--backend sim]

Phases: weights (the seeded fp32 params), trace (jaxpr -> IR), bind (the resident values'
copies), lower + image (NpuRunner.compile: pipeline.lower_graph, then ImageBuilder's packed
weights and regcmd words), load (BOs and uploads on the device), forward (one call), then ``del`` of the compiled function
(freed by reference counting alone), a full ``gc.collect()`` (what only a cycle held) and
glibc's ``malloc_trim`` (free heap pages the allocator kept). No collection runs between the
phases, as in a user's process. Linux only (/proc).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import threading
import time
import weakref

import numpy as np
from _encoders import ENCODERS, setup


def _rss() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out["VmRSS"], out["VmHWM"]


class Sampler(threading.Thread):
    """The largest VmRSS seen since the last ``mark``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, _rss()[0])

    def mark(self) -> float:
        peak, self.peak = max(self.peak, _rss()[0]), _rss()[0]
        return peak


def _held(binding, runner) -> dict[str, int]:
    """Bytes the compiled function keeps, by what keeps them (BO sizes as declared; a BO's
    resident memory is the pages written)."""
    img = runner.image
    out = {"resident fp32 values (binding)": sum(v.nbytes for v in binding.values.values()),
           "packed weights (Buf.data = image arrays)": sum(
               b.data.nbytes for b in runner.lowered.bufs if b.data is not None)}
    out["image regcmd word arrays"] = sum(a.nbytes for k, a in img.arrays.items()
                                          if k.startswith("regcmd"))
    out["  of which nonzero words"] = sum(int(np.count_nonzero(a.view("<u8"))) * 8
                                          for k, a in img.arrays.items() if k.startswith("regcmd"))
    for role in ("arena", "weights", "regcmd", "io"):
        for c in sorted({b.core for b in img.bos}):
            n = sum(b.size for b in img.bos if b.role == role and b.core == c)
            if n:
                out[f"BO {role} core {c} (declared)"] = n
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="siglip-224", choices=sorted(ENCODERS))
    ap.add_argument("--layers", type=int, default=None, help="default: the full depth")
    ap.add_argument("--backend", default="sim")
    args = ap.parse_args()
    from jax.tree_util import tree_flatten

    import rockjit
    from rockjit.api import Compiled
    from rockjit.backends import BACKENDS
    from rockjit.binding import ResidentBinding

    enc = ENCODERS[args.model]
    depth = args.layers or enc.layers
    s = Sampler()
    s.start()
    rows = []
    t = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t
        rows.append((name, _rss()[0], s.mark(), time.perf_counter() - t))
        t = time.perf_counter()

    gc.collect()
    phase("start (imports)")
    fn, params, inputs = setup(enc, depth)
    phase("weights")
    f = rockjit.compile(fn, resident_argnums=0, backend=args.backend)
    lowered = f.lower(params, *inputs)
    phase("trace")
    # Lowered.compile() and the first call, one step at a time
    binding = ResidentBinding()
    flat = tree_flatten(params)[0]
    binding.update([(name, flat[j], lowered.signature.args[i].leaves[j])
                    for (i, j), name in lowered.signature.param_names.items()])
    compiled = Compiled(lowered.graph, lowered.signature, lowered.out_tree, args.backend, binding)
    del lowered
    runner = compiled._runner = BACKENDS[args.backend](compiled.graph, binding.values)
    phase("bind")
    runner.compile()
    phase("lower + image")
    runner.load()
    phase("load")
    compiled(params, *inputs)
    phase("forward")
    held = _held(binding, runner)
    alive = {"runner": weakref.ref(runner), "lowered graph": weakref.ref(runner.lowered),
             "image builder": weakref.ref(runner.builder)}
    del compiled, runner, f, binding
    phase("del (refcount)")
    left = [k for k, r in alive.items() if r() is not None]
    gc.collect()
    phase("gc.collect()")
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    phase("malloc_trim(0)")
    s.stop.set()
    print(f"{enc.name}, {depth} layer(s), backend {args.backend}")
    print(f"{'phase':<16} {'RSS after MB':>12} {'peak in phase MB':>17} {'wall s':>7}")
    for name, rss, peak, dt in rows:
        print(f"{name:<16} {rss:12.0f} {peak:17.0f} {dt:7.1f}")
    print(f"compile + one forward: {sum(r[3] for r in rows[2:7]):.1f} s wall")
    print(f"process peak (VmHWM) {_rss()[1]:.0f} MB")
    print(f"alive after del, before gc.collect(): {left or 'nothing'}")
    print("held by the compiled function after the first call (MB):")
    for k, v in held.items():
        print(f"  {k:<44} {v / 2**20:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
