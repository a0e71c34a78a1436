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
``image_builder.ImageBuilder``: a ProgramImage) and loads the image on its device. The program
depends on the graph and the resident values only (LUT domains come from the functions,
calibrate.py), so ``compile()`` builds it without any input -- ``Lowered.compile()`` does that
when the resident values are bound, save/export too -- or else the first call does.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from ..gc_pause import gc_paused
from ..ir.graph import Graph


class NpuRunner:
    """What a backend factory returns: lowers the graph to a ProgramImage on ``compile()`` or
    the first call, loads the image on a device (made on first use), runs it.
    ``stats()``/``report()``/``placement()``/``range_plan()`` describe the program. A device
    fault drops the device and the loaded program (every BO freed) and keeps the lowering, so the
    next call loads it afresh."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], kind: str,
                 profile: str, cores: int | None = None) -> None:
        """``cores``: lay the program out for that many of the chip's cores (device contexts;
        None: all of them). With one, no step spreads its jobs and no byte is copied between
        cores, and the weights are held once (rockjit.compile's ``cores=``)."""
        self.graph = graph
        self.params = dict(params)
        self.kind = kind
        self.profile = profile
        self.cores = cores
        self.lowered = None
        self.builder = None
        self.device = None
        self.loaded_graph = None

    @property
    def image(self):
        return self.builder.image if self.builder is not None else None

    @gc_paused
    def compile(self, example_inputs: Sequence[np.ndarray] | None = None):
        """Lower the graph to its ProgramImage (no device needed); returns the image.
        ``example_inputs`` is accepted for the API's sake and not looked at."""
        from .pipeline import lower_graph
        from .image_builder import ImageBuilder

        self.lowered = lower_graph(self.graph, self.params, profile=self.profile)
        self.builder = ImageBuilder(self.lowered, self.cores)
        return self.builder.image

    def load(self):
        """Load the image on this backend's device (made on first use); returns the program.
        Only the first call does work, gc-paused (``_load``): the pause hands freed heap back
        to the kernel, which around every forward re-faulted the forward's own pages (SigLIP-224
        one layer: host cost ~1.7 -> ~3.8 ms on the null backend)."""
        if self.loaded_graph is None:
            self._load()
        return self.loaded_graph

    @gc_paused
    def _load(self) -> None:
        from ..runtime import DeviceError
        from .loaded_graph import LoadedGraph

        if self.builder is None:
            self.compile()
        if self.loaded_graph is None:
            try:
                if self.device is None:
                    self.device = self._open_device(self.image.contexts)
                self.loaded_graph = LoadedGraph(self.lowered, self.device, builder=self.builder)
            except DeviceError:
                self._drop_device()  # a half-built program's BOs go with the device
                raise

    def _open_device(self, contexts: int):
        from ..runtime import DeviceError
        from ..runtime.device_choice import make_device

        try:
            return make_device(self.kind, contexts)
        except DeviceError as e:
            if self.kind not in ("rocket", "auto"):
                raise
            raise type(e)(f"{e.message} {_rocket_hint('rocket')}", e.code) from None

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        from ..runtime import DeviceError
        from .value_checks import check_inputs

        check_inputs(self.graph, inputs)      # NaN / Inf / |x| > 65504: refused, not packed
        program = self.load()
        try:
            return program.run(inputs)
        except DeviceError:
            # A device fault (failed submit, timeout, a job that never finished, the device
            # going away) leaves BOs possibly still owned by a hung job and fds possibly dead:
            # drop the program and the device (every BO is freed), keep the lowering, and load
            # it afresh on the next call.
            self._drop_device()
            raise

    def _drop_device(self) -> None:
        program, device = self.loaded_graph, self.device
        self.loaded_graph = self.device = None
        if program is not None:
            program.close()
        if device is not None:
            device.close()

    def stats(self) -> dict[str, int]:
        if self.builder is None:
            raise RuntimeError("the program is not compiled yet; call it, or compile it with "
                               "lower(...).compile()")
        if self.loaded_graph is None:
            # not loaded yet: the image's counts and the cost model's estimate of its steps,
            # as the loaded program reports them
            from ..cost import describe, estimate
            return {**self.image.stats, **estimate(describe(self.builder)).summary()}
        return self.loaded_graph.stats()

    def report(self) -> str:
        return self.image.report() if self.image is not None else ""

    def placement(self) -> list:
        return list(self.image.placement) if self.image is not None else []

    def range_plan(self) -> list:
        """The compiled program's range-plan records (range_plan.RangeRecord)."""
        if self.lowered is None:
            raise RuntimeError("the program is compiled on its first call; call it first")
        rp = self.lowered.range_plan
        return list(rp.records) if rp is not None else []


def factory(kind: str, profile: str):
    """The backend factory of an NPU device kind for a chip profile (registered by
    rockjit/backends.py)."""
    def factory(graph: Graph, params: Mapping[str, np.ndarray],
                cores: int | None = None) -> NpuRunner:
        return NpuRunner(graph, params, kind, profile, cores)
    factory.probe = PROBES.get(kind)
    factory.npu = True      # takes cores= (backends.check_cores)
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


# "auto": the rocket device when /dev/accel/accel0 opens, else the simulator
# (runtime/bundle.py: resolve_auto, said once per process)
DEVICES = ("auto", "sim", "null", "rocket")
PROBES = {"rocket": _probe_rocket}
