"""One SigLIP-B/16 encoder layer at 196 tokens (d=768, 12 heads, mlp 3072, random weights),
compiled with rockjit.compile(..., backend="sim"), run on the strict simulator (3 core
contexts), checked against JAX on CPU under the end-to-end bound (tolerance.graph_bound), and
its Program.stats() and wall times printed.

    python bench/layer_stats.py [--backend sim|null|rocket] [--tokens 196] [--report]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rockjit  # noqa: E402
from models import siglip  # noqa: E402
from rockjit.oracle import tolerance as T  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="sim", choices=("sim", "null", "rocket"))
    ap.add_argument("--tokens", type=int, default=196)
    ap.add_argument("--report", action="store_true", help="print where each op ran")
    args = ap.parse_args()
    cfg = siglip.SiglipVisionConfig()
    rng = np.random.default_rng(0)
    shapes = {k: s for k, s in siglip.expected_shapes(cfg).items()
              if k.startswith("encoder.layers.0.")}
    # HF-like initialisation scales: weights ~ N(0, 0.02), LayerNorm gains near 1
    params = {}
    for k, s in shapes.items():
        if k.endswith("layer_norm1.weight") or k.endswith("layer_norm2.weight"):
            params[k] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            params[k] = (rng.standard_normal(s) * (0.02 if len(s) > 1 else 0.1)).astype(np.float32)

    def layer(p, x):
        return siglip._encoder_layer(p, 0, x, cfg)

    x = rng.standard_normal((1, args.tokens, cfg.hidden_size)).astype(np.float32)
    f = rockjit.compile(layer, resident_argnums=0, backend=args.backend)
    t0 = time.perf_counter()
    y = np.asarray(f(params, x))           # first call: trace, lower, build, run
    t1 = time.perf_counter()
    y2 = np.asarray(f(params, x))          # steady state: run only
    t2 = time.perf_counter()
    c = f.compiled(params, x)
    print(f"SigLIP-B/16 encoder layer, {args.tokens} tokens, backend={args.backend}")
    print(f"  first call (compile + run) {t1 - t0:8.2f} s")
    print(f"  second call (run)          {t2 - t1:8.2f} s")
    ok = True
    if args.backend == "sim":
        ref = np.asarray(layer(params, x), np.float64)
        bound = T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref)
        err = np.abs(y.astype(np.float64) - ref)
        print(f"  max |y - jax|              {err.max():.3e} (max |y| {np.abs(ref).max():.3f}); "
              f"worst err/bound {np.max(err / bound):.3f} (bound median {np.median(bound):.2e}, "
              f"max {np.max(bound):.2e})")
        try:
            T.check(y, ref, bound, "SigLIP layer")
            print("  within the end-to-end bound (tolerance.graph_bound)")
        except AssertionError as e:
            ok = False
            print(f"  OUT OF BOUND: {e}")
        if not np.array_equal(y, y2):
            ok = False
            print("  second run differs from the first")
    print("\nProgram.stats():")
    for k, v in c.stats().items():
        print(f"  {k:28s} {v}")
    if args.report:
        print("\nwhere each op ran:")
        print(c.report())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
