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

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

import rockjit
from models import modernbert
from models.presets import default_weights
from models.specs import configure

ROOT = Path(__file__).resolve().parent.parent


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, help="safetensors checkpoint (HF tensor names)")
    ap.add_argument("--layers", type=int, help="encoder layers (default: the checkpoint's 22)")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    ap.add_argument("--pad", type=int, default=0, help="padded (masked) tokens at the end")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="other ModernBertConfig fields, e.g. hidden_size=64")
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
    try:
        config = configure(modernbert.ModernBertConfig(), overrides)
    except ValueError as e:
        ap.error(str(e))

    # 1. weights: a checkpoint, or the repo's seeded default, through the checked loader
    path = args.weights or default_weights("modernbert", modernbert, config, args.out,
                                           overrides)
    try:
        params = modernbert.load_params(path, config)
    except rockjit.WeightError as e:
        print(f"modernbert: WeightError: {e}", file=sys.stderr)
        return 1
    if not 0 <= args.pad < args.seq_len:
        ap.error(f"--pad must be in [0, --seq-len), got {args.pad}")
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (1, args.seq_len),
                                            dtype=np.int32)
    mask = np.ones((1, args.seq_len), np.int32)
    mask[:, args.seq_len - args.pad:] = 0
    real = args.seq_len - args.pad          # rows at padded positions are meaningless

    def encode(params, input_ids, attention_mask):
        return modernbert.forward(params, input_ids, attention_mask, config)

    # 2. compile: trace + lower to the NPU program (weights packed once, resident)
    t0 = time.perf_counter()
    model = rockjit.compile(encode, resident_argnums=0, backend=args.backend)
    compiled = model.lower(params, ids, mask).compile().build_program(params, ids, mask)
    t_compile = time.perf_counter() - t0

    # 3. run: the first call loads the program onto the device; then steady state
    t0 = time.perf_counter()
    hidden = compiled(params, ids, mask)
    t_first = time.perf_counter() - t0
    steady = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        compiled(params, ids, mask)
        steady.append(time.perf_counter() - t0)

    # 4. compare with JAX on the CPU
    ref = jax.jit(encode)(params, ids, mask)
    print(f"modernbert  {config.num_hidden_layers} layers, {args.seq_len} tokens "
          f"({args.pad} padded), weights {path}")
    print(f"compile     {t_compile:.2f} s")
    print(f"first call  {t_first:.3f} s")
    print(f"steady      {float(np.median(steady)):.4f} s per forward (median of {len(steady)})")
    print(f"cosine      last_hidden_state {cosine(hidden[:, :real], ref[:, :real]):.6f} "
          f"(unpadded rows)")
    st = compiled.stats()
    print("stats       " + ", ".join(f"{k}={st[k]}" for k in (
        "npu_ops", "host_ops", "jobs", "tasks", "host_steps", "macs", "cores_used")))
    ok = True
    if args.check_bound:
        from rockjit.oracle import tolerance as T
        b, = T.graph_bound(compiled.graph, compiled.params, [ids, mask])
        r = np.asarray(ref, np.float64)[:, :real]
        ratio = float(np.max(np.abs(np.asarray(hidden, np.float64)[:, :real] - r)
                             / (b[:, :real] + 2.0 ** -23 * np.abs(r))))
        print(f"bound       last_hidden_state: worst |ours - jax| / fp16 bound = {ratio:.3f}")
        ok = ratio <= 1.0

    # 5. save a bundle and run it back (no JAX needed on the loading side)
    bundle = args.out / "modernbert.rjb"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    compiled.save(str(bundle))
    t_save = time.perf_counter() - t0
    t0 = time.perf_counter()
    with rockjit.load(bundle, backend=args.backend) as b:
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        b_hidden = b(ids, mask)
        t_b = time.perf_counter() - t0
        same = np.array_equal(b_hidden, hidden)
    print(f"bundle      {bundle} {bundle.stat().st_size / 2**20:.1f} MiB, save {t_save:.2f} s, "
          f"load {t_load:.2f} s, first call {t_b:.3f} s, "
          f"{'bit-identical' if same else 'DIFFERS from the in-process run'}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
