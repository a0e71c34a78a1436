#!/usr/bin/env python3
"""rockjit's main job: compile one of the three encoders and run it, then check it against JAX.

    python examples/run_model.py                       # Whisper-tiny encoder on the simulator
    python examples/run_model.py --model siglip --weights siglip.safetensors
    python examples/run_model.py --model modernbert --seq-len 512
    python examples/run_model.py --model siglip --set image_size=512 num_hidden_layers=2
    python examples/run_model.py --backend interpreter   # the IR's numpy reference instead
    python examples/run_model.py --backend auto          # the NPU if /dev/accel/accel0 opens

Without --weights the model runs on the default that ships with the repo: weights drawn from a
fixed seed (so every run and every machine sees the same model), written once to a safetensors
file under out/ and then loaded through the same HF-name loader a real checkpoint goes through.
--set changes fields of the model's published config (as `rockjit trace ... name=value` does).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from rockjit.backends import BACKENDS
from rockjit.cli import parse_assignments
from models.harness import F32_ROUNDING, bound_ratio, max_rel_err, timed_calls
from models.presets import MODELS, default_weights

ROOT = Path(__file__).resolve().parent.parent
# The IR interpreter must match JAX on CPU to this relative error (issue 2's bound). The NPU
# backends are checked element by element against the end-to-end fp16 bound of the graph
# (rockjit.oracle.tolerance.graph_bound).
REL_TOL = 1e-5
# forwards timed after the first call (which loads the program onto the device)
STEADY_RUNS = 3


def _backend(name: str) -> str:
    """argparse type: a registered backend, or KIND:CHIP for a registered chip profile."""
    from rockjit.backends import resolve_backend

    try:
        resolve_backend(name)
    except Exception:
        raise argparse.ArgumentTypeError(
            f"unknown backend {name!r}; choose from {', '.join(sorted(BACKENDS))} "
            f"(or KIND:CHIP)") from None
    return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="whisper-tiny")
    ap.add_argument("--weights", type=Path, help="safetensors file with HF tensor names")
    ap.add_argument("--backend", default="sim", type=_backend,
                    help="where to run: " + ", ".join(sorted(BACKENDS)) + " (auto: the NPU "
                         "when /dev/accel/accel0 opens, else the simulator)")
    ap.add_argument("--cores", type=int, default=None,
                    help="NPU cores to lay the program out for (default: all of the chip's)")
    ap.add_argument("--seq-len", type=int, default=512,
                    help="tokens per sequence (ModernBERT only; the others have fixed inputs)")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="override fields of the model's config, e.g. num_hidden_layers=2")
    ap.add_argument("--out", type=Path, default=ROOT / "out",
                    help="where the default (seeded) weights are written")
    args = ap.parse_args(argv)
    if args.cores is not None and args.backend == "interpreter":
        ap.error("--cores chooses NPU cores; the interpreter runs on the CPU (drop --cores)")

    entry = MODELS[args.model]
    try:
        overrides = parse_assignments(args.set)
        config = entry.configure(overrides)
    except ValueError as e:  # a misspelt field or a value of the wrong type
        ap.error(str(e))
    weights = args.weights or default_weights(args.model, entry.module, config, args.out,
                                              overrides)
    try:
        params = entry.module.load_params(weights, config)
    except rockjit.WeightError as e:   # a missing file, a missing tensor, a wrong shape
        print(f"run_model: WeightError: {e}", file=sys.stderr)
        return 1
    inputs = entry.make_inputs(np.random.default_rng(1), config, args.seq_len)
    fn = entry.forward(config)
    npu = args.backend != "interpreter"

    compiled_fn = rockjit.compile(fn, resident_argnums=(0,), backend=args.backend,
                                  cores=args.cores)
    t0 = time.perf_counter()
    lowered = compiled_fn.lower(params, *inputs)   # jax trace + import + canonicalize/constfold
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()                   # binds the resident weights
    if npu:
        # the lowering proper: partition, emitters, memory plan, program image (from the graph and
        # the weights alone)
        compiled.build_program(params, *inputs)
    t_compile = time.perf_counter() - t0
    ours, t_first, steady = timed_calls(compiled, (params, *inputs), STEADY_RUNS if npu else 0)
    ours = jax.tree_util.tree_leaves(ours)

    want = jax.tree_util.tree_leaves(jax.jit(fn)(params, *(jnp.asarray(x) for x in inputs)))
    rels = [max_rel_err(o, w) for o, w in zip(ours, want)]
    n_ops = sum(compiled.graph.op_counts().values())
    print(f"model       {args.model}  (weights: {weights})")
    print("inputs      " + ", ".join(f"{x.dtype}{list(x.shape)}" for x in inputs))
    print(f"backend     {args.backend}")
    print(f"IR          {n_ops} ops")
    print(f"trace       {t_trace:.2f} s")
    print(f"compile     {t_compile:.2f} s" + (" (lowering to the NPU program image)" if npu
                                               else ""))
    if npu:
        print(f"first call  {t_first:.2f} s (program load onto the device + one forward)")
        print(f"steady      {float(np.median(steady)):.3f} s per forward (median of "
              f"{len(steady)})")
    else:
        print(f"run         {t_first:.2f} s")
    for i, (o, rel) in enumerate(zip(ours, rels)):
        print(f"output {i}    {tuple(o.shape)} {o.dtype}: "
              f"max |ours - jax| / max |jax| = {rel:.3e}")
    if args.backend == "interpreter":
        return 0 if len(ours) == len(want) and max(rels) <= REL_TOL else 1
    # an NPU backend computes in fp16: hold it to the graph's end-to-end error bound
    from rockjit.oracle import tolerance as T
    ok = len(ours) == len(want)
    if args.backend != "null":
        t0 = time.perf_counter()
        bounds = T.graph_bound(compiled.graph, compiled.params, list(inputs))
        t_bound = time.perf_counter() - t0
        print(f"bound       {t_bound:.2f} s (tolerance.graph_bound, float64 on the host)")
        for i, (o, w, b) in enumerate(zip(ours, want, bounds)):
            w64 = np.asarray(w, np.float64)
            ratio = bound_ratio(o, w, b)
            b = b + F32_ROUNDING * np.abs(w64)   # as bound_ratio widens it
            print(f"output {i}    fp16 bound: max {float(np.max(b)) / np.max(np.abs(w64)):.3e} "
                  f"of max |jax|")
            print(f"output {i}    worst |ours - jax| / fp16 bound = {ratio:.3f} "
                  f"({'within' if ratio <= 1 else 'OUT OF'} the bound, tolerance.graph_bound)")
            ok = ok and ratio <= 1
    st = compiled.stats()
    print("stats       " + ", ".join(f"{k}={st[k]}" for k in (
        "jobs", "tasks", "kicks", "host_steps", "host_bytes_packed", "host_bytes_unpacked",
        "host_bytes_copied", "device_bytes_read", "device_bytes_written", "macs", "cores_used")
        if k in st))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
