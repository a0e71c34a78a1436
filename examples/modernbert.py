#!/usr/bin/env python3
"""ModernBERT-base encoder on the RK3588 NPU: load weights, compile, run, compare with JAX,
save a bundle and run it back.

    python examples/modernbert.py --weights model.safetensors  # answerdotai/ModernBERT-base
                                                               # (HF tensor names)
    python examples/modernbert.py                              # seeded weights (no download)
    python examples/modernbert.py --layers 2 --seq-len 128     # a smaller run
    python examples/modernbert.py --backend sim                # force the simulator

By default it runs where ``rockjit.compile`` does ("auto": the NPU when /dev/accel/accel0
opens, else the C simulator). The bundle it writes (out/modernbert.rjb) runs without JAX:
``rockjit run out/modernbert.rjb tokens.npz`` or
``rockjit.load("out/modernbert.rjb")(input_ids, attention_mask)``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

from models import harness, modernbert

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = harness.encoder_flags(__doc__.splitlines()[0], ROOT / "out", "ModernBertConfig", 22)
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    ap.add_argument("--pad", type=int, default=0, help="padded (masked) tokens at the end")
    args = ap.parse_args(argv)
    if not 0 <= args.pad < args.seq_len:
        ap.error(f"--pad must be in [0, --seq-len), got {args.pad}")
    config, overrides = harness.configure_from_flags(ap, modernbert.ModernBertConfig(), args.set,
                                                     {"num_hidden_layers": args.layers})

    # 1. weights: a checkpoint, or the repo's seeded default, through the checked loader
    loaded = harness.load_weights("modernbert", modernbert, config, args.weights, args.out,
                                  overrides)
    if loaded is None:
        return 1
    path, params = loaded
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (1, args.seq_len),
                                            dtype=np.int32)
    mask = np.ones((1, args.seq_len), np.int32)
    mask[:, args.seq_len - args.pad:] = 0
    real = args.seq_len - args.pad          # rows at padded positions are meaningless

    def encode(params, input_ids, attention_mask):
        return modernbert.forward(params, input_ids, attention_mask, config)

    # 2. compile (trace + lower to the NPU program, weights packed once, resident), then run:
    # the first call loads the program onto the device; then steady state
    print(f"modernbert  {config.num_hidden_layers} layers, {args.seq_len} tokens "
          f"({args.pad} padded), weights {path}")
    compiled, hidden = harness.compile_and_time(encode, params, (ids, mask), args.backend,
                                                args.runs)

    # 3. compare with JAX on the CPU
    ref = jax.jit(encode)(params, ids, mask)
    print(f"cosine      last_hidden_state "
          f"{harness.cosine(hidden[:, :real], ref[:, :real]):.6f} (unpadded rows)")
    harness.print_stats(compiled)
    ok = True
    if args.check_bound:
        from rockjit.oracle import tolerance as T
        b, = T.graph_bound(compiled.graph, compiled.params, [ids, mask])
        ratio = harness.bound_ratio(np.asarray(hidden)[:, :real], np.asarray(ref)[:, :real],
                                    b[:, :real])
        print(f"bound       last_hidden_state: worst |ours - jax| / fp16 bound = {ratio:.3f}")
        ok = ratio <= 1.0

    # 4. save a bundle and run it back (no JAX needed on the loading side)
    same = harness.bundle_roundtrip(compiled, args.out / "modernbert.rjb", args.backend,
                                    (ids, mask), hidden)
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
