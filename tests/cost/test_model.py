"""The model's arithmetic against hand-computed expectations with explicit constants."""
from __future__ import annotations

import pytest

from rockjit.cost import Constants, CostHostStep, CostJob, CostNpuStep, CostProgram, CostTask, estimate

C = Constants(submit_us=20.0, job_us=10.0, kick_us=5.0, dma_gbps=2.0, host_gather_gbps=1.0,
              host_copy_gbps=10.0, macs_per_cycle={"fp16": 512, "int8": 1024})


def test_one_job_by_hand():
    t = CostTask({"fp16": 512 * 600_000}, dma_read=1_000_000, dma_written=1_000_000)
    p = CostProgram([CostNpuStep([CostJob(0, [t, t], kicks=2)])])
    e = estimate(p, 600, C)
    # submit 20 + job 10 + 2 kicks x 5 = 40 us; DMA 4 MB / 2 GB/s = 2 ms;
    # MACs: 2 x 512*600e3 at 512 x 600e6 per s = 2 ms
    assert e.ms == pytest.approx(0.040 + 2.0 + 2.0)
    assert e.bucket_ms() == pytest.approx({"dispatch": 0.040, "dma": 2.0, "mac": 2.0, "host": 0})
    assert e.label == "modelled"


def test_cores_run_side_by_side_and_the_slowest_counts():
    big = CostTask({}, dma_read=2_000_000)
    small = CostTask({}, dma_read=1_000_000)
    p = CostProgram([CostNpuStep([CostJob(0, [big], 1), CostJob(1, [small], 1), CostJob(1, [small], 1)])])
    # two submits (one per core); core 0: 10+5 us + 1 ms; core 1: 2 x (10+5) us + 1 ms -> core 1
    assert estimate(p, 600, C).ms == pytest.approx(2 * 0.020 + 0.030 + 1.0)
    one_core = CostProgram([CostNpuStep([CostJob(0, [big], 1), CostJob(0, [small], 1),
                                          CostJob(0, [small], 1)])])
    assert estimate(one_core, 600, C).ms == pytest.approx(0.020 + 0.045 + 2.0)


def test_chaining_saves_kicks_and_clock_scales_macs():
    ts = [CostTask({"int8": 1024 * 1_000_000})] * 8
    unchained = CostProgram([CostNpuStep([CostJob(0, ts, kicks=8)])])
    chained = CostProgram([CostNpuStep([CostJob(0, ts, kicks=1)])])
    assert estimate(unchained, 1000, C).ms - estimate(chained, 1000, C).ms == pytest.approx(0.035)
    mac_ms = lambda mhz: estimate(chained, mhz, C).bucket_ms()["mac"]
    assert mac_ms(1000) == pytest.approx(8.0)
    assert mac_ms(500) == pytest.approx(16.0)


def test_host_steps_by_kind_and_threads():
    p = CostProgram([CostHostStep("gather", 3_000_000), CostHostStep("copy", 10_000_000),
                 CostHostStep("gather", 3_000_000, threads=3)])
    assert estimate(p, 600, C).ms == pytest.approx(3.0 + 1.0 + 1.0)


def test_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="no MAC rate for precision 'int4'"):
        estimate(CostProgram([CostNpuStep([CostJob(0, [CostTask({"int4": 1})], 1)])]), 600, C)
    with pytest.raises(ValueError, match="cannot take 3 kick"):
        CostJob(0, [CostTask()], kicks=3)
    with pytest.raises(ValueError, match="host step kind 'memcpy'"):
        CostHostStep("memcpy", 1)
    with pytest.raises(ValueError, match="clock must be positive"):
        estimate(CostProgram([]), 0, C)


def test_keep_attached_drops_the_per_job_cost():
    p = CostProgram([CostNpuStep([CostJob(0, [CostTask()], 1), CostJob(0, [CostTask()], 1)])])
    assert estimate(p, 600, C).ms - estimate(p, 600, C.keep_attached()).ms == pytest.approx(0.020)
