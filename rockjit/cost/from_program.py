"""Adapter: rockjit's compiled ``LoadedGraph`` (rockjit/lowering/loaded_graph.py) -> the cost model's
plain ``description.CostProgram``. The only module of rockjit.cost that knows the compiler's types;
retarget it here when the program becomes a plain-data image.

What it reads, per schedule step (after lowering/coalesce.py: adjacent context-0 ops share one
NPU step, their jobs in order on core 0): every NPU step is one submit per context it uses, its
jobs on one context one after another; each of its jobs splits into the
runtime's jobs exactly as the program builds them (schedule.runtime_jobs: a self-chained kick is
one job of one kick, a run of single-task kicks is one job with one kick per task). A task's DMA
bytes are its kick's declared streams (regcmd.Access, what the registers make the hardware move)
shared evenly over the kick's tasks; a call's MACs (everything the MAC array runs,
``device_macs``) are shared evenly over the call's tasks; precision int8 for integer jobs, fp16
otherwise. Host steps carry the bytes the program's stats count for them (layout packs and
unpacks and host ops: "gather"); the cross-context copies the program inserts between steps
are "copy" steps of their own bytes, where the program runs them. Every host step carries the
threads the runtime runs it on (csrc/runtime/rj_host_pool.h: steps of at least 256 KiB split
over the runtime's threads, 3 on the board by default).
"""
from __future__ import annotations

from typing import Any

from .description import CostHostStep, CostJob, CostNpuStep, CostProgram, CostTask


def cost_jobs(job: Any, core: int, per_task_macs: float) -> list[CostJob]:
    """One scheduled ``op_lowering.NpuJob`` on ``core`` as the runtime's jobs (a self-chained
    kick is one job of one kick, a run of single-task kicks one job with a kick per task); a
    task's DMA bytes are its kick's declared streams shared evenly over the kick's tasks."""
    from ..lowering.schedule import runtime_jobs

    prec = "int8" if job.integer else "fp16"
    out: list[CostJob] = []
    for kicks, chained in runtime_jobs(job):
        tasks = []
        for k in kicks:
            n = max(1, k.task_number)
            rd = sum(a.nbytes for a in k.reads) / n
            wr = sum(a.nbytes for a in k.writes) / n
            tasks.extend(CostTask({prec: int(per_task_macs)}, int(rd), int(wr))
                         for _ in range(k.task_number))
        out.append(CostJob(core, tasks, kicks=1 if chained else len(tasks)))
    return out


def merged_jobs(jobs: list[CostJob], into: list[int] | None,
                chained: list[bool] | None = None) -> list[CostJob]:
    """``jobs`` (a step's runtime jobs in order) as submitted: ``into[i]``, the job that
    runtime job i went into (lowering/job_merge.py), ``chained[g]`` whether job g is one
    self-chained kick (default) or a kick per task (a job gathered from dependent ones)."""
    if into is None or len(set(into)) == len(jobs):
        return jobs
    parts: dict[int, list[CostJob]] = {}
    for j, g in zip(jobs, into):
        parts.setdefault(g, []).append(j)
    out = []
    for g, ps in sorted(parts.items()):
        if len(ps) == 1:
            out.append(ps[0])
            continue
        tasks = [t for p in ps for t in p.tasks]
        out.append(CostJob(ps[0].core, tasks,
                           kicks=1 if chained is None or chained[g] else len(tasks)))
    return out


def cost_jobs_once(cache: dict, job: Any, per_task_macs: float) -> tuple[CostJob, ...]:
    """``cost_jobs(job, 0, per_task_macs)``, remembered in ``cache`` by the job's identity (an
    image's layers share their jobs; frozen CostJobs; the cache holds the job, so its id is not
    reused meanwhile)."""
    key = (id(job), per_task_macs)
    if key not in cache:
        cache[key] = (tuple(cost_jobs(job, 0, per_task_macs)), job)
    return cache[key][0]


def describe(prog: Any, host_threads: int | None = None) -> CostProgram:
    """``prog``: a built ``rockjit.lowering.loaded_graph.LoadedGraph`` (its ImageBuilder's schedule
    and the image's static counts). Each host step is charged at the threads the runtime runs it
    on when ``host_threads`` are available (default: the runtime's default on the board,
    ``RJ_HOST_THREADS_DEFAULT``), as the runtime itself decides it
    (runtime/host_threads.py: rj_host_step_plan_threads). Steps are listed in the image's order,
    the cross-context copies where the program runs them, each with its own bytes."""
    from ..runtime.host_threads import (DEFAULT_HOST_THREADS, ImageUploads, descriptor_bytes_moved,
                                        image_host_threads, step_descriptor)

    calls = prog.lowered.calls
    ncores = max(1, prog.ncores)
    image = prog.image
    ups = ImageUploads(image)
    threads = image_host_threads(image, host_threads or DEFAULT_HOST_THREADS, ups)
    sched = iter(enumerate(prog.steps))
    # the runtime jobs the image builder linked into one kick (lowering/job_merge.py)
    # (``prog`` may be the ImageBuilder itself, as Compiled's manifest passes it)
    owner = prog if getattr(prog, "job_groups", None) else getattr(prog, "builder", None)
    groups = getattr(owner, "job_groups", None) or {}
    chained = getattr(owner, "job_chained", None) or {}
    steps: list = []
    for spec, thr in zip(image.steps, threads):
        if spec.kind == "host" and spec.source == -1:
            # a copy between contexts the image builder inserted (context_copies.py)
            nbytes = descriptor_bytes_moved(step_descriptor(ups, spec.host))
            steps.append(CostHostStep("copy", nbytes, "cross-context copy", thr))
            continue
        if spec.kind == "host" and spec.host.kind == "fused":
            # one step running the schedule's next ``steps`` host steps (lowering/host_fuse.py)
            parts = [next(sched)[1].host for _ in range(int(spec.host.params["steps"]))]
            steps.append(CostHostStep("gather", sum(int(hs.moved_bytes) for _, hs in parts),
                                      f"fused: {calls[parts[0][0]].node} .. "
                                      f"{calls[parts[-1][0]].node}", thr))
            continue
        si, st = next(sched)
        if (st.kind == "host") != (spec.kind == "host"):
            raise ValueError(f"rockjit.cost.describe: schedule step {si} ({st.kind}) does not "
                             f"match the image's step ({spec.kind}); the image and the "
                             f"schedule disagree")
        if st.kind == "host":
            ci, hs = st.host
            steps.append(CostHostStep("gather", int(hs.moved_bytes),
                                      f"{calls[ci].node}: {hs.kind}", thr))
            continue
        jobs: list[CostJob] = []
        nodes = []
        for jr in st.jobs:
            pc = calls[jr.call]
            nodes.append(pc.node)
            jobs.extend(cost_jobs(jr.job, jr.core % ncores, pc.call.lowering.macs_per_task))
        jobs = merged_jobs(jobs, groups.get(si), chained.get(si))
        label = ", ".join(dict.fromkeys(nodes))
        steps.append(CostNpuStep(jobs, label=f"step {si}: {label}"))
    return CostProgram(steps, name=prog.lowered.graph.name)
