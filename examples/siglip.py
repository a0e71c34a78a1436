#!/usr/bin/env python3
"""SigLIP-B/16 vision encoder on the RK3588 NPU: load weights, compile, run, compare with JAX,
save a bundle and run it back.

    python examples/siglip.py --weights model.safetensors   # a google/siglip-base-patch16-224
                                                            # checkpoint (HF tensor names)
    python examples/siglip.py                               # seeded weights (no download)
    python examples/siglip.py --layers 2 --image-size 64    # a smaller model
    python examples/siglip.py --backend sim                 # force the simulator

By default it runs where ``rockjit.compile`` does ("auto": the NPU when /dev/accel/accel0
opens, else the C simulator). The bundle it writes (out/siglip.rjb) runs without JAX:
``rockjit run out/siglip.rjb pixels.npz`` or ``rockjit.load("out/siglip.rjb")(pixels)``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

import rockjit
from models import siglip
from models.presets import default_weights
from models.specs import configure

ROOT = Path(__file__).resolve().parent.parent


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, help="safetensors checkpoint (HF tensor names)")
    ap.add_argument("--layers", type=int, help="encoder layers (default: the checkpoint's 12)")
    ap.add_argument("--image-size", type=int, help="pixels per side (default 224)")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="other SiglipVisionConfig fields, e.g. hidden_size=64")
    ap.add_argument("--backend", default="auto", help="auto, sim, rocket (default auto)")
    ap.add_argument("--runs", type=int, default=3, help="forwards timed after the first")
    ap.add_argument("--out", type=Path, default=ROOT / "out", help="bundle and seeded weights")
    ap.add_argument("--check-bound", action="store_true",
                    help="also hold every output to the graph's fp16 error bound (slow on "
                         "the full model: float64 on the host)")
    args = ap.parse_args(argv)

    from rockjit.cli import parse_assignments
    try:
        overrides = parse_assignments(args.set)
    except ValueError as e:
        ap.error(str(e))
    if args.layers is not None:
        overrides["num_hidden_layers"] = args.layers
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    try:
        config = configure(siglip.SiglipVisionConfig(), overrides)
    except ValueError as e:
        ap.error(str(e))

    # 1. weights: a checkpoint, or the repo's seeded default, through the checked loader
    path = args.weights or default_weights("siglip", siglip, config, args.out, overrides)
    try:
        params = siglip.load_params(path, config)
    except rockjit.WeightError as e:
        print(f"siglip: WeightError: {e}", file=sys.stderr)
        return 1
    pixels = np.random.default_rng(1).standard_normal(
        (1, config.num_channels, config.image_size, config.image_size)).astype(np.float32)

    def encode(params, pixel_values):
        return siglip.forward(params, pixel_values, config)

    # 2. compile: trace + lower to the NPU program (weights packed once, resident)
    t0 = time.perf_counter()
    model = rockjit.compile(encode, resident_argnums=0, backend=args.backend)
    compiled = model.lower(params, pixels).compile().build_program(params, pixels)
    t_compile = time.perf_counter() - t0

    # 3. run: the first call loads the program onto the device; then steady state
    t0 = time.perf_counter()
    hidden, pooled = compiled(params, pixels)
    t_first = time.perf_counter() - t0
    steady = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        compiled(params, pixels)
        steady.append(time.perf_counter() - t0)

    # 4. compare with JAX on the CPU
    ref_hidden, ref_pooled = jax.jit(encode)(params, pixels)
    print(f"siglip      {config.num_hidden_layers} layers, {config.image_size}px, "
          f"weights {path}")
    print(f"compile     {t_compile:.2f} s")
    print(f"first call  {t_first:.3f} s")
    print(f"steady      {float(np.median(steady)):.4f} s per forward (median of {len(steady)})")
    print(f"cosine      last_hidden_state {cosine(hidden, ref_hidden):.6f}, "
          f"pooler_output {cosine(pooled, ref_pooled):.6f}")
    st = compiled.stats()
    print("stats       " + ", ".join(f"{k}={st[k]}" for k in (
        "npu_ops", "host_ops", "jobs", "tasks", "host_steps", "macs", "cores_used")))
    ok = True
    if args.check_bound:
        from rockjit.oracle import tolerance as T
        for name, got, ref, b in zip(("last_hidden_state", "pooler_output"), (hidden, pooled),
                                     (ref_hidden, ref_pooled),
                                     T.graph_bound(compiled.graph, compiled.params, [pixels])):
            ref = np.asarray(ref, np.float64)
            ratio = float(np.max(np.abs(np.asarray(got, np.float64) - ref)
                                 / (b + 2.0 ** -23 * np.abs(ref))))
            print(f"bound       {name}: worst |ours - jax| / fp16 bound = {ratio:.3f}")
            ok = ok and ratio <= 1.0

    # 5. save a bundle and run it back (no JAX needed on the loading side)
    bundle = args.out / "siglip.rjb"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    compiled.save(str(bundle))
    t_save = time.perf_counter() - t0
    t0 = time.perf_counter()
    with rockjit.load(bundle, backend=args.backend) as b:
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        b_hidden, b_pooled = b(pixels)
        t_b = time.perf_counter() - t0
        same = np.array_equal(b_hidden, hidden) and np.array_equal(b_pooled, pooled)
    print(f"bundle      {bundle} {bundle.stat().st_size / 2**20:.1f} MiB, save {t_save:.2f} s, "
          f"load {t_load:.2f} s, first call {t_b:.3f} s, "
          f"{'bit-identical' if same else 'DIFFERS from the in-process run'}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
