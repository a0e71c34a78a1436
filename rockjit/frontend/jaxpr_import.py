"""Entry point of the frontend: a ClosedJaxpr in, a rockjit IR Graph out."""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.graph import Builder, Graph, Loc
from ..ir.ops import Op
from .context import Importer, tensor_type
from .locations import jaxpr_loc


def import_jaxpr(closed_jaxpr: Any, param_names: Sequence[str | None] | None = None, *,
                 name: str = "main", default_loc: Loc | None = None) -> Graph:
    """Import ``closed_jaxpr`` into a new Graph.

    ``param_names[i]`` is None for an invar that becomes a graph input, or the name of the
    resident constant (a ``param`` node) that the invar stands for.  ``default_loc`` locates the
    nodes no equation owns (params, the function's captured constants); without it, the traced
    function's definition line from the jaxpr's debug info is used."""
    jaxpr = closed_jaxpr.jaxpr
    if default_loc is None:
        default_loc = jaxpr_loc(jaxpr)
    names = list(param_names) if param_names is not None else [None] * len(jaxpr.invars)
    if len(names) != len(jaxpr.invars):
        raise ValueError(f"{len(names)} param names for {len(jaxpr.invars)} jaxpr inputs")
    b = Builder(name)
    imp = Importer(b, default_loc)
    args = []
    for i, (var, pname) in enumerate(zip(jaxpr.invars, names)):
        t = tensor_type(var.aval, default_loc, f"argument {i}")
        if pname is None:
            args.append(b.input(t))
        else:
            args.append(b.add(Op.PARAM, [], t, {"name": pname}, default_loc))
    outs = imp.import_jaxpr(jaxpr, closed_jaxpr.consts, args, default_loc)
    return b.finish(outs)
