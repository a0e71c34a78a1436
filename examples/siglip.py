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

import sys
from pathlib import Path

import jax
import numpy as np

from models import harness, siglip

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = harness.encoder_flags(__doc__.splitlines()[0], ROOT / "out", "SiglipVisionConfig", 12)
    ap.add_argument("--image-size", type=int, help="pixels per side (default 224)")
    args = ap.parse_args(argv)
    config, overrides = harness.configure_from_flags(
        ap, siglip.SiglipVisionConfig(), args.set,
        {"num_hidden_layers": args.layers, "image_size": args.image_size})

    # 1. weights: a checkpoint, or the repo's seeded default, through the checked loader
    loaded = harness.load_weights("siglip", siglip, config, args.weights, args.out, overrides)
    if loaded is None:
        return 1
    path, params = loaded
    pixels = np.random.default_rng(1).standard_normal(
        (1, config.num_channels, config.image_size, config.image_size)).astype(np.float32)

    def encode(params, pixel_values):
        return siglip.forward(params, pixel_values, config)

    # 2. compile (trace + lower to the NPU program, weights packed once, resident), then run:
    # the first call loads the program onto the device; then steady state
    print(f"siglip      {config.num_hidden_layers} layers, {config.image_size}px, "
          f"weights {path}")
    compiled, (hidden, pooled) = harness.compile_and_time(encode, params, (pixels,),
                                                          args.backend, args.runs)

    # 3. compare with JAX on the CPU
    ref_hidden, ref_pooled = jax.jit(encode)(params, pixels)
    print(f"cosine      last_hidden_state {harness.cosine(hidden, ref_hidden):.6f}, "
          f"pooler_output {harness.cosine(pooled, ref_pooled):.6f}")
    harness.print_stats(compiled)
    ok = True
    if args.check_bound:
        from rockjit.oracle import tolerance as T
        for name, got, ref, b in zip(("last_hidden_state", "pooler_output"), (hidden, pooled),
                                     (ref_hidden, ref_pooled),
                                     T.graph_bound(compiled.graph, compiled.params, [pixels])):
            ratio = harness.bound_ratio(got, ref, b)
            print(f"bound       {name}: worst |ours - jax| / fp16 bound = {ratio:.3f}")
            ok = ok and ratio <= 1.0

    # 4. save a bundle and run it back (no JAX needed on the loading side)
    same = harness.bundle_roundtrip(compiled, args.out / "siglip.rjb", args.backend, (pixels,),
                                    (hidden, pooled))
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
