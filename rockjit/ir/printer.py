"""Print a graph in the IR text form; ``parser.parse`` reads it back exactly.

    func @main(%0: f32[8,32]) {
      %1 = param() {name="w"} : f32[32,64] loc("model.py":12)
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,64]
      %3 = constant() {value=dense<f32[]: [0.5]>} : f32[]
      return %2
    }

Types are ``dtype[d0,d1,...]`` (``f32[]`` is a scalar).  Attributes are sorted by name; values
are integers, floats (``1.5``, ``inf``, ``nan``), JSON strings, ``true``/``false``, ``[...]``
lists, or arrays ``dense<T: [row-major decimals]>`` / ``dense<T: base64 "little-endian bytes">``.
``loc("file":line)`` is optional, ``//`` starts a comment.  The grammar is ``grammar.lark``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .textcodec import encode_value, name_or_quoted, quote

if TYPE_CHECKING:   # graph.Graph.__str__ prints with this module: no run-time import back
    from .graph import Graph, Node


def print_node(n: Node) -> str:
    res = ", ".join(str(v) for v in n.outputs)
    args = ", ".join(str(v) for v in n.inputs)
    text = f"{res} = {n.op.text}({args})"
    if n.attrs:
        text += " {" + ", ".join(f"{k}={encode_value(v)}" for k, v in n.attrs.items()) + "}"
    text += " : " + ", ".join(str(v.type) for v in n.outputs)
    if n.loc is not None:
        text += f" loc({quote(n.loc.file)}:{n.loc.line})"
    return text


def print_graph(graph: Graph) -> str:
    args = ", ".join(f"{v}: {v.type}" for v in graph.inputs)
    lines = [f"func @{name_or_quoted(graph.name)}({args}) {{"]
    lines += ["  " + print_node(n) for n in graph.nodes]
    lines.append("  return" + ("" if not graph.outputs else " " + ", ".join(
        str(v) for v in graph.outputs)))
    lines.append("}")
    return "\n".join(lines) + "\n"
