"""Fit the cost model's constants on the published figures marked ``fit``.

Each fitted constant is solved from its own figure with the others held fixed (the model's time
is monotone in every constant, so bisection finds it), repeated until the constants settle
(the dispatch figures share terms with each other). A figure that cannot be met with a
non-negative constant stops the fit with an error that names it.
"""
from __future__ import annotations

from functools import lru_cache

from .constants import Constants
from .description import CostProgram
from .model import estimate
from .published import FIGURES, Figure


@lru_cache(maxsize=None)
def _program(fig: Figure) -> CostProgram:
    return fig.build()

_START = Constants(submit_us=30.0, job_us=20.0, kick_us=10.0, dma_gbps=2.0, fill_us=0.0)
# search interval per constant (dma_gbps is solved on its reciprocal's scale below)
_RANGE = {"submit_us": (0.0, 1e4), "job_us": (0.0, 1e4), "kick_us": (0.0, 1e4), "fill_us": (0.0, 1e4),
          "dma_gbps": (0.01, 1e3)}


def modelled_ms(fig: Figure, c: Constants) -> float:
    if fig.kernel == "keep_attached":
        c = c.keep_attached()
    return estimate(_program(fig), fig.clock_mhz, c).ms


def _solve(fig: Figure, c: Constants) -> Constants:
    name = fig.fits
    lo, hi = _RANGE[name]
    # time rises with every *_us constant and falls with dma_gbps
    rising = name != "dma_gbps"

    def f(v: float) -> float:
        return modelled_ms(fig, c.replace(**{name: v})) - fig.ms

    flo, fhi = f(lo), f(hi)
    if flo * fhi > 0:
        floor = fig.ms + min(flo, fhi)
        raise ValueError(f"cost model fit: no {name} in [{lo:g}, {hi:g}] gives figure "
                         f"{fig.name!r} ({fig.ms:g} ms); the other constants give {floor:.4g} ms "
                         f"at best. Revisit the figure's description or the model's terms "
                         f"(rockjit/cost/published.py, model.py)")
    for _ in range(60):
        mid = (lo + hi) / 2 if rising else (lo * hi) ** 0.5
        if (f(mid) > 0) == rising:
            hi = mid
        else:
            lo = mid
    return c.replace(**{name: (lo + hi) / 2})


def fit(rounds: int = 50) -> Constants:
    c = _START
    fitted = [f for f in FIGURES if f.fits]
    for _ in range(rounds):
        prev = c
        for fig in fitted:
            c = _solve(fig, c)
        if all(abs(getattr(c, f.fits) - getattr(prev, f.fits)) <= 1e-9 * getattr(c, f.fits)
               for f in fitted):
            break
    return c


@lru_cache(maxsize=1)
def calibrated() -> Constants:
    """The constants fitted on the published figures, cached."""
    return fit()


def precisions(fig: Figure) -> frozenset[str]:
    """The datapath precisions a figure's program runs MACs at (empty: a dispatch probe)."""
    prog = _program(fig)
    return frozenset(p for step in prog.steps for job in getattr(step, "jobs", ())
                     for task in job.tasks for p, n in task.macs.items() if n)


def held_out_ratios(c: Constants | None = None) -> dict[str, float]:
    """Published over modelled time for every figure the fit did not use: how far the model
    missed on what it was not fitted to, the model's own error band."""
    c = c or calibrated()
    return {f.name: f.ms / modelled_ms(f, c) for f in FIGURES if not f.fits}


def error_band(precision: str | None = None, c: Constants | None = None) -> tuple[float, float]:
    """The least and greatest held-out ratio (``held_out_ratios``), over every held-out figure
    or, with ``precision``, over those whose MACs run at that precision alone or that run none
    (dispatch probes): multiply a modelled time by the two to bracket what the published
    figures suggest silicon would take."""
    c = c or calibrated()
    ratios = held_out_ratios(c)
    held = [f for f in FIGURES if not f.fits]
    if precision is not None:
        if not any(precisions(f) == {precision} for f in held):
            raise ValueError(f"no held-out figure runs MACs at precision {precision!r}; "
                             f"held-out precisions: "
                             f"{sorted(set().union(*(precisions(f) for f in held)))}")
        held = [f for f in held if precisions(f) <= {precision}]
    keep = [ratios[f.name] for f in held]
    return min(keep), max(keep)
