"""The NPU backends of ``rockjit.compile``: "sim", "null" and "rocket".

    f = rockjit.compile(fn, backend="sim")      # C simulator, strict hazard checks on
    f = rockjit.compile(fn, backend="null")     # counts work, computes nothing
    f = rockjit.compile(fn, backend="rocket")   # /dev/accel/accel0 (RJ_FAKE_ROCKET=1: the fake)
    f = rockjit.compile(fn, backend="sim:rk3588")   # any registered chip profile by name

The bare names compile for the RK3588; ``KIND:PROFILE`` compiles for another registered
profile (its CBUF, atoms and core count), so a second chip needs no change here.

Each factory lowers the graph once per bound parameter set (``pipeline.lower_graph`` +
``program.NpuProgram``). The program depends on the graph and the resident values only (LUT
domains come from the functions, calibrate.py), so it is built by ``compile()`` without any
input -- ``Lowered.compile()`` does that when the resident values are bound -- or else on the
first call.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

from ..api import register_backend
from ..ir.graph import Graph


class NpuRunner:
    """What a backend factory returns: compiles (from the graph and params alone) when asked or
    on the first call, then runs the program. ``stats()``/``report()`` describe the compiled
    program."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray],
                 make_device: Callable[[int], Any], profile: str) -> None:
        self.graph = graph
        self.params = dict(params)
        self._make_device = make_device
        self.profile = profile
        self.device = None
        self.program = None
        self.lowered = None

    def compile(self):
        from .pipeline import lower_graph
        from .program import NpuProgram

        from .profile import get_profile

        if self.device is None:
            self.device = self._open_device(get_profile(self.profile).cores)
        self.lowered = lower_graph(self.graph, self.params, profile=self.profile)
        self.program = NpuProgram(self.lowered, self.device)
        return self.program

    def _open_device(self, cores: int):
        from ..runtime import DeviceError

        try:
            return self._make_device(cores)
        except DeviceError as e:
            if self._make_device is not _rocket:
                raise
            raise type(e)(f"{e.message} {_rocket_hint('rocket')}", e.code) from None

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        from ..runtime import DeviceError
        from .value_checks import check_inputs

        check_inputs(self.graph, inputs)      # NaN / Inf / |x| > 65504: refused, not packed
        if self.program is None:
            try:
                if self.lowered is None:
                    self.compile()
                else:
                    self._reload()
            except DeviceError:
                self._drop_device()  # a half-built program's BOs go with the device
                raise
        try:
            return self.program.run(inputs)
        except DeviceError:
            # A device fault (failed submit, timeout, a job that never finished, the device
            # going away) leaves BOs possibly still owned by a hung job and fds possibly dead:
            # drop the program and the device (every BO is freed), keep the lowering, and load
            # it afresh on the next call.
            self._drop_device()
            raise

    def _reload(self) -> None:
        from .profile import get_profile
        from .program import NpuProgram

        if self.device is None:
            self.device = self._open_device(get_profile(self.profile).cores)
        self.program = NpuProgram(self.lowered, self.device)

    def _drop_device(self) -> None:
        program, device = self.program, self.device
        self.program = self.device = None
        if program is not None:
            program.close()
        if device is not None:
            device.close()

    def stats(self) -> dict[str, int]:
        if self.program is None:
            raise RuntimeError("the program is not compiled yet; call it, or compile it with "
                               "lower(...).compile()")
        return self.program.stats()

    def report(self) -> str:
        return self.program.report() if self.program is not None else ""

    def range_plan(self) -> list:
        """The compiled program's range-plan records (range_plan.RangeRecord)."""
        if self.program is None:
            raise RuntimeError("the program is compiled on its first call; call it first")
        return self.program.range_plan


def _factory(make_device: Callable[[int], Any], profile: str):
    def factory(graph: Graph, params: Mapping[str, np.ndarray]) -> NpuRunner:
        return NpuRunner(graph, params, make_device, profile)
    factory.probe = PROBES.get(make_device)
    return factory


ROCKET_NODE = "/dev/accel/accel0"


def _rocket_hint(backend: str) -> str:
    return (f'Without an NPU, compile with backend="sim" (the C simulator) instead of '
            f'backend="{backend}", or set RJ_FAKE_ROCKET=1 to run the rocket code path on its '
            f'in-process ioctl fake.')


def _probe_rocket(backend: str) -> None:
    """Refuse backend="rocket" at rockjit.compile() when the NPU node is missing, rather than
    on the first call, whose error named runtime classes instead of the backend to use."""
    from .. import debugflags
    from ..runtime import DeviceError

    if debugflags.enabled(debugflags.FAKE_ROCKET) or os.path.exists(ROCKET_NODE):
        return
    raise DeviceError(f'backend="{backend}" needs the NPU device node {ROCKET_NODE}, which does '
                      f'not exist on this machine (is the rocket driver loaded? modprobe rocket). '
                      + _rocket_hint(backend), DeviceError.code)


def _sim(cores: int):
    from ..runtime import SimDevice
    return SimDevice(cores=cores, strict=True)


def _null(cores: int):
    from ..runtime import NullDevice
    return NullDevice(cores=cores)


def _rocket(cores: int):
    from .. import debugflags
    from ..runtime import RocketDevice
    return RocketDevice(fake=debugflags.enabled(debugflags.FAKE_ROCKET), cores=cores)


DEVICES = {"sim": _sim, "null": _null, "rocket": _rocket}
PROBES = {_rocket: _probe_rocket}


def register_npu_backends(profile: str) -> None:
    """Register ``sim:PROFILE``, ``null:PROFILE`` and ``rocket:PROFILE`` for a chip profile
    (``get_profile`` must know it); the bare names are the RK3588's."""
    from ..api import BACKENDS
    from .profile import get_profile

    name = get_profile(profile).name
    for kind, make in DEVICES.items():
        for key in ((kind, f"{kind}:{name}") if name == "rk3588" else (f"{kind}:{name}",)):
            if key not in BACKENDS:
                register_backend(key)(_factory(make, name))


register_npu_backends("rk3588")
