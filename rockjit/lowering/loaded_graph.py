"""A compiled graph on a device: the program image (image_builder.py) loaded by the runtime
(runtime/program.py: LoadedImage).

Run (per call): write the inputs (cast to the dtype the plan holds them in), ``Program.run()``
(the whole step list in one C call), read the outputs (cast back to the graph's dtypes).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .image_builder import ImageBuilder
from .lowered import LoweredGraph


class LoadedGraph:
    """A compiled graph on a device: the image (``image``) loaded there (``loaded``);
    ``run(inputs) -> outputs``, ``stats()``, ``report()``."""

    def __init__(self, lowered: LoweredGraph, device: Any, cores: int | None = None,
                 builder: ImageBuilder | None = None) -> None:
        """``builder``: the image already laid out for ``lowered`` (reused when it has the
        device's context count, so compile-then-load does not lay it out twice)."""
        from ..runtime.program import load_image

        self.lowered = lowered
        self.device = device
        self.cores = cores or lowered.profile.cores
        contexts = min(self.cores, getattr(device, "cores", 1))
        if builder is None or builder.lowered is not lowered or builder.ncores != contexts:
            builder = ImageBuilder(lowered, contexts, self.cores)
        self.builder = builder
        self.image = self.builder.image
        self.plan = self.builder.plan
        self.steps = self.builder.steps
        self.context_bos = self.builder.context_bos
        self.job_cores = self.builder.job_cores
        self.ncores = self.builder.ncores
        self.weights_bytes = self.builder.weights_bytes
        self.regcmd_bytes = self.builder.regcmd_bytes
        self.arena_bytes = self.builder.arena_bytes
        self.loaded = load_image(self.image, device)
        self.program = self.loaded.program

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.lowered.graph
        if len(inputs) != len(g.inputs):
            from ..errors import TraceError
            raise TraceError(f"graph {g.name!r} takes {len(g.inputs)} input(s), got {len(inputs)}")
        outs = self.loaded.run(inputs)
        self._check_finite(inputs, outs)
        return outs

    def _check_finite(self, inputs: Sequence[np.ndarray], outs: list[np.ndarray]) -> None:
        """Finite inputs must give finite outputs: an inf/NaN then means an fp16 value
        overflowed where the range plan had only the input assumption to go on (the norm
        rewrite turns an overflowed deviation into NaN rather than the LayerNorm bias), so it is
        reported, never returned as a result."""
        def finite(a) -> bool:
            a = np.asarray(a)
            return a.dtype.kind != "f" or bool(np.isfinite(a).all())

        if getattr(self.device, "kind", "") == "null":
            return              # the null device computes nothing: its outputs mean nothing
        if all(finite(o) for o in outs) or not all(finite(x) for x in inputs):
            return
        from ..errors import NumericsError
        bad = [i for i, o in enumerate(outs) if not finite(o)]
        rp = self.lowered.range_plan
        suspects = [r for r in (rp.records if rp is not None else []) if r.action == "assumed"]
        lines = "\n".join(f"  {r}" for r in suspects[:12])
        more = f"\n  ... and {len(suspects) - 12} more" if len(suspects) > 12 else ""
        raise NumericsError(
            f"output(s) {bad} of {self.lowered.graph.name!r} hold inf/NaN although every input "
            f"is finite: a value computed in fp16 on the NPU left fp16's range (65504). The "
            f"range plan could not bound these values and assumed they stay in range:\n{lines}"
            f"{more}\nScale the inputs (or the weights feeding them) down, or keep the "
            f"computation in float32 outside the compiled function.")

    __call__ = run

    @property
    def range_plan(self) -> list:
        """The range plan's records (value, op, source line, bound, action), one per float
        value the program computes (range_plan.RangeRecord)."""
        rp = self.lowered.range_plan
        return list(rp.records) if rp is not None else []

    def stats(self) -> dict[str, int]:
        """Per-run counts from the plan, plus the runtime's cumulative counters (``rt_*``),
        plus ``modelled_*``: the cost model's estimate at 600 MHz (rockjit.cost; a model, not
        a measurement)."""
        out = self.loaded.stats()
        if getattr(self, "_modelled", None) is None:
            from ..cost import describe, estimate
            self._modelled = estimate(describe(self)).summary()
        out.update(self._modelled)
        return out

    def report(self) -> str:
        """Where every op ran and why (one line per IR node)."""
        return self.image.report()

    def close(self) -> None:
        self.loaded.close()
