"""Bounds checked before a compile allocates or emits anything large.

Two limits, both decided from the IR alone (types and shapes), so a function that cannot be
compiled is refused in milliseconds instead of after the emitter has taken gigabytes:

* the device's address space: regcmd address fields and the rocket uAPI's task and BO addresses
  are 32-bit (torvalds/linux include/uapi/drm/rocket_accel.h: drm_rocket_task.regcmd is a u32;
  notes: perf/iova-and-multicore.md, one 4 GiB IOVA window per fd), so no tensor, and not the
  graph's inputs and outputs together (they are live for the whole call), can exceed 4 GiB even
  in the smallest form the NPU holds it in (fp16 for floats);
* the compiler's own cost: the emitters write every task's registers in Python, about 2 ms a
  task on the 2-core CI machine (a 2048^3 matmul is 1849 tasks and lowers in ~3 s; an 8192^3
  one would be ~470k tasks), so one op is limited to ``MAX_TASKS_PER_OP`` tasks and one tensor
  to ``MAX_TENSOR_ELEMENTS`` elements; beyond them the compile takes minutes and gigabytes.

The compile looks at no run-time data (calibrate.py: LUT domains come from the functions), so no
full-size intermediate is ever computed at compile time.
"""
from __future__ import annotations

from typing import Sequence


from ..errors import UnsupportedError
from ..ir.graph import Graph, Value
from ..ir.ops import Op
from ..ir.types import TensorType

ADDRESS_SPACE = 1 << 32
MAX_TENSOR_ELEMENTS = 1 << 26       # 8192 x 8192; an elementwise op on it is ~8k tasks
MAX_TASKS_PER_OP = 20_000           # ~40 s of emission on the 2-core CI machine


class CompileBoundError(UnsupportedError):
    """A function whose buffers or work exceed what the device or the compiler can take."""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def device_min_bytes(t: TensorType) -> int:
    """The fewest bytes a tensor of this type takes on the device: floats as fp16 at best."""
    esize = t.dtype.to_numpy().itemsize
    if t.dtype.is_float:
        esize = min(esize, 2)
    return t.size * esize


def _values(graph: Graph) -> list[tuple[Value, str]]:
    """Every value with where it comes from (source line, or which graph input)."""
    out = [(v, f"input {i} of {graph.name}") for i, v in enumerate(graph.inputs)]
    for n in graph.nodes:
        what = f"param {n.attrs['name']!r}" if n.op is Op.PARAM else n.op.text
        loc = f" at {n.loc}" if n.loc else ""
        for v in n.outputs:
            out.append((v, f"{what}{loc}"))
    return out


_ADVICE = ("split the computation in the JAX function (process the batch or sequence in chunks "
           "over several calls, or loop over row blocks), or run this part outside the compiled "
           "function")


def check_graph(graph: Graph) -> None:
    """Refuse a graph with a tensor that cannot fit the 32-bit address space, or so large that
    lowering it would take minutes and gigabytes. Raises CompileBoundError naming the tensor,
    its size and its source line."""
    values = _values(graph)
    for v, where in values:
        need = device_min_bytes(v.type)
        if need >= ADDRESS_SPACE:
            raise CompileBoundError(
                f"tensor %{v.id} ({v.type}, {where}) needs at least {_gib(need)} on the device "
                f"(fp16 for floats), but the NPU addresses only {_gib(ADDRESS_SPACE)} (32-bit "
                f"addresses, one IOVA window per context); {_ADVICE}")
    io = {v.id: (v, w) for v, w in values[:len(graph.inputs)]}
    io.update({v.id: (v, "an output of " + graph.name) for v in graph.outputs if v.id not in io})
    total = sum(device_min_bytes(v.type) for v, _ in io.values())
    if total >= ADDRESS_SPACE:
        big, w = max(io.values(), key=lambda vw: device_min_bytes(vw[0].type))
        raise CompileBoundError(
            f"the inputs and outputs of {graph.name} need at least {_gib(total)} on the device "
            f"at once (the largest: %{big.id} {big.type}, {w}), more than the NPU's "
            f"{_gib(ADDRESS_SPACE)} address space; {_ADVICE}")
    for v, where in values:
        if v.type.size > MAX_TENSOR_ELEMENTS:
            raise CompileBoundError(
                f"tensor %{v.id} ({v.type}, {where}; {_gib(v.type.size * v.type.dtype.to_numpy().itemsize)}) "
                f"has {v.type.size} elements, more than the "
                f"{MAX_TENSOR_ELEMENTS} (rockjit.lowering.bounds.MAX_TENSOR_ELEMENTS) one compile "
                f"takes: lowering it would emit tens of thousands of NPU tasks, minutes of "
                f"compile time and gigabytes of memory; {_ADVICE}")


def check_tasks(tasks: int, what: str) -> None:
    """Refuse an op whose plan has more tasks than the emitter should write (before it does)."""
    if tasks > MAX_TASKS_PER_OP:
        raise CompileBoundError(
            f"{what} would be {tasks} NPU tasks, more than the {MAX_TASKS_PER_OP} "
            f"(rockjit.lowering.bounds.MAX_TASKS_PER_OP) one op may take: emitting them would "
            f"take minutes and gigabytes; {_ADVICE}")




def check_bo(role: str, size: int, contents: Sequence[tuple[str, int]], graph: Graph) -> None:
    """Refuse a device buffer of ``size`` bytes past the address space before it is created;
    ``contents`` = (name, bytes) of what it holds, the largest named in the message."""
    if size < ADDRESS_SPACE:
        return
    top = sorted(contents, key=lambda nb: -nb[1])[:3]
    listed = ", ".join(f"{n or '?'} ({_gib(b)})" for n, b in top)
    raise CompileBoundError(
        f"{graph.name}: the {role} buffer would be {_gib(size)}, past the NPU's "
        f"{_gib(ADDRESS_SPACE)} address space (32-bit addresses, one IOVA window per context); "
        f"its largest tensors: {listed}; {_ADVICE}")
