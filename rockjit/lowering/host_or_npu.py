"""Host or NPU for an op both can run, by modelled cost (rockjit.cost, calibrated constants).

Partition's rule is "the NPU when it has a form" (partition.py). For an op that also has a
host rule this module models both sides, including the re-tiles each side implies at its
boundary, and the partition moves the op to the host only where the host is cheaper:

    NPU  = the rule's NPU steps (one submit each + its jobs, kicks, DMA, MACs) + its own host
           steps + a pack (row-major -> cube) of every run-time input held only row-major
    host = an unpack (cube -> row-major) of every run-time input held only as a cube + the
           op's bytes (inputs and output, row-major) + a pack of its output

all host bytes at the host's gather rate (``Constants.host_gather_gbps``: layout packs and
element-wise loops are strided and index-bound). The host side is charged a pack of its output
because the consumers are not lowered yet and most are NPU ops; the NPU side is not charged an
unpack of its output for the same reason: an op in the middle of an NPU chain stays there.
The comparison is made only for one-row ops (every run-time input and the output hold one row:
all dimensions but the last are 1, e.g. a pooling head's LayerNorm over its one token), where
each NPU step costs a submit, a job and a kick for a few hundred bytes of work and the boundary
re-tiles the model has to guess (the consumers are not lowered yet) are a few hundred bytes
too. Elsewhere a wrong guess of the re-tiles could cost more than the model saves, so the rule
(the NPU when it has a form) stays.
"""
from __future__ import annotations

from typing import Sequence

from .. import cost
from ..cost import CostHostStep, CostNpuStep, CostProgram, Constants
from ..ir.graph import Node, Value
from .op_lowering import HostStep, NpuStep
from .rules.base import CubeForm, OpCall, RowForm, RuleContext

FP16 = 2   # bytes per element of a cube (the NPU's float form)


def _value_bytes(v: Value) -> int:
    return v.type.size * v.type.dtype.to_numpy().itemsize


def _held(ctx: RuleContext, v: Value, kind: type) -> bool:
    return any(isinstance(f, kind) for f in ctx.forms(v))


def _runtime_inputs(ctx: RuleContext) -> list[Value]:
    return [v for v in dict.fromkeys(ctx.node.inputs) if v.id not in ctx.consts]


def npu_program(ctx: RuleContext, calls: Sequence[OpCall]) -> CostProgram:
    from ..cost.from_program import cost_jobs

    steps: list = [CostHostStep("gather", v.type.size * FP16, f"pack %{v.id}")
                   for v in _runtime_inputs(ctx)
                   if _held(ctx, v, RowForm) and not _held(ctx, v, CubeForm)]
    for call in calls:
        prog = call.lowering
        for st in prog.steps:
            if isinstance(st, NpuStep):
                steps.append(CostNpuStep([cj for j in st.jobs
                                          for cj in cost_jobs(j, 0, prog.macs_per_task)]))
            elif isinstance(st, HostStep):
                steps.append(CostHostStep("gather", int(st.moved_bytes), st.kind))
    return CostProgram(steps, name=f"%{ctx.node.out.id} on the NPU")


def host_program(ctx: RuleContext) -> CostProgram:
    node: Node = ctx.node
    steps = [CostHostStep("gather", v.type.size * FP16, f"unpack %{v.id}")
             for v in _runtime_inputs(ctx)
             if _held(ctx, v, CubeForm) and not _held(ctx, v, RowForm)]
    op_bytes = sum(_value_bytes(v) for v in node.inputs) + _value_bytes(node.out)
    steps.append(CostHostStep("gather", op_bytes, node.op.text))
    steps.append(CostHostStep("gather", node.out.type.size * FP16, f"pack %{node.out.id}"))
    return CostProgram(steps, name=f"%{node.out.id} on the host")


def _one_row(v: Value) -> bool:
    shape = v.type.shape
    return v.type.size == (shape[-1] if shape else 1)


def host_is_cheaper(ctx: RuleContext, calls: Sequence[OpCall],
                    constants: Constants | None = None) -> tuple[bool, str]:
    """(the host is cheaper, what was compared); (False, "") where no comparison is made."""
    npu = [c for c in calls if c.where == "npu"]
    if not npu or not all(_one_row(v) for v in (*_runtime_inputs(ctx), ctx.node.out)):
        return False, ""
    c = constants or cost.calibrated()
    n_ms = cost.estimate(npu_program(ctx, npu), constants=c).ms
    h_ms = cost.estimate(host_program(ctx), constants=c).ms
    return h_ms < n_ms, (f"modelled host {h_ms * 1e3:.1f} us {'<' if h_ms < n_ms else '>='} "
                         f"NPU {n_ms * 1e3:.1f} us (rockjit.cost, with the re-tiles)")


def cheapest(ctx: RuleContext, options: Sequence[tuple[str, Sequence[OpCall]]],
             constants: Constants | None = None) -> tuple[int, str]:
    """(index of the modelled-cheapest of several (name, calls) ways a rule can lower its node,
    what was compared). Each way is costed as it is built (its NPU steps, its host steps at the bytes
    they move, a pack of every run-time input held only row-major), for a rule whose ways all
    read the same operands and write the same result form (the row max: PPU + host tail, or
    the host alone), so no boundary re-tile has to be guessed."""
    c = constants or cost.calibrated()
    ms = []
    for _, calls in options:
        prog = npu_program(ctx, calls)
        if not any(call.where == "npu" for call in calls):
            # host steps read a row-major or cube operand in place: no pack
            prog = CostProgram([s for s in prog.steps if not (isinstance(s, CostHostStep) and
                                                             s.label.startswith("pack %"))],
                               name=prog.name)
        ms.append(cost.estimate(prog, constants=c).ms)
    best = min(range(len(ms)), key=ms.__getitem__)
    return best, ("modelled " + ", ".join(f"{name} {m * 1e3:.1f} us" for (name, _), m
                                          in zip(options, ms)) +
                  f": {options[best][0]} (rockjit.cost)")
