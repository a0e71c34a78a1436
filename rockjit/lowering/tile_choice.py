"""Which legal tiling of a conv or matmul runs: the one of least modelled time (issue 9).

tiling.candidates lists every tiling the hardware rules allow, each with the fixed rule's cost
(``tasks + bytes_moved / cbuf_bytes``). This module prices them with the cost model (rockjit.cost)
as the emitter will run them: the same jobs (one per reuse group, emitters/reuse.py, when the
emitter keeps a CBUF operand; one per tile otherwise), each job's DMA bytes and MACs, one kick
per job on a chainable precision, the jobs spread over the cores largest first, and a host step
for integer K partials. The model reproduces the published tile-shape ordering it was not
fitted on (tests/cost/test_tile_ordering.py).

The rule's pick stands unless the model finds a plan faster by more than ``MARGIN``: below that
the difference is within what the model resolves (its held-out figures are within 1.5x,
tests/cost). The model may only pick tiles at least as tall as wide (``_tall``: the measured
direction no figure sizes), with the rule's K steps (``_same_k_steps``).
Every plan carries its ``TileChoice``; ``describe()`` names an overruled rule.

Pricing every candidate exactly (a reuse grouping each) would cost a large matmul hundreds of
milliseconds, so a closed form (the cheaper reuse mode's bytes and the MACs, spread over the
cores) shortlists ``SHORTLIST`` plans and only those, with the rule's, are priced exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..cost.calibrate import calibrated
from ..cost.description import CostHostStep, CostJob, CostNpuStep, CostProgram, CostTask
from ..cost.model import estimate, mac_rate
from .emitters.reuse import TileBytes, reuse_groups, single_groups
from .bounds import MAX_TASKS_PER_OP
from .compile_cache import memo
from .profile import ChipProfile
from .tiling import KACC_DPU, KACC_HOST, PARTIAL_ESIZE, ConvPlan, ConvShape, candidates, rule_choice

MARGIN = 0.01        # overrule the rule only for a plan modelled > 1 % faster
SHORTLIST = 4
CLOCK_MHZ = 600.0    # the board's NPU clock the cost model is calibrated at (rockjit.cost)


@dataclass(frozen=True)
class TileChoice:
    """One shape's decision: the plan run and the rule's, with their modelled times."""

    plan: str
    rule_plan: str
    modelled_ms: float
    rule_ms: float

    @property
    def agrees(self) -> bool:
        return self.plan == self.rule_plan

    def describe(self) -> str:
        if self.agrees:
            return f"{self.plan}: modelled {self.modelled_ms:.4f} ms; rule kept"
        return (f"{self.plan}: modelled {self.modelled_ms:.4f} ms; rule's {self.rule_plan} "
                f"modelled {self.rule_ms:.4f} ms overruled")


def plan_conv(shape: ConvShape, profile: ChipProfile, *, max_rows: int | None = None,
              max_kernels: int | None = None, max_channels: int | None = None,
              max_k_steps: int | None = None, reuse: bool = False, images: int = 1) -> ConvPlan:
    """The tiling of ``shape`` to run (module docstring); ``max_*`` cap the tile sizes
    (tiling.candidates); ``reuse``: the emitter keeps CBUF operands across tasks
    (emitters/reuse.py; matmuls); ``images``: products of this plan sharing the step's cores
    (a batch). Planned once per shape in a compile (compile_cache.py)."""
    caps = dict(max_rows=max_rows, max_kernels=max_kernels, max_channels=max_channels,
                max_k_steps=max_k_steps)
    return memo(("plan_conv", shape, profile, tuple(caps.values()), reuse, images),
                lambda: _choose(candidates(shape, profile, **caps), profile, reuse, images))


def _choose(plans: tuple[ConvPlan, ...], profile: ChipProfile, reuse: bool,
            images: int) -> ConvPlan:
    rule = rule_choice(plans)
    if rule.tasks * images > MAX_TASKS_PER_OP:
        # past the bound the op is refused (bounds.check_tasks, with its size and source line)
        # right after planning: pricing ~10^5 tiles first made that refusal take minutes
        return replace(rule, choice=TileChoice(rule.describe(), rule.describe(), float("nan"),
                                               float("nan")))
    rule_ms = modelled_ms(rule, profile, reuse, images)
    best, best_ms = rule, rule_ms
    tall = [p for p in plans if _tall(p) and _same_k_steps(p, rule)]
    if tall:
        short = sorted(tall, key=lambda p: _quick_ms(p, profile, reuse, images))[:SHORTLIST]
        for p in short:
            if p is rule:
                continue
            ms = modelled_ms(p, profile, reuse, images)
            if ms < best_ms:
                best, best_ms = p, ms
        if best_ms >= rule_ms * (1 - MARGIN):
            best, best_ms = rule, rule_ms
    return replace(best, choice=TileChoice(best.describe(), rule.describe(), best_ms, rule_ms))


def _tall(plan: ConvPlan) -> bool:
    """Output tiles at least as tall (output positions) as wide (output channels), or all the
    rows in one tile. notes perf/asymmetric-tile.md: Mt=128 / Nt=256 measured slower than
    Mt=256 / Nt=128 ("keep the input-feature height full"). The model sees no difference once
    the emitter keeps the weights instead of the feature (WEIGHT_REUSE, emitters/reuse.py) and no
    published figure sizes one, so the measured direction is kept as a constraint on what the
    model may pick over the rule."""
    s = plan.shape
    return len(plan.rows) == 1 or \
        max(r.out_rows for r in plan.rows) * s.out_w >= max(k.size for k in plan.kernels)


def _same_k_steps(plan: ConvPlan, rule: ConvPlan) -> bool:
    """The rule's K steps exactly. Every output's fp32 partial sums then add in the rule's
    order, so the choice moves work between tiles, jobs and cores but never an output bit.
    Other K splits changed the numerics: taking a split K into one pass dropped ModernBERT-base
    T=512's worst row cosine 0.99972 -> 0.99892 (tests/models/test_modernbert_sim.py), and other
    step sizes moved the real Whisper-base max relative error 2.760e-2 -> 2.794e-2
    (tests/models/test_real_whisper.py); the numerics issue's figures may not get worse."""
    return plan.channels == rule.channels


def _precision(plan: ConvPlan) -> str:
    return "int8" if plan.shape.in_dtype.is_int else "fp16"


def _tile_macs(plan: ConvPlan, r: int, j: int) -> int:
    s = plan.shape
    ch = 1 if s.depthwise else s.channels
    return plan.rows[r].out_rows * s.out_w * plan.kernels[j].size * s.kh * s.kw * ch


def _host_partial_bytes(plan: ConvPlan) -> int:
    # integer K partials: the host reads every K step's int32 cube and writes the sum
    s = plan.shape
    if plan.kacc != KACC_HOST:
        return 0
    return (plan.k_steps + 1) * s.out_h * s.out_w * s.kernels * PARTIAL_ESIZE


def modelled_ms(plan: ConvPlan, profile: ChipProfile, reuse: bool, images: int = 1) -> float:
    """The modelled time (ms, rockjit.cost at ``CLOCK_MHZ``) of ``images`` products of ``plan``
    run as the emitter runs them (module docstring)."""
    groups = (reuse_groups(plan, profile, images) if reuse else single_groups(plan)) * images
    tb = TileBytes(plan, profile)
    prec = _precision(plan)
    chainable = profile.input(plan.shape.in_dtype).chainable
    jobs = []
    for mode, tiles in groups:
        macs = sum(_tile_macs(plan, r, j) for r, j in tiles)
        ntasks = len(tiles) * plan.k_steps
        nbytes = tb.group(mode, tiles)
        # shared evenly: every task fills the CBUF (the model's fill_us), the sums are the job's
        tasks = [CostTask({prec: macs // ntasks}, max(1, nbytes // ntasks))] * ntasks
        jobs.append(((nbytes, macs), tasks, 1 if chainable else ntasks))
    # largest first onto the least loaded core (placement spreads a step's jobs likewise)
    c = calibrated()
    mrate = mac_rate(c, prec, CLOCK_MHZ)

    def weight(job: tuple) -> float:
        nbytes, macs = job[0]
        return nbytes / (c.dma_gbps * 1e9) + macs / mrate

    load = [0.0] * max(1, profile.cores)
    out: list[CostJob] = []
    for job in sorted(jobs, key=weight, reverse=True):
        core = load.index(min(load))
        load[core] += weight(job)
        out.append(CostJob(core, job[1], job[2]))
    steps: list = [CostNpuStep(out)]
    host = _host_partial_bytes(plan) * images
    if host:
        steps.append(CostHostStep("gather", host))
    return estimate(CostProgram(steps), CLOCK_MHZ, c).ms


def _quick_ms(plan: ConvPlan, profile: ChipProfile, reuse: bool, images: int) -> float:
    """A closed-form stand-in for ``modelled_ms`` to shortlist plans: the cheaper reuse mode's
    bytes (one chain per row or kernel tile) and the MACs, spread evenly over the cores."""
    s = plan.shape
    p = profile.input(s.in_dtype)
    nr, nn = len(plan.rows), len(plan.kernels)
    ch = sum(c.size for c in plan.channels)
    # every row tile's input rows over the whole channel extent (a depthwise tile reads only its
    # own channels, so its feature is read once in all), the weights once per row tile, the
    # output with its K partials (emitters/reuse.py TileBytes, summed)
    feat = sum(r.in_rows for r in plan.rows) * s.width * ch * p.esize
    wt = sum(k.size for k in plan.kernels) * s.kh * s.kw * (1 if s.depthwise else ch) * p.esize
    part = 2 * 4 * (plan.k_steps - 1) if plan.kacc == KACC_DPU else 0
    other = s.out_h * s.out_w * s.kernels * (profile.output(s.in_dtype, s.out_dtype).esize + part)
    if s.depthwise:
        nbytes = feat + wt * nr + other
    else:
        nbytes = feat * nn + wt * nr + other
        if reuse:
            nbytes = min(nbytes, feat + wt * nr + other, wt + feat * nn + other)
    c = calibrated()
    macs = s.out_h * s.out_w * s.kernels * s.kh * s.kw * (1 if s.depthwise else s.channels)
    spread = (nbytes / (c.dma_gbps * 1e9) + macs / mac_rate(c, _precision(plan), CLOCK_MHZ))
    host = _host_partial_bytes(plan) / (c.host_gather_gbps * 1e9)
    fills = nr * nn * plan.k_steps * c.fill_us * 1e-6
    return ((spread + fills) * images / min(profile.cores, nr * nn * images) + host * images) * 1e3
