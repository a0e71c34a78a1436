"""The backends of ``rockjit.compile``: a registry of factories keyed on the backend name.

``interpreter`` (the numpy reference interpreter) is defined here; the NPU backends ("auto",
"sim", "null", "rocket", and ``KIND:PROFILE`` for any registered chip profile) are made by
``lowering/backend.py`` and registered by ``register_npu_backends`` (the registry pulls them
in; the lowering never imports this module back).
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .ir.graph import Graph

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]
"""Runs a compiled graph on the inputs (graph.inputs order) and returns its outputs.  A runner
may also have ``rebind(params)``, called when resident values change; otherwise the backend's
factory is called again with the new params."""

BackendFactory = Callable[..., Runner]
"""``factory(graph, params) -> runner``; an NPU backend's also takes ``cores=`` (make_runner)."""
BACKENDS: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register ``factory(graph, params) -> runner`` as ``compile(..., backend=name)``."""

    def register(factory: BackendFactory) -> BackendFactory:
        if name in BACKENDS:
            raise ValueError(f"backend {name!r} is registered twice")
        BACKENDS[name] = factory
        return factory

    return register


@register_backend("interpreter")
def _interpreter_backend(graph: Graph, params: Mapping[str, np.ndarray]) -> Runner:
    from .ir.interpreter import run

    return lambda inputs: run(graph, inputs, dict(params))


def resolve_backend(name: str) -> None:
    """Refuse an unknown backend name (listing the known ones) or one whose probe fails."""
    if name not in BACKENDS:
        # the NPU backends are registered on first need; "KIND:CHIP" names an NPU backend for
        # any registered chip profile
        from .lowering.backend import DEVICES
        register_npu_backends("rk3588")
        kind, _, chip = name.partition(":")
        if chip and kind in DEVICES:
            register_npu_backends(chip)
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; registered backends: {sorted(BACKENDS)}")
    probe = getattr(BACKENDS[name], "probe", None)
    if probe is not None:  # e.g. rocket: refuse at compile() when there is no device to run on
        probe(name)


def check_cores(backend: str, cores: object) -> None:
    """Refuse a ``cores=`` the backend cannot honour: the interpreter has no cores, and an NPU
    backend's chip has 1 .. ``ChipProfile.cores`` of them (None: all, the default).
    ``backend`` has passed ``resolve_backend``."""
    if cores is None:
        return
    if not getattr(BACKENDS[backend], "npu", False):
        raise ValueError(f"cores={cores!r}: backend {backend!r} runs on the CPU and has no NPU "
                         f"cores to choose; drop cores= or pick an NPU backend (auto, sim, null, "
                         f"rocket)")
    from .lowering.profile import get_profile

    chip = get_profile(backend.partition(":")[2] or "rk3588")
    if isinstance(cores, bool) or not isinstance(cores, (int, np.integer)):
        raise TypeError(f"cores must be an int from 1 to {chip.cores} (or None for all of "
                        f"them), got {cores!r}")
    if not 1 <= cores <= chip.cores:
        raise ValueError(f"cores={cores}: the {chip.name} NPU has {chip.cores} cores; use 1 to "
                         f"{chip.cores}, or None (the default) for all of them")


def make_runner(backend: str, graph: Graph, params: Mapping[str, np.ndarray],
                cores: int | None = None) -> Runner:
    """``BACKENDS[backend]``'s runner; ``cores`` (checked by ``check_cores``) reaches the NPU
    backends only, which lay the program out for that many cores."""
    factory = BACKENDS[backend]
    return factory(graph, params) if cores is None else factory(graph, params, cores=int(cores))


def register_npu_backends(profile: str) -> None:
    """Register ``sim:PROFILE``, ``null:PROFILE`` and ``rocket:PROFILE`` for a chip profile
    (``get_profile`` must know it); the bare names are the RK3588's."""
    from .lowering import backend as npu
    from .lowering.profile import get_profile

    name = get_profile(profile).name
    for kind in npu.DEVICES:
        for key in ((kind, f"{kind}:{name}") if name == "rk3588" else (f"{kind}:{name}",)):
            if key not in BACKENDS:
                register_backend(key)(npu.factory(kind, name))
