"""The NPU backends of ``rockjit.compile``: "sim", "null" and "rocket".

    f = rockjit.compile(fn, backend="sim")      # C simulator, strict hazard checks on
    f = rockjit.compile(fn, backend="null")     # counts work, computes nothing
    f = rockjit.compile(fn, backend="rocket")   # /dev/accel/accel0 (RJ_FAKE_ROCKET=1: the fake)

Each factory lowers the graph once per bound parameter set (``pipeline.lower_graph`` +
``program.NpuProgram``); LUT domains are calibrated on the first call's inputs (the runner
compiles lazily on its first call, when those exist).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..api import register_backend
from ..ir.graph import Graph


class NpuRunner:
    """What a backend factory returns: compiles on the first call (calibrating on its inputs),
    then runs the program. ``stats()``/``report()`` describe the compiled program."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray],
                 make_device: Callable[[], Any]) -> None:
        self.graph = graph
        self.params = dict(params)
        self._make_device = make_device
        self.device = None
        self.program = None

    def compile(self, example_inputs: Sequence[np.ndarray] | None = None):
        from .pipeline import lower_graph
        from .program import NpuProgram

        if self.device is None:
            self.device = self._make_device()
        lowered = lower_graph(self.graph, self.params, example_inputs=example_inputs)
        self.program = NpuProgram(lowered, self.device)
        return self.program

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.program is None:
            self.compile(inputs)
        return self.program.run(inputs)

    def stats(self) -> dict[str, int]:
        if self.program is None:
            raise RuntimeError("the program is compiled on its first call; call it first")
        return self.program.stats()

    def report(self) -> str:
        return self.program.report() if self.program is not None else ""


def _factory(make_device: Callable[[], Any]):
    def factory(graph: Graph, params: Mapping[str, np.ndarray]) -> NpuRunner:
        return NpuRunner(graph, params, make_device)
    return factory


def _cores() -> int:
    from .profile import get_profile
    return get_profile("rk3588").cores


def _sim():
    from ..runtime import SimDevice
    return SimDevice(cores=_cores(), strict=True)


def _null():
    from ..runtime import NullDevice
    return NullDevice(cores=_cores())


def _rocket():
    import os
    from ..runtime import RocketDevice
    return RocketDevice(fake=os.environ.get("RJ_FAKE_ROCKET") == "1", cores=_cores())


for _name, _mk in (("sim", _sim), ("null", _null), ("rocket", _rocket)):
    from ..api import BACKENDS as _B
    if _name not in _B:
        register_backend(_name)(_factory(_mk))
