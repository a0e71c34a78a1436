"""Core placement by modelled cost (rockjit/lowering/placement.py).

The expected choices are computed here from the cost model's constants with the model's
published formula written out (cost/model.py docstring: a step is one submit per core used +
the slowest core's jobs, kicks, DMA and MACs; a host copy is bytes at the host copy rate), not
by calling the model. The sim test checks that a step the model keeps on fewer cores than the
round-robin rule computes the same bits as one core and the numpy result within tolerance.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import rockjit
from graphs_testutil import run_sim
from rockjit import cost
from rockjit.cost import CostJob, CostTask
from rockjit.lowering.loaded_graph import LoadedGraph
from rockjit.lowering.pipeline import lower_graph
from rockjit.lowering.placement import StepJob, choose
from rockjit.oracle import tolerance as T
from rockjit.runtime import SimDevice
from rockjit.runtime.image import ProgramImage

CLOCK_MHZ = 600.0   # the cost model's default clock, which placement uses


def _job(macs: int, dma: int, run_base: int, run_bytes: int) -> StepJob:
    """One single-task, single-kick job: ``dma`` bytes read, as much written; its arena runs
    are one read and one write run of ``run_bytes``."""
    return StepJob((CostJob(0, [CostTask({"fp16": macs}, dma, dma)], kicks=1),),
                   ((run_base, 1, 0, run_bytes),), ((run_base + run_bytes, 1, 0, run_bytes),))


def _expected(c: cost.Constants, njobs: int, cores: int, macs: int, dma: int,
              run_bytes: int) -> int:
    """Cheapest k by the model's formula, jobs dealt round-robin, the fewest cores on a tie."""
    # one kick, and one CBUF fill (the task reads its operands)
    per_job_s = ((c.job_us + c.kick_us + c.fill_us) * 1e-6 + 2 * dma / (c.dma_gbps * 1e9)
                 + macs / (c.macs_per_cycle["fp16"] * CLOCK_MHZ * 1e6))
    best = None
    for k in range(1, min(cores, njobs) + 1):
        slowest = -(-njobs // k)                       # jobs on core 0
        off_core0 = njobs - slowest if k > 1 else 0    # jobs whose runs cross contexts
        t = (k * c.submit_us * 1e-6 + slowest * per_job_s
             + off_core0 * 2 * run_bytes / (c.host_copy_gbps * 1e9))
        if best is None or t < best[0] - 1e-15:
            best = (t, k)
    return best[1]


def test_tiny_step_stays_on_one_core() -> None:
    # keep-attached kernel (no per-job IOMMU cost): a tiny job costs less than another submit
    # and the host copies of its 64 KB operand to the second context
    c = cost.calibrated().keep_attached()
    run = 65536
    jobs = [_job(1024, 512, 4 * run * i, run) for i in range(2)]
    want = _expected(c, 2, 3, 1024, 512, run)
    assert want == 1
    got = choose(jobs, 3, constants=c)
    assert got.cores == want and not got.agrees and got.rule_cores == 2
    assert got.copy_bytes == {1: 0, 2: 2 * run}
    assert got.modelled_ms[1] < got.modelled_ms[2]


def test_large_step_spreads_over_every_core() -> None:
    c = cost.calibrated()
    macs, dma, run = 50_000_000, 400_000, 300_000
    jobs = [_job(macs, dma, i * 2 * run, run) for i in range(3)]
    want = _expected(c, 3, 3, macs, dma, run)
    assert want == 3
    got = choose(jobs, 3, constants=c)
    assert got.cores == 3 and got.agrees
    assert got.copy_bytes[3] == 2 * 2 * run


def test_four_jobs_take_two_cores_not_three() -> None:
    # 4 jobs over 3 cores leave 2 on core 0 either way: the third submit and its copies buy
    # nothing, so the model keeps 2 cores where round-robin would use 3
    c = cost.calibrated()
    macs, dma, run = 20_000_000, 200_000, 100_000
    jobs = [_job(macs, dma, i * 2 * run, run) for i in range(4)]
    want = _expected(c, 4, 3, macs, dma, run)
    assert want == 2
    got = choose(jobs, 3, constants=c)
    assert got.cores == want and got.rule_cores == 3 and not got.agrees


def test_overruled_step_computes_the_same_on_the_simulator() -> None:
    # four independent products (a batch of 4, one tile each: no CBUF reuse can join them,
    # emitters/reuse.py): steps of 4 independent jobs
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((4, 512, 256)) / 32).astype(np.float32)
    x = rng.standard_normal((4, 40, 512)).astype(np.float32)

    def fn(w, x):
        return jnp.tanh(jnp.matmul(x, w))

    comp = rockjit.compile(fn, resident_argnums=0).compiled(w, x)
    one, three = SimDevice(cores=1), SimDevice(cores=3)
    try:
        p1 = LoadedGraph(lower_graph(comp.graph, comp.params), one)
        p3 = LoadedGraph(lower_graph(comp.graph, comp.params), three)
        choices = p3.builder.core_choices
        assert [(ch.jobs, ch.cores, ch.rule_cores) for ch in choices] == [(4, 2, 3)] * 2
        s3 = p3.stats()
        assert s3["placement_steps"] == 2 and s3["placement_rule_overruled"] == 2
        assert s3["cores_used"] == 2 and s3["jobs_core2"] == 0
        # the record travels with the image (bundles, ``rockjit inspect``)
        img = p3.image
        back = ProgramImage.from_json(img.to_json(), img.arrays).core_placement
        assert back == img.core_placement and back[0].cores == 2 and "overruled" in back[0].why
        y1, = p1.run([x])
        y3, = p3.run([x])
        assert np.array_equal(y1, y3)
        ref = np.tanh(np.matmul(x.astype(np.float64), w.astype(np.float64)))
        T.check(y3, ref, T.graph_bound(comp.graph, comp.params, [x])[0]
                + 2.0 ** -23 * np.abs(ref), "4 products on 2 of 3 contexts")
    finally:
        one.close()
        three.close()


# ---------------------------------------------------------------------------------------------
# host or NPU for one-row ops (rockjit/lowering/host_or_npu.py)
# ---------------------------------------------------------------------------------------------

def _mul_add(x, y):
    return x * y + y


def _where(report: str, op: str) -> list[str]:
    return [ln.split()[3] for ln in report.splitlines() if f"= {op} " in ln]


def test_one_row_op_runs_on_the_host_where_the_model_says_it_is_cheaper(monkeypatch) -> None:
    n = 512
    rng = np.random.default_rng(11)
    c = cost.calibrated()
    # the host side as the module charges it, written out: a row-major f32 op reading two
    # inputs and writing one (the graph's inputs are row-major already), then a pack of its
    # output to an fp16 cube; every NPU step costs at least a submit, a job and a kick
    host_s = (3 * n * 4 + n * 2) / (c.host_gather_gbps * 1e9)
    npu_floor_s = (c.submit_us + c.job_us + c.kick_us) * 1e-6
    assert host_s < npu_floor_s
    x, y = (rng.standard_normal((1, n)).astype(np.float32) for _ in range(2))
    got, ref, bound, _, rep = run_sim(_mul_add, None, x, y)
    T.check(got, ref, bound, "one-row mul + add on the host")
    assert _where(rep, "mul") == ["host"] and _where(rep, "add") == ["host"], rep
    assert "modelled host" in rep
    # the same graph at 64 rows: no comparison, the rule (NPU) stays
    xs, ys = (rng.standard_normal((64, n)).astype(np.float32) for _ in range(2))
    got, ref, bound, _, rep = run_sim(_mul_add, None, xs, ys)
    T.check(got, ref, bound, "64-row mul + add on the NPU")
    assert "modelled host" not in rep and _where(rep, "mul") == ["npu"], rep
    # and the switch that keeps the rule at one row
    monkeypatch.setenv("ROCKJIT_NPU_FIRST", "1")
    got, ref, bound, _, rep = run_sim(_mul_add, None, x, y)
    T.check(got, ref, bound, "one-row mul + add on the NPU")
    assert _where(rep, "mul") == ["npu"], rep
