"""Partition: each IR node becomes NPU work (a LOWER_RULES rule -> emitter calls or a view) or
host work (a HOST_RULES rule -> host steps), never silently.

Order of preference, per node:
  1. the NPU rule, if the op has one and the rule finds a legal form at this node's shapes and
     dtypes (floats run as fp16 with fp32 accumulation; int8 stays int8);
  2. the host rule, when the NPU has no form (the rule raised NoNpuForm, or the op has no NPU
     rule): the row max / 1/sum / rsqrt tails, gathers, strided transforms, f32 math; or when
     both have one and the cost model says the host is cheaper (host_or_npu.py: a one-row op
     whose NPU steps cost a submit each for a few hundred bytes);
  3. otherwise ``UnsupportedError`` naming the op, its source line and why each side refused.

Every decision is recorded (``Decision``) so a program can report where each op ran and why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .. import debugflags
from ..errors import UnsupportedError
from ..ir.graph import Node
from ..ir.ops import Op
from .compile_cache import memo, plain_key
from .op_lowering import OpLowering
from .rules import LOWER_RULES
from .rules.base import NoNpuForm, OpCall, RuleContext, RuleResult, Use


@dataclass(frozen=True)
class Decision:
    node: str          # "%id = op"
    loc: str
    where: str         # "npu" | "host" | "view" | "const"
    how: str           # emitter / host rule / view
    why: str = ""      # why the NPU refused, for host decisions


def host_rules() -> dict[Op, Callable]:
    """The host-op library's registry (rockjit/lowering/host_rules.py, and the expanding rules
    of host_expand.py), empty until present."""
    try:
        from . import host_rules as hr
        from .host_expand import EXPANDED_RULES
    except ImportError:
        return {}
    return {**getattr(hr, "HOST_RULES", {}), **EXPANDED_RULES}


def host_rule(op: Op) -> Callable | None:
    """``host_rules().get(op)`` without merging the registries into a new dict or importing
    them again: asked for every node the lowering places (~3% of its own time on ModernBERT
    x22). The registries themselves are kept, so a rule added to one later is seen."""
    if not _REGISTRIES:
        try:
            from . import host_rules as hr
            from .host_expand import EXPANDED_RULES
        except ImportError:
            return None
        _REGISTRIES.extend((EXPANDED_RULES, getattr(hr, "HOST_RULES", {})))
    for registry in _REGISTRIES:
        rule = registry.get(op)
        if rule is not None:
            return rule
    return None


_REGISTRIES: list[Mapping[Op, Callable]] = []     # host_rule: EXPANDED_RULES, HOST_RULES


def _op_names(registry: Mapping) -> str:
    return ", ".join(sorted(op.text for op in registry)) or "none"


def _where(node: Node) -> str:
    return f"{node.loc}" if node.loc else "<unknown location>"


def host_result(node: Node, ctx: RuleContext, why: str) -> RuleResult:
    """The node on the host: the host rule's OpLowering binds input i to ``node.inputs[i]`` and
    output 0 to the node's result, both row-major in their IR dtype."""
    rule = host_rule(node.op)
    if rule is None:
        raise UnsupportedError(
            f"{node.op.text} (%{node.out.id} : {node.out.type}) at {_where(node)} cannot be "
            f"compiled: no NPU form ({why}) and no host implementation of {node.op.text!r} "
            f"exists. Rewrite this line with ops that have an NPU rule "
            f"(rockjit.lowering.rules.LOWER_RULES: {_op_names(LOWER_RULES)}) or a host rule "
            f"(rockjit.lowering.host_rules.HOST_RULES: {_op_names(host_rules())}), or run it "
            f"outside the compiled function.")
    from .host_broadcast import binary_over_sources, broadcast_sources

    sources = broadcast_sources(node, ctx)
    if sources is not None:
        prog = binary_over_sources(node, sources)
        return RuleResult([OpCall(prog, tuple(Use(v) for v, _ in sources), (Use(node.out),),
                                  label=node.op.text, where="host",
                                  emitter=f"host_rules[{node.op.text}] (broadcast read in place)")],
                          note=why)
    try:
        prog = _host_program(rule, node)
    except NoNpuForm as e:
        raise UnsupportedError(f"{node.op.text} at {_where(node)}: no NPU form ({why}) and the "
                               f"host rule refused too ({e})") from None
    if not isinstance(prog, OpLowering):
        raise TypeError(f"host rule for {node.op.text} returned {type(prog).__name__}, not an "
                        f"OpLowering")
    return RuleResult([OpCall(prog, tuple(Use(v) for v in node.inputs), (Use(node.out),),
                              label=node.op.text, where="host",
                              emitter=f"host_rules[{node.op.text}]")], note=why)


def _host_program(rule: Callable[[Node], OpLowering], node: Node) -> OpLowering:
    """``rule(node)``, built once per compile for each structure: a host rule reads the node's
    op, attributes and value types only (host_rules.py, host_expand.py), and the layers of an
    encoder repeat the same host ops (compile_cache.py)."""
    attrs = plain_key(tuple(sorted(node.attrs.items())))
    if attrs is None:
        return rule(node)
    key = ("host_rule", node.op, f"{rule.__module__}.{rule.__qualname__}", attrs,
           tuple((v.type.dtype, v.type.shape) for v in node.inputs),
           tuple((v.type.dtype, v.type.shape) for v in node.outputs))
    return memo(key, lambda: rule(node))


def lower_node(ctx: RuleContext) -> tuple[RuleResult, str]:
    """(rule result, why the NPU refused or '')."""
    node = ctx.node
    rule = LOWER_RULES.get(node.op)
    if rule is None:
        why = f"the NPU has no {node.op.text} operation"
    else:
        try:
            res = rule(ctx)
        except NoNpuForm as e:
            why = str(e)
        else:
            return _cheaper_side(ctx, res)
    return host_result(node, ctx, why), why


def _cheaper_side(ctx: RuleContext, res: RuleResult) -> tuple[RuleResult, str]:
    """The NPU rule's result, or the host rule's where the cost model says the host is cheaper
    (host_or_npu.py); a host rule that refuses the node leaves it on the NPU."""
    if res.view is not None or host_rule(ctx.node.op) is None or \
            debugflags.enabled(debugflags.NPU_FIRST.name):
        return res, ""
    from .host_or_npu import host_is_cheaper

    cheaper, why = host_is_cheaper(ctx, res.calls)
    if not cheaper:
        return res, ""
    try:
        return host_result(ctx.node, ctx, why), why
    except UnsupportedError:
        return res, ""
