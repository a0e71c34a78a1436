"""Flat-view element-wise / LUT programs as one job per byte range (issue 9): a softmax over
several heads runs its exp as several jobs that placement spreads over the cores, each job
every pass over its own range; ranges whose passes cross stay one job."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import rockjit
from graphs_testutil import check_bound
from rockjit.lowering.emitters.eltwise import flying_chunks, part_bounds
from rockjit.lowering.emitters.jobs import split_by_range
from rockjit.lowering.emitters.lut import activation_error, activation_table, build_activation
from rockjit.lowering.layouts import CubeLayout
from rockjit.lowering.regcmd import Access, EmittedTask, Reloc
from rockjit.oracle import tolerance as T
from test_eltwise_harness import P, needs_sim, run_program


def _task(name: str, reads: list[tuple[str, int, int]], writes: list[tuple[str, int, int]]
          ) -> EmittedTask:
    acc = [Access(b, lo, hi - lo, hi - lo) for b, lo, hi in (*reads, *writes)]
    relocs = {i: Reloc(a.buffer, a.offset) for i, a in enumerate(acc)}
    return EmittedTask(name, (), relocs, 0, True, reads=tuple(acc[:len(reads)]),
                       writes=tuple(acc[len(reads):]))


def test_ranges_split_in_pass_order_and_merge_where_passes_cross() -> None:
    lut = [_task(f"l{i}", [("x", lo, lo + 100)], [("g", lo, lo + 100)]) for i, lo in
           enumerate((0, 100, 200))]
    # pass 2 over each range reads only its own range of the scratch: three jobs
    sq = [_task(f"s{i}", [("g", lo, lo + 100)], [("out", lo, lo + 100)]) for i, lo in
          enumerate((0, 100, 200))]
    jobs = split_by_range([lut, sq], (100, 200), ("x",), ("out",))
    assert [[[t.name for t in k] for k in j.kicks] for j in jobs] == \
        [[["l0"], ["s0"]], [["l1"], ["s1"]], [["l2"], ["s2"]]]
    # the second range's pass 2 reads scratch bytes the first range's pass 1 writes: the two
    # must run in one job (in pass order); the third stays its own
    sq[1] = _task("s1", [("g", 50, 200)], [("out", 100, 200)])
    jobs = split_by_range([lut, sq], (100, 200), ("x",), ("out",))
    assert [[[t.name for t in k] for k in j.kicks] for j in jobs] == \
        [[["l0", "l1"], ["s0", "s1"]], [["l2"], ["s2"]]]


def test_flat_chunking_cuts_at_the_part_bounds() -> None:
    """Both passes of a two-pass activation (the LUT and the two-operand EW, each flying over
    the cube's bytes) must start a task at every bound and never cross one, for sizes that are
    not a multiple of anything, or the ranges would merge back into one job."""
    for nbytes in (96 * 1024, 300_016, 1_572_864 + 48, 4_512_000):
        bounds = part_bounds(nbytes, P, 3)
        assert len(bounds) == 2 and 0 < bounds[0] < bounds[1] < nbytes
        fly = flying_chunks(nbytes, P, bounds)
        runs = [(off, off + n * 16) for off, n in fly]
        assert runs[0][0] == 0 and runs[-1][1] == -(-nbytes // 16) * 16
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        assert set(bounds) <= {lo for lo, _ in runs}
        assert not any(lo < b < hi for lo, hi in runs for b in bounds)
        lay = CubeLayout(nbytes // 16, 1, 8, 8, np.float16) if nbytes % 16 == 0 else None
        if lay is not None:
            assert len(build_activation("gelu", lay, (-8.0, 8.0), P, parts=3).steps[0].jobs) == 3


@needs_sim
def test_exp_sq_over_three_parts_on_the_simulator() -> None:
    """Three heads of 48 x 64 scores: three jobs, each job's DMA inside its head's bytes, and
    the result equals numpy's exp within the stated table bound."""
    head = CubeLayout(48, 1, 64, 8, np.float16)
    flat = CubeLayout(3 * head.nbytes // 16, 1, 8, 8, np.float16)
    prog = build_activation("exp_sq", flat, (-16.0, 0.0), P, parts=3)
    assert part_bounds(flat.nbytes, P, 3) == (head.nbytes, 2 * head.nbytes)
    jobs = prog.steps[0].jobs
    assert len(jobs) == 3
    for j, job in enumerate(jobs):
        lo, hi = j * head.nbytes, (j + 1) * head.nbytes if j < 2 else prog.buffer("x").nbytes
        for k in job.kicks:
            for a in (*k.reads, *k.writes):
                if a.buffer in ("x", "gate", "out"):
                    assert lo <= a.offset and a.offset + a.extent <= hi, (j, a)
    rng = np.random.default_rng(91)
    x = (-rng.uniform(0, 16, (3, 48, 1, 64))).astype(np.float16)
    raw = np.zeros(prog.buffer("x").nbytes, np.uint8)
    raw[:flat.nbytes] = np.concatenate([head.pack(x[h]) for h in range(3)])
    mem = run_program(prog, {"x": raw})
    got = np.stack([head.unpack(mem["out"][h * head.nbytes:(h + 1) * head.nbytes])
                    for h in range(3)])
    t = activation_table("exp_sq", (-16.0, 0.0))
    ref = np.exp(np.clip(x.astype(np.float64), t.lo, t.hi))
    T.check(got, ref, T.lut_bound(ref, activation_error("exp_sq", x, (-16.0, 0.0))), "exp_sq")


def _heads(p, x):
    q = (x @ p["wq"]).reshape(48, 6, 32).transpose(1, 0, 2)
    k = (x @ p["wk"]).reshape(48, 6, 32).transpose(1, 0, 2)
    return jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k), axis=-1)


def _heads_on_the_simulator(seed: int):
    """_heads compiled for the simulator and checked against JAX on the CPU within the fp16
    bound; returns the loaded program."""
    rng = np.random.default_rng(seed)
    params = {n: (rng.standard_normal((192, 192)) / 14).astype(np.float32) for n in ("wq", "wk")}
    x = rng.standard_normal((48, 192)).astype(np.float32)
    f = rockjit.compile(_heads, resident_argnums=0, backend="sim")
    got = np.asarray(f(params, x), np.float64)
    c = f.compiled(params, x)
    ref = np.asarray(_heads(params, x), np.float64)      # JAX on CPU
    check_bound(got, ref, T.graph_bound(c.graph, c.params, [x])[0] + 2.0 ** -23 * np.abs(ref),
                "softmax over 6 heads")
    return c._runner.loaded_graph


@needs_sim
def test_softmax_over_heads_runs_its_exp_as_jobs_on_several_cores() -> None:
    prog = _heads_on_the_simulator(92)
    calls = prog.lowered.calls
    exp = [jr for st in prog.steps if st.kind == "npu" for jr in st.jobs
           if "exp" in str(calls[jr.call].node)]
    assert len(exp) == 6, [str(calls[jr.call].node) for jr in exp]
    assert len({jr.core for jr in exp}) > 1


def _residual_projection(p, x):
    return x + (x @ p["w"] + p["b"])


def test_a_residual_add_runs_on_its_matmuls_cores_in_its_step() -> None:
    """SigLIP-224's output projection and its residual add (196 x 768, 301 KB): the add's three
    ranges are the matmul's three 256-channel tiles, so each runs on the core whose job wrote
    its input, in the matmul's step (rules/eltwise_vectors.flat_parts; two ranges crossed the
    tiles and needed a step and copies of their own). Against JAX on the simulator."""
    from graphs_testutil import run_sim

    rng = np.random.default_rng(5)
    p = {"w": (rng.standard_normal((768, 768)) / 28).astype(np.float32),
         "b": rng.standard_normal(768).astype(np.float32) / 4}
    x = rng.standard_normal((196, 768)).astype(np.float32)
    got, ref, bound, st, _ = run_sim(_residual_projection, p, x)
    check_bound(got, ref, bound, "x + (x @ w + b)")
    assert st["npu_ops"] == 2 and st["npu_steps"] == 1, st


@needs_sim
def test_max_subtraction_joins_the_exp_step_head_by_head() -> None:
    """The softmax's max subtraction is one call per head; the first call's host pack of the
    row max (placed in front of it) once took a schedule group of its own, so head 0's job
    split off the others' step, the 5 left were dealt over the cores out of line with the exp's
    ranges, and the exp had to wait for a copy in a step of its own. Every head's subtraction
    must run in one step with the rest, on the core of the exp range that reads it, and the
    two ops must share an NPU step. Against JAX on the simulator."""
    prog = _heads_on_the_simulator(93)
    calls = prog.lowered.calls

    def jobs(op: str) -> list[tuple[int, int]]:
        return [(si, jr.core) for si, st in enumerate(prog.steps) if st.kind == "npu"
                for jr in st.jobs if f"= {op}" in str(calls[jr.call].node)]

    sub, exp = jobs("sub"), jobs("exp")
    assert len(sub) == 6 and len(exp) == 6, (sub, exp)
    assert len({si for si, _ in sub + exp}) == 1, (sub, exp)
    assert [c for _, c in sub] == [c for _, c in exp]
