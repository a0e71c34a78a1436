"""``rockjit check``: where in a model does the compiled program lose accuracy?

For a compiled function and one input, the graph's nodes are cut into groups, each group's
last value is made an extra output of the same graph, and that graph runs twice: on the
compiled function's backend (the NPU program, built by the same lowering rules, so every op
computes what it computes in the original program) and on the fp32 IR interpreter (the
reference meaning of the IR). Per group the report gives the cosine and the max relative error
(max |npu - ref| / max |ref|) of the group's value, both values' ranges, and what the range
plan did there (``range_plan`` records of the program, when the compiler has one: value, op,
source line, bound, action; "n/a" otherwise), and names the first group whose cosine falls
under the threshold.

Groups (``by``):

* ``"norm"``: the residual stream -- a cut at every value that feeds a LayerNorm (a value ``x``
  with ``x - broadcast(mean(x))``, mean a reduce_sum scaled by a constant). A transformer layer
  is then two groups (attention, MLP), each ending at the residual add that the next norm reads.
* ``"line"``: one group per user source line (nodes in graph order; a line that recurs after
  other lines starts a new group).
* ``"auto"`` (default): ``"norm"`` when the graph has at least two norm inputs, else ``"line"``.

The report is text (``str(report)``) or one self-contained HTML page with an inline SVG plot of
the error per group (``report.html()``; no external assets).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import InputRangeError
from .ir.graph import Graph, Node, Value
from .ir.ops import Op

DEFAULT_THRESHOLD = 0.999     # cosine; fp16 programs of the encoders sit above 0.9999

_THROUGH = (Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.CONVERT, Op.MUL, Op.DIV)


@dataclass
class LineGroup:
    index: int
    name: str                       # e.g. "models/whisper.py:113-120" or "stem"
    value: Value                    # the group's last value: what is compared
    nodes: list[Node]
    lines: list[str]                # distinct source lines, in order
    cosine: float = math.nan
    max_rel_err: float = math.nan
    ref_range: tuple[float, float] = (math.nan, math.nan)
    npu_range: tuple[float, float] = (math.nan, math.nan)
    range_plan: str = "n/a"
    finite: bool = True


@dataclass
class CheckReport:
    function: str
    backend: str
    threshold: float
    by: str
    groups: list[LineGroup] = field(default_factory=list)
    plan_available: bool = False

    @property
    def first_under(self) -> LineGroup | None:
        """The first group whose cosine is under the threshold (or whose NPU value is not
        finite), None when every group passes."""
        for g in self.groups:
            if not g.finite or not g.cosine >= self.threshold:
                return g
        return None

    def __str__(self) -> str:
        head = (f"rockjit check: {self.function} on {self.backend} vs the fp32 interpreter, "
                f"{len(self.groups)} groups by {self.by}, threshold cosine >= {self.threshold}")
        cols = f"{'#':>3}  {'group':<34} {'value':<8} {'ops':>4} {'cosine':>10} {'max rel':>9}  " \
               f"{'ref range':<22} {'npu range':<22} range plan"
        rows = [head, cols]
        for g in self.groups:
            rows.append(f"{g.index:>3}  {_clip(g.name, 34):<34} {'%' + str(g.value.id):<8} "
                        f"{len(g.nodes):>4} {_fmt_cos(g.cosine):>10} {g.max_rel_err:>9.2e}  "
                        f"{_fmt_range(g.ref_range):<22} {_fmt_range(g.npu_range):<22} "
                        f"{g.range_plan}")
        bad = self.first_under
        rows.append("first group under the threshold: " + (
            "none" if bad is None else f"{bad.index} {bad.name} (cosine {_fmt_cos(bad.cosine)}, "
            f"lines {', '.join(bad.lines) or '?'})"))
        return "\n".join(rows)

    def html(self) -> str:
        """One self-contained page: the table and an inline SVG of the error per group."""
        bad = self.first_under
        rows = "\n".join(
            f"<tr class=\"{'bad' if (not g.finite or not g.cosine >= self.threshold) else ''}\">"
            f"<td>{g.index}</td><td>{html.escape(g.name)}</td><td>%{g.value.id}</td>"
            f"<td>{len(g.nodes)}</td><td>{_fmt_cos(g.cosine)}</td><td>{g.max_rel_err:.2e}</td>"
            f"<td>{_fmt_range(g.ref_range)}</td><td>{_fmt_range(g.npu_range)}</td>"
            f"<td>{html.escape(g.range_plan)}</td>"
            f"<td>{html.escape(', '.join(g.lines))}</td></tr>" for g in self.groups)
        verdict = ("every group is at or above the threshold" if bad is None else
                   f"first group under the threshold: {bad.index} {html.escape(bad.name)}")
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>rockjit check: {html.escape(self.function)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #bbb; padding: 2px 6px; text-align: left; }}
tr.bad td {{ background: #fdd; }}
</style></head><body>
<h1>rockjit check: {html.escape(self.function)}</h1>
<p>{html.escape(self.backend)} vs the fp32 IR interpreter; {len(self.groups)} groups by
{html.escape(self.by)}; threshold cosine &ge; {self.threshold}. <b>{verdict}</b>.</p>
{self._svg()}
<table><tr><th>#</th><th>group</th><th>value</th><th>ops</th><th>cosine</th>
<th>max rel err</th><th>ref range</th><th>npu range</th><th>range plan</th><th>lines</th></tr>
{rows}
</table></body></html>
"""

    def _svg(self, width: int = 720, height: int = 260) -> str:
        """Max relative error (log scale) and 1 - cosine per group as two polylines."""
        pad_l, pad_r, pad_t, pad_b = 60, 20, 20, 40
        n = len(self.groups)
        if n == 0:
            return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"></svg>"

        def ylog(v: float) -> float:
            return math.log10(min(max(v, 1e-8), 1e2))

        series = {"max rel err": [g.max_rel_err for g in self.groups],
                  "1 - cosine": [1.0 - g.cosine for g in self.groups]}
        lo, hi = -8.0, 2.0
        fin = [ylog(v) for s in series.values() for v in s if math.isfinite(v)]
        if fin:
            lo, hi = math.floor(min(fin)), math.ceil(max(fin) + 1e-9)
            hi = max(hi, lo + 1)
        w, h = width - pad_l - pad_r, height - pad_t - pad_b

        def xy(i: int, v: float) -> tuple[float, float]:
            x = pad_l + (w * i / (n - 1) if n > 1 else w / 2)
            y = pad_t + h * (hi - (ylog(v) if math.isfinite(v) else hi)) / (hi - lo)
            return x, y

        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'font-size="11">',
                 f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="none" '
                 f'stroke="#888"/>']
        for e in range(int(lo), int(hi) + 1):
            y = pad_t + h * (hi - e) / (hi - lo)
            parts.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="#eee"/><text x="{pad_l - 6}" y="{y + 4:.1f}" '
                         f'text-anchor="end">1e{e}</text>')
        thr = 1.0 - self.threshold
        if thr > 0:
            y = xy(0, thr)[1]
            parts.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="#c00" stroke-dasharray="4 3"/>')
        for (label, vals), color in zip(series.items(), ("#1f5fbf", "#d08000")):
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(vals)))
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                         f'stroke-width="1.5"><title>{label}</title></polyline>')
            for i, v in enumerate(vals):
                x, y = xy(i, v)
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}">'
                             f'<title>group {i} {html.escape(self.groups[i].name)}: {label} '
                             f'{v:.3g}</title></circle>')
        step = max(1, n // 20)
        for i in range(0, n, step):
            x = xy(i, 1.0)[0]
            parts.append(f'<text x="{x:.1f}" y="{pad_t + h + 14}" text-anchor="middle">{i}'
                         f'</text>')
        parts.append(f'<text x="{pad_l + w / 2}" y="{height - 6}" text-anchor="middle">group'
                     f' (blue: max rel err, orange: 1 - cosine, red dashes: 1 - threshold)</text>')
        parts.append("</svg>")
        return "\n".join(parts)


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else "..." + s[-(n - 3):]


def _fmt_cos(c: float) -> str:
    return "nan" if not math.isfinite(c) else f"{c:.6f}"


def _fmt_range(r: tuple[float, float]) -> str:
    return f"[{r[0]:.3g}, {r[1]:.3g}]"


def _short_loc(node: Node) -> str:
    if node.loc is None:
        return "?"
    parts = node.loc.file.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{node.loc.line}"


# ---------------------------------------------------------------------------------------------
# grouping
# ---------------------------------------------------------------------------------------------

def norm_inputs(graph: Graph) -> list[Value]:
    """Values that feed a LayerNorm: the operand of a ``layer_norm`` op (ir/passes/fuse.py), or
    ``x`` with a ``sub(x, broadcast(scale * reduce_sum(x)))`` (the mean subtraction) in a graph
    nothing fused, in graph order."""
    prod = graph.producers()
    found: dict[int, Value] = {}
    for n in graph.nodes:
        if n.op is Op.LAYER_NORM:
            found.setdefault(n.inputs[0].id, n.inputs[0])
            continue
        if n.op is not Op.SUB:
            continue
        x, m = n.inputs
        p = prod.get(m.id)
        while p is not None and p.op in _THROUGH:
            p = prod.get(p.inputs[0].id)
        if p is not None and p.op is Op.REDUCE_SUM and p.inputs[0].id == x.id:
            found.setdefault(x.id, x)
    order = {n.out.id: i for i, n in enumerate(graph.nodes)}
    return sorted(found.values(), key=lambda v: order.get(v.id, -1))


def _computed(graph: Graph) -> list[Node]:
    """The nodes that compute something at run time (not params, constants, or shape ops of
    only those)."""
    const: set[int] = set()
    out = []
    for n in graph.nodes:
        if n.op in (Op.PARAM, Op.CONSTANT, Op.IOTA) or (n.inputs and all(v.id in const
                                                                          for v in n.inputs)):
            const.add(n.out.id)
            continue
        out.append(n)
    return out


def make_groups(graph: Graph, by: str = "auto") -> tuple[list[LineGroup], str]:
    """(groups, the grouping used); every group's value is a float value (module docstring)."""
    nodes = [n for n in _computed(graph)]
    if by == "auto":
        by = "norm" if len(norm_inputs(graph)) >= 2 else "line"
    cuts: list[list[Node]] = []
    if by == "norm":
        marks = {v.id for v in norm_inputs(graph)}
        cur: list[Node] = []
        for n in nodes:
            cur.append(n)
            if n.out.id in marks:
                cuts.append(cur)
                cur = []
        if cur:
            cuts.append(cur)
    elif by == "line":
        cur, key = [], None
        for n in nodes:
            k = str(n.loc) if n.loc else None
            if cur and k != key:
                cuts.append(cur)
                cur = []
            cur.append(n)
            key = k
        if cur:
            cuts.append(cur)
    else:
        raise ValueError(f"group by {by!r}: choose 'auto', 'norm' or 'line'")
    groups = []
    seen: dict[str, int] = {}
    for part in cuts:
        floats = [n for n in part if n.out.type.dtype.is_float]
        if not floats:
            continue
        lines = list(dict.fromkeys(_short_loc(n) for n in part))
        # named by the line that makes the group's value, [k] = its k-th occurrence (the
        # layer index when each layer passes through that line once)
        end = _short_loc(floats[-1])
        k = seen.get(end, 0)
        seen[end] = k + 1
        groups.append(LineGroup(len(groups), f"{end} [{k}]", floats[-1].out, part, lines))
    return groups, by


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

def _flat_inputs(compiled, args: Sequence[Any]) -> tuple[list[np.ndarray], list[str]]:
    """The graph inputs for a call with ``args`` and where each came from (argument, pytree
    path), checked against the signature like a call; resident arguments are bound to
    ``compiled`` (without running its program)."""
    from .signature import arg_location

    inputs, where, resident = [], [], []
    for i, arg in compiled._split_args(tuple(args)):
        spec = compiled.signature.args[i]
        for j, leaf in enumerate(compiled._check(i, arg)):
            if spec.kind == "resident":
                resident.append((compiled.signature.param_names[(i, j)], leaf, spec.leaves[j]))
            else:
                inputs.append(np.asarray(leaf, dtype=spec.leaves[j].dtype))
                where.append(arg_location(compiled.signature.fn, i, spec.leaves[j].path))
    compiled._binding.update(resident)
    return inputs, where


def _range_plan_records(*runners: Any) -> list | None:
    """The range plan's records of the first runner whose program has one (None: the
    compiler keeps no range plan)."""
    for r in runners:
        plan = getattr(getattr(r, "loaded_graph", None), "range_plan", None)
        if plan is not None:
            break
    else:
        return None
    if plan is None:
        return None
    return list(plan() if callable(plan) else plan)


def _plan_summary(records: list | None, group: LineGroup) -> str:
    if records is None:
        return "n/a"
    ids = {n.out.id for n in group.nodes}
    mine = [r for r in records if getattr(r, "value", None) in ids]
    if not mine:
        return "no records"
    counts: dict[str, int] = {}
    for r in mine:
        a = str(getattr(r, "action", "?"))
        counts[a] = counts.get(a, 0) + 1
    rep = next((r for r in mine if getattr(r, "value", None) == group.value.id), None)
    s = ", ".join(f"{a} x{k}" for a, k in sorted(counts.items(), key=lambda kv: -kv[1]))
    if rep is not None:
        b = getattr(rep, "bound", math.nan)
        s += f"; value bound {b:.3g} ({getattr(rep, 'action', '?')})"
    return s


def check(compiled, *args: Any, threshold: float = DEFAULT_THRESHOLD, by: str = "auto"
          ) -> CheckReport:
    """The per-group accuracy report of ``compiled`` (a ``rockjit`` Compiled object) on
    ``args`` (module docstring)."""
    from .backends import make_runner
    from .ir.interpreter import run as interpret

    inputs, where = _flat_inputs(compiled, args)
    graph = compiled.graph
    groups, used = make_groups(graph, by)
    probe = Graph(f"{graph.name}_check", graph.inputs, list(graph.nodes),
                  tuple(graph.outputs) + tuple(g.value for g in groups))
    params = compiled.params
    ref = interpret(probe, inputs, params)[len(graph.outputs):]
    # the same graph with the groups' values as extra outputs, on the same backend: every op
    # is lowered by the same rules as in the compiled program
    runner = make_runner(compiled.backend, probe, params, compiled.cores)
    try:
        got = runner(inputs)[len(graph.outputs):]
        records = _range_plan_records(getattr(compiled, "_runner", None), runner)
    except InputRangeError as e:
        if e.index is None or not 0 <= e.index < len(where):
            raise
        raise InputRangeError(f"{where[e.index]}: {e}", e.index) from None
    finally:
        close = getattr(getattr(runner, "loaded_graph", None), "close", None)
        if close is not None:
            close()
    rep = CheckReport(getattr(graph, "name", "main"), compiled.backend, threshold, used,
                      plan_available=records is not None)
    for g, r, o in zip(groups, ref, got):
        r64, o64 = np.asarray(r, np.float64).ravel(), np.asarray(o, np.float64).ravel()
        g.finite = bool(np.isfinite(o64).all())
        g.ref_range = (float(np.min(r64)), float(np.max(r64))) if r64.size else (0.0, 0.0)
        g.npu_range = (float(np.min(o64)), float(np.max(o64))) if o64.size else (0.0, 0.0)
        nr, no = float(np.linalg.norm(r64)), float(np.linalg.norm(o64))
        with np.errstate(all="ignore"):
            if nr == 0.0 and no == 0.0:
                g.cosine = 1.0
            else:
                g.cosine = float(np.dot(r64, o64) / (nr * no)) if nr and no else 0.0
            scale = float(np.max(np.abs(r64))) if r64.size else 0.0
            err = float(np.max(np.abs(o64 - r64))) if r64.size else 0.0
            g.max_rel_err = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
        g.range_plan = _plan_summary(records, g)
        rep.groups.append(g)
    return rep
