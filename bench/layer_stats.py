"""Program.stats() of one SigLIP-B/16 encoder layer at 196 tokens (d=768, 12 heads, mlp 3072),
random weights, compiled through rockjit.compile(..., backend=...).

    python bench/layer_stats.py [--backend null|sim]

If the runtime cannot build the program (a host step kind it does not know yet), the script
prints the plan-level stats instead: the same lowering, schedule and memory plan, counted
without loading a runtime Program (marked "plan only").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rockjit  # noqa: E402
from models import siglip  # noqa: E402


class _RecordingBuilder:
    """Stands in for runtime.ProgramBuilder when the runtime refuses a step: accepts every
    call so the plan's counts can be taken (no execution)."""

    def __init__(self, device):
        self.n = 0

    def add_bo(self, *a, **k):
        self.n += 1
        return self.n - 1

    def upload(self, *a, **k): pass
    def write_words(self, *a, **k): pass
    def add_reloc(self, *a, **k): pass
    def add_npu_step(self, *a, **k): pass
    def add_host_step(self, *a, **k): pass

    def add_job(self, *a, **k):
        return 0

    def build(self):
        class _P:
            def stats(self):
                return {}
        return _P()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="null")
    ap.add_argument("--tokens", type=int, default=196)
    args = ap.parse_args()
    cfg = siglip.SiglipVisionConfig()
    rng = np.random.default_rng(0)
    shapes = {k: s for k, s in siglip.expected_shapes(cfg).items()
              if k.startswith("encoder.layers.0.")}
    params = {k: (rng.standard_normal(s) * (0.02 if len(s) > 1 else 0.1)).astype(np.float32)
              for k, s in shapes.items()}

    def layer(p, x):
        return siglip._encoder_layer(p, 0, x, cfg)

    x = rng.standard_normal((1, args.tokens, cfg.hidden_size)).astype(np.float32)
    f = rockjit.compile(layer, resident_argnums=0, backend=args.backend)
    c = f.compiled(params, x)
    from rockjit.lowering import backend as B
    from rockjit.lowering import program as P
    from rockjit.lowering.pipeline import lower_graph
    lowered = lower_graph(c.graph, c.params, example_inputs=[x])
    try:
        prog = P.NpuProgram(lowered, B._null() if args.backend == "null" else B._sim())
        prog.run([x])
        mode = f"built and run on backend={args.backend}"
    except Exception as e:  # the runtime refused the program: count the plan instead
        import rockjit.runtime as R
        real = R.ProgramBuilder
        R.ProgramBuilder = _RecordingBuilder
        try:
            lowered = lower_graph(c.graph, c.params, example_inputs=[x])
            prog = P.NpuProgram(lowered, None)
        finally:
            R.ProgramBuilder = real
        mode = f"plan only (runtime refused the program: {type(e).__name__}: {e})"
    print(f"SigLIP-B/16 encoder layer, {args.tokens} tokens: {mode}")
    for k, v in prog.stats().items():
        print(f"  {k:28s} {v}")
    print("\nwhere each op ran:")
    print(prog.report())


if __name__ == "__main__":
    main()
