"""The NPU backends of ``rockjit.compile``: "auto" (the default), "sim", "null" and "rocket".

    f = rockjit.compile(fn)                     # auto: rocket if /dev/accel/accel0 opens,
                                                # else the simulator (said once per process)
    f = rockjit.compile(fn, backend="sim")      # C simulator, strict hazard checks on
    f = rockjit.compile(fn, backend="null")     # counts work, computes nothing
    f = rockjit.compile(fn, backend="rocket")   # /dev/accel/accel0 (RJ_FAKE_ROCKET=1: the fake)
    f = rockjit.compile(fn, backend="sim:rk3588")   # any registered chip profile by name

The bare names compile for the RK3588; ``KIND:PROFILE`` compiles for another registered
profile (its CBUF, atoms and core count), so a second chip needs no change here.

Each factory lowers the graph once per bound parameter set (``pipeline.lower_graph`` +
``program.build_image``) and loads the image on its device (``runtime.program.load_image``);
LUT domains are calibrated on the first call's inputs (the runner compiles lazily on its first
call, when those exist), or statically when compiled before any call (save/export).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..api import register_backend
from ..ir.graph import Graph


class NpuRunner:
    """What a backend factory returns: lowers the graph to a ProgramImage on the first call
    (calibrating on its inputs) or on ``compile()`` (static calibration), loads the image on
    a device, runs it. ``stats()``/``report()``/``placement()`` describe the program."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], kind: str,
                 profile: str) -> None:
        self.graph = graph
        self.params = dict(params)
        self.kind = kind
        self.profile = profile
        self.image = None
        self.device = None
        self.program = None

    def compile(self, example_inputs: Sequence[np.ndarray] | None = None):
        """Lower the graph to its ProgramImage (no device needed); returns the image."""
        from .pipeline import lower_graph
        from .program import build_image

        lowered = lower_graph(self.graph, self.params, example_inputs=example_inputs,
                              profile=self.profile)
        self.image = build_image(lowered)
        return self.image

    def load(self):
        """Load the image on this backend's device (made on first use); returns the program."""
        from ..runtime.bundle import make_device
        from ..runtime.program import load_image

        if self.image is None:
            self.compile(None)
        if self.program is None:
            if self.device is None:
                self.device = make_device(self.kind, self.image.contexts)
            self.program = load_image(self.image, self.device)
        return self.program

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.image is None:
            self.compile(inputs)
        return self.load().run(inputs)

    def stats(self) -> dict[str, int]:
        if self.image is None:
            raise RuntimeError("the program is compiled on its first call; call it first")
        if self.program is None:
            return dict(self.image.stats)
        return self.program.stats()

    def report(self) -> str:
        return self.image.report() if self.image is not None else ""

    def placement(self) -> list:
        return list(self.image.placement) if self.image is not None else []


def _factory(kind: str, profile: str):
    def factory(graph: Graph, params: Mapping[str, np.ndarray]) -> NpuRunner:
        return NpuRunner(graph, params, kind, profile)
    return factory


# "auto": the rocket device when /dev/accel/accel0 opens, else the simulator
# (runtime/bundle.py: resolve_auto, said once per process)
DEVICES = ("auto", "sim", "null", "rocket")


def register_npu_backends(profile: str) -> None:
    """Register ``sim:PROFILE``, ``null:PROFILE`` and ``rocket:PROFILE`` for a chip profile
    (``get_profile`` must know it); the bare names are the RK3588's."""
    from ..api import BACKENDS
    from .profile import get_profile

    name = get_profile(profile).name
    for kind in DEVICES:
        for key in ((kind, f"{kind}:{name}") if name == "rk3588" else (f"{kind}:{name}",)):
            if key not in BACKENDS:
                register_backend(key)(_factory(kind, name))


register_npu_backends("rk3588")
