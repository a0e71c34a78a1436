"""Shared helpers for the whole-graph simulator tests: compile with rockjit.compile(...,
backend="sim"), run on the strict SimDevice, compare with JAX on CPU under
tolerance.graph_bound (plus JAX's own float32 rounding of its result)."""
from __future__ import annotations

import numpy as np
import pytest

import rockjit
from rockjit.oracle import tolerance as T


def run_sim(fn, params, *xs):
    """Compile for the simulator, run, and return (result, JAX result, bound, stats, report)
    for the first output."""
    if params is None:
        f = rockjit.compile(fn, backend="sim")
        got = f(*xs)
        c = f.compiled(*xs)
        ref = fn(*xs)
    else:
        f = rockjit.compile(fn, resident_argnums=0, backend="sim")
        got = f(params, *xs)
        c = f.compiled(params, *xs)
        ref = fn(params, *xs)
    ref = np.asarray(ref, np.float64)
    bound = T.graph_bound(c.graph, c.params, list(xs))[0] + 2.0 ** -23 * np.abs(ref)
    return np.asarray(got), ref, bound, c.stats(), c._runner.report()


def run_poisoned(fn, params, *xs):
    """Compile and run ``fn`` on the simulator, then run it again after filling every arena
    byte of every core's context with 0xFF (fp16 NaN), except the buffers the plan declares
    zero-filled. Returns (second result, JAX result, bound). Bytes a program reads before it
    writes them, that no plan guarantees, show up as NaN."""
    f = rockjit.compile(fn, resident_argnums=0, backend="sim")
    f(params, *xs)
    c = f.compiled(params, *xs)
    prog = c._runner.loaded_graph
    poison = np.full(prog.arena_bytes, 0xFF, np.uint8)
    for arena, _, _ in prog.context_bos.values():
        prog.program.write(arena, poison)
        for b in prog.lowered.bufs:
            if b.kind == "arena" and b.zero:
                prog.program.write(arena, np.zeros(b.size, np.uint8), prog.plan.offsets[b.id])
    got = f(params, *xs)
    assert c._runner.loaded_graph is prog          # the same program ran on the poisoned arena
    ref = fn(params, *xs)
    bounds = T.graph_bound(c.graph, c.params, list(xs))
    if not isinstance(ref, (tuple, list)):
        got, ref = [got], [ref]
    refs = [np.asarray(r, np.float64) for r in ref]
    return ([np.asarray(g, np.float64) for g in got], refs,
            [b + 2.0 ** -23 * np.abs(r) for b, r in zip(bounds, refs)])


def check_bound(got, ref, bound, what):
    """Within the bound, and the bound can fail: a result with two rows swapped is rejected."""
    T.check(got, ref, bound, what)
    bad = np.array(got, np.float64)
    flat = bad.reshape(-1, bad.shape[-1])
    if flat.shape[0] > 1:
        flat[[0, 1]] = flat[[1, 0]]
        with pytest.raises(AssertionError):
            T.check(bad, ref, bound, what)


def assert_npu(report: str, *ops: str) -> None:
    """Each named op ran on the NPU (report lines: '%id = op  where  how ...')."""
    for op in ops:
        lines = [l for l in report.splitlines() if f"= {op}" in l]
        assert lines, f"no {op} in the program:\n{report}"
        assert all(" npu " in l for l in lines), f"{op} did not run on the NPU:\n{report}"


def small_siglip(hidden: int, heads: int, image: int, seed: int):
    """(fn, params, pixels): a 1-layer SigLIP of the given width, heads and image size (patch
    8, MLP twice the width), random weights near 0 with unit norm gains."""
    from models import siglip
    from models.specs import configure

    cfg = configure(siglip.SiglipVisionConfig(), {
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
        "num_attention_heads": heads, "image_size": image, "patch_size": 8})
    rng = np.random.default_rng(seed)
    gains = ("norm1.weight", "norm2.weight")
    params = {n: (rng.standard_normal(s) * 0.05 + (1.0 if n.endswith(gains) or
                                                    "layernorm.weight" in n else 0.0))
              .astype(np.float32) for n, s in sorted(siglip.expected_shapes(cfg).items())}
    pixels = rng.standard_normal((1, 3, image, image)).astype(np.float32)

    def fn(p, x):
        return siglip.forward(p, x, cfg)
    return fn, params, pixels
