"""The counts a program image carries (``ProgramImage.stats``, ``Program.stats()``): steps, jobs,
tasks and kicks, host steps and host bytes (packs, unpacks, cross-context copies), re-tiles,
device DMA bytes, useful and device MACs, arena and resident sizes, op placement, the core
placement's choices, and the range plan's counts."""
from __future__ import annotations

from typing import Any


def program_stats(b: Any) -> dict[str, int]:
    """``b``: an ImageBuilder after its step walk (image_builder.py)."""
    n, calls, decisions = b._count, b.calls, b.lowered.decisions
    tiles = [t for pc in calls if pc.call.where == "npu" for t in pc.call.lowering.tile_choices]
    useful = sum(pc.call.lowering.macs for pc in calls if pc.call.where == "npu"
                 and pc.call.emitter.startswith(("matmul", "conv")))
    stats = {
        "npu_steps": n["npu_steps"], "jobs": n["jobs"], "tasks": n["tasks"],
        "kicks": n["kicks"], "host_steps": n["host"], "host_bytes_packed": n["packed"],
        "host_bytes_unpacked": n["unpacked"], "host_copy_steps": n["copy_steps"],
        "host_bytes_copied": n["copied"], "retiles": b.lowered.retiles - b.folded_packs,
        # host_fuse.py: steps running several host ops, and the ops inside them
        "host_fused_steps": n.get("fused_steps", 0), "host_fused_ops": n.get("fused_ops", 0),
        "device_bytes_read": n["dev_read"], "device_bytes_written": n["dev_written"],
        "macs": useful,
        "device_macs": sum(pc.call.lowering.macs for pc in calls if pc.call.where == "npu"),
        "arena_bytes": b.plan.size, "arena_bytes_without_reuse": b.plan.naive_size,
        "weights_bytes": b.weights_bytes, "regcmd_bytes": b.regcmd_bytes,
        "npu_ops": sum(1 for d in decisions if d.where == "npu"),
        "host_ops": sum(1 for d in decisions if d.where == "host"),
        "view_ops": sum(1 for d in decisions if d.where == "view"),
        "cores_used": len(set(b.job_cores)),
        # placement.py: steps whose jobs could spread, and how many the model kept on
        # fewer cores than the round-robin rule
        "placement_steps": len(b.core_choices),
        "placement_single_core_steps": sum(1 for c in b.core_choices if c.cores == 1),
        "placement_rule_overruled": sum(1 for c in b.core_choices if not c.agrees),
        # tile_choice.py: conv/matmul tilings, and how many the cost model chose over the rule
        "tile_plans": len(tiles),
        "tile_rule_overruled": sum(1 for t in tiles if not t.agrees),
    }
    for c in range(b.ncores):
        stats[f"jobs_core{c}"] = sum(1 for x in b.job_cores if x == c)
    # numerics: how many values the range plan prescaled / keeps in fp32 / on the host
    if b.lowered.range_plan is not None:
        stats.update(b.lowered.range_plan.counts())
    return {k: int(v) for k, v in stats.items()}

