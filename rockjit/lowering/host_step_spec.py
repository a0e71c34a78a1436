"""A lowering HostStep -> the image's plain ``HostStepSpec`` (runtime/image.py)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

import numpy as np

from ..runtime.image import HostStepSpec
from .op_lowering import HostStep

_LAYOUT_PARAMS = {"height", "width", "channels", "c2", "esize", "line_stride", "surf_stride",
                  "kernels", "kh", "kw", "n_group", "k_group", "group", "rows", "cols", "eps",
                  "table_rows"}


def _spec_dtype(spec) -> str:
    if spec is None:
        return "f16"
    if spec.dtype:
        return spec.dtype
    if spec.layout is not None:
        return _dtype_name(np.dtype(spec.layout.dtype))
    return "f16"


@lru_cache(maxsize=None)
def _dtype_name(dt: np.dtype) -> str:
    # np.dtype.name is computed in Python on every access (thousands of host steps per model)
    return dt.name


def host_step_spec(hs: HostStep, names: Mapping[str, tuple[int, int]],
                   spec_of: Callable[[str], Any]) -> HostStepSpec:
    """A lowering HostStep -> the image's plain ``HostStepSpec``.

    ``names``: buffer name -> (program BO, byte offset of the buffer); ``spec_of(name)``: the
    op's BufferSpec (for an operand's default dtype). Runtime kinds (host_steps.HOST_STEPS)
    take per-operand dtypes and row strides from ``params["dtypes"][operand]`` /
    ``params["row_strides"][operand]`` (the convention of the steps the rules build), else
    from ``params["<operand>_dtype"]`` / ``"<operand>_row_stride"``, else the BufferSpec;
    the host-op kinds (host_rules.HOST_KINDS) carry everything in their descriptor."""
    from ..runtime import host_steps as HS
    from .host_rules import HOST_KINDS

    if hs.kind in HOST_KINDS or hs.kind not in HS.HOST_STEPS:
        return _host_op_spec(names, hs, HS)
    dtypes = hs.params.get("dtypes", {}) or {}
    strides = hs.params.get("row_strides", {}) or {}
    ops = {}
    for opname, sl in hs.operands.items():
        bo, base = names[sl.buffer]
        dt = dtypes.get(opname) or hs.params.get(f"{opname}_dtype") or _spec_dtype(spec_of(sl.buffer))
        rs = strides.get(opname, hs.params.get(f"{opname}_row_stride", 0))
        ops[opname] = (int(bo), int(base + sl.offset), str(dt), int(rs))
    params = {k: (float(v) if isinstance(v, (float, np.floating)) else int(v))
              for k, v in hs.params.items() if k in _LAYOUT_PARAMS}
    return HostStepSpec(hs.kind, ops, params)


def runtime_host_step(hs: HostStep, names: Mapping[str, tuple[int, int]],
                      spec_of: Callable[[str], Any]):
    """A lowering HostStep -> the runtime's filled ``rj_host_step`` (through its spec)."""
    from ..runtime.program import _host_step_from_spec

    return _host_step_from_spec(host_step_spec(hs, names, spec_of))


def _host_op_spec(names, hs: HostStep, HS) -> HostStepSpec:
    """A host-op library step (host_rules.HOST_KINDS; csrc/runtime/rj_host_ops.h): dst =
    output, src = input 1, desc = the descriptor, src1/src2 = inputs 2..3."""
    from .host_rules import HOST_KINDS

    if hs.kind not in HOST_KINDS:
        raise ValueError(f"host step kind {hs.kind!r} is neither a runtime host step "
                         f"({sorted(HS.HOST_STEPS)}) nor a host-op kind ({sorted(HOST_KINDS)})")
    ops = {}
    for name in ("dst", "desc", "src", "src1", "src2"):
        if name in hs.operands:
            sl = hs.operands[name]
            bo, base = names[sl.buffer]
            ops[name] = (int(bo), int(base + sl.offset), "u8", 0)
    return HostStepSpec(hs.kind, ops, {})
