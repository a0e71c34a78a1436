"""rockjit.cost: a modelled time for an NPU program on the RK3588, from published figures.

    from rockjit import cost
    est = cost.estimate(cost.describe(npu_program), clock_mhz=600)   # an Estimate, "modelled"
    cost.report(compiled)            # modelled time per step and in total, printed

The model (model.py) charges per-submit, per-job, per-kick costs, DMA bytes at a bandwidth,
MACs at the datapath rate per precision and host bytes at the A76's measured rates; its
constants (constants.py) are cited or fitted on published figures (published.py, calibrate.py)
and tests/cost checks it against the figures it was not fitted on. Every figure it prints is
labelled "modelled": none of them is a measurement.
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

from .constants import Constants
from .description import CostHostStep, CostJob, CostNpuStep, CostProgram, CostTask
from .calibrate import calibrated
from .model import LABEL, Estimate
from .model import estimate as _estimate

__all__ = ["Constants", "Estimate", "CostHostStep", "CostJob", "CostNpuStep", "CostProgram", "CostTask",
           "LABEL", "calibrated", "describe", "estimate", "report", "program_of", "to_manifest"]


def estimate(program: CostProgram, clock_mhz: float = 600.0, constants: Constants | None = None
             ) -> Estimate:
    """The modelled time of ``program``; ``constants`` default to the calibrated set."""
    return _estimate(program, clock_mhz, constants or calibrated())


def describe(npu_program: Any, host_threads: int | None = None) -> CostProgram:
    """``npu_program`` in the model's terms; host steps charged at the threads the runtime gives
    them with ``host_threads`` available (default: the runtime's default on the board, 3)."""
    from .from_program import describe as _d

    return _d(npu_program, host_threads)


def program_of(compiled: Any) -> Any:
    """The ``LoadedGraph`` behind a ``rockjit.compile``'d function's compiled object (or the
    program itself)."""
    if hasattr(compiled, "lowered") and hasattr(compiled, "steps"):
        return compiled
    runner = getattr(compiled, "_runner", None)
    prog = getattr(runner, "loaded_graph", None)
    if prog is None:
        raise ValueError("no NPU program to model: compile with an NPU backend (sim, null, "
                         "rocket) and call the function once before asking for its cost")
    return prog


def report(compiled: Any, clock_mhz: float = 600.0, file: TextIO | None = None,
           constants: Constants | None = None) -> Estimate:
    """Print the modelled time of each step and the total; returns the Estimate."""
    out = file or sys.stdout
    est = estimate(describe(program_of(compiled)), clock_mhz, constants)
    print(f"{LABEL} time at NPU {clock_mhz:g} MHz (rockjit.cost; not a measurement)", file=out)
    print(f"{'step':>5} {'kind':4} {'modelled ms':>11} {'dispatch':>9} {'dma':>9} {'mac':>9} "
          f"{'host':>9}  what", file=out)
    for i, s in enumerate(est.steps):
        b = s.buckets
        print(f"{i:5d} {s.kind:4} {s.ms:11.4f} {b['dispatch']:9.4f} {b['dma']:9.4f} "
              f"{b['mac']:9.4f} {b['host']:9.4f}  {s.label}", file=out)
    tot = est.bucket_ms()
    print(f"{'total':>5} {'':4} {est.ms:11.3f} {tot['dispatch']:9.3f} {tot['dma']:9.3f} "
          f"{tot['mac']:9.3f} {tot['host']:9.3f}  ({LABEL} ms)", file=out)
    return est


def to_manifest(est: Estimate) -> dict[str, Any]:
    """``est`` as plain JSON data for a bundle's manifest: the label, the clock, the total and
    its buckets, and every step's kind, label, time and buckets (milliseconds)."""
    return {"label": est.label, "clock_mhz": est.clock_mhz, "total_ms": est.ms,
            "buckets_ms": est.bucket_ms(),
            "steps": [{"kind": s.kind, "label": s.label, "ms": s.ms, "buckets_ms": s.buckets}
                      for s in est.steps]}
