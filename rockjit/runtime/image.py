"""The program image: what the lowering produces and the runtime loads, as plain data.

Everything a device needs to run a compiled graph, and nothing that points back into the
compiler: the BOs (role, context, size), the bytes uploaded into them once (packed resident
weights, host-op descriptors), the regcmd words of every regcmd BO, the relocations that patch
address words at load, the jobs, the step list (NPU steps and host steps, each with the source
location of the op it came from), and the input/output signatures (where each boundary tensor
lives, in which dtype it is stored). The same image feeds the simulator, the rocket device and a
bundle (runtime/bundle.py stores it on disk). Importing this module imports no JAX and no
compiler code.

Arrays (weights, regcmd words, relocations) live in ``ProgramImage.arrays`` by name; the rest
is JSON-able (``to_json``/``from_json``), so a bundle is JSON + safetensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

IMAGE_VERSION = 1

BO_ROLES = ("arena", "weights", "regcmd", "io")
OPERAND_FIELDS = 4      # (bo, offset, dtype, row_stride)
RELOC_FIELDS = 5        # (regcmd_bo, word_index, target_bo, target_offset, keep_mask)


class ImageError(ValueError):
    """An image whose structure is inconsistent (an index out of range, a missing array)."""


@dataclass(frozen=True)
class BoSpec:
    role: str
    core: int
    size: int


@dataclass(frozen=True)
class Upload:
    """``arrays[array]`` (bytes) written at ``offset`` of BO ``bo`` once, before the first run."""

    bo: int
    offset: int
    array: str


@dataclass(frozen=True)
class ZeroFill:
    """``size`` zero bytes at ``offset`` of BO ``bo`` (padding that must read as zero)."""

    bo: int
    offset: int
    size: int


@dataclass(frozen=True)
class Words:
    """``arrays[array]`` (u64 regcmd words) written from word ``word_index`` of BO ``bo``."""

    bo: int
    word_index: int
    array: str


@dataclass(frozen=True)
class Source:
    """Where a step came from: the IR node label, the user's file:line, the emitter."""

    node: str
    loc: str
    emitter: str


@dataclass(frozen=True)
class JobSpec:
    """One SUBMIT job: ``tasks`` are (regcmd BO, byte offset, word count); ``source`` is the
    op its tasks come from (index into ProgramImage.sources)."""

    core: int
    chained: bool
    tasks: tuple[tuple[int, int, int], ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    source: int = -1


@dataclass(frozen=True)
class HostStepSpec:
    """A host step: ``kind`` names a runtime host-step constructor (host_steps.HOST_STEPS);
    ``operands`` maps the constructor's operand names to (bo, offset, dtype, row_stride);
    ``params`` are its layout parameters (ints/floats)."""

    kind: str
    operands: Mapping[str, tuple[int, int, str, int]]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepSpec:
    """An NPU step (``jobs``: job indices submitted together) or a host step (``host``)."""

    kind: str                      # "npu" | "host"
    jobs: tuple[int, ...] = ()
    host: HostStepSpec | None = None
    source: int = -1               # index into ProgramImage.sources (-1: pipeline-made)


@dataclass(frozen=True)
class TensorSig:
    """A graph input or output: the logical ``shape`` and ``dtype`` (numpy names) the user
    passes or gets, and where the runtime keeps it (``bo``/``offset``, stored as
    ``storage_dtype`` row-major). An input the program reads in two dtypes has two entries
    with the same ``index`` (each written on every call)."""

    name: str
    index: int
    shape: tuple[int, ...]
    dtype: str
    storage_dtype: str
    bo: int
    offset: int


@dataclass(frozen=True)
class Placement:
    """Where one IR op ran and why (the placement report)."""

    node: str
    loc: str
    where: str          # "npu" | "host" | "view" | "const"
    how: str
    why: str = ""


@dataclass(frozen=True)
class CorePlacement:
    """How many cores one NPU step's jobs use and the modelled costs that chose it
    (lowering/placement.py). Informational: the jobs' ``core`` fields are what runs."""

    node: str
    jobs: int
    cores: int
    rule_cores: int     # round-robin over every core (the fixed rule)
    why: str            # the modelled cost of each number of cores tried


@dataclass(frozen=True)
class TilingChoice:
    """The tiling one conv/matmul op runs and whether the fixed rule's pick was kept
    (lowering/tile_choice.py). Informational: the tasks are what runs."""

    node: str
    agrees: int         # 1: the rule's tiling kept; 0: the cost model overruled it
    why: str            # both tilings with their modelled times


@dataclass
class ProgramImage:
    profile: str
    contexts: int
    bos: list[BoSpec]
    uploads: list[Upload]
    zero_fills: list[ZeroFill]
    words: list[Words]
    relocs: str                    # name of the (n, 5) u64 array in ``arrays``
    jobs: list[JobSpec]
    steps: list[StepSpec]
    inputs: list[TensorSig]
    outputs: list[TensorSig]
    sources: list[Source]
    placement: list[Placement]
    stats: dict[str, int]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    version: int = IMAGE_VERSION
    core_placement: list[CorePlacement] = field(default_factory=list)
    tilings: list[TilingChoice] = field(default_factory=list)

    # ---------------------------------------------------------------- checks
    def check(self) -> None:
        """Every index in range, every named array present with the right dtype: a loader
        never hands the C runtime an image it would have to guess about."""
        nb = len(self.bos)
        sizes = [b.size for b in self.bos]
        # the loops below run once per upload, job, task and host operand (~10^4 each on a
        # whole model, twice per compile: built, then loaded): the BO test is inlined and
        # the dtypes made once
        u8, u64 = np.dtype("uint8"), np.dtype("uint64")

        def bo(i: Any, what: str) -> None:
            if not isinstance(i, int) or not 0 <= i < nb:
                raise ImageError(f"{what} names BO {i!r}; the image has {nb}")

        def arr(name: str, dtype: np.dtype, what: str) -> np.ndarray:
            a = self.arrays.get(name)
            if a is None:
                raise ImageError(f"{what} names array {name!r}, which the image lacks")
            if a.dtype != dtype:
                raise ImageError(f"{what}: array {name!r} is {a.dtype}, expected {dtype}")
            return a

        for k, b in enumerate(self.bos):
            if b.role not in BO_ROLES or not isinstance(b.size, int) or b.size <= 0 \
                    or not isinstance(b.core, int) or not 0 <= b.core < max(self.contexts, 1):
                raise ImageError(f"BO {k} ({b}) has a bad role, size or context")
        arrays = self.arrays
        for u in self.uploads:
            i = u.bo
            if not isinstance(i, int) or not 0 <= i < nb:
                bo(i, "an upload")
            a = arrays.get(u.array)
            if a is None or a.dtype != u8:
                a = arr(u.array, u8, "an upload")
            if u.offset < 0 or u.offset + a.size > sizes[i]:
                raise ImageError(f"upload {u.array!r} ({a.size} bytes at {u.offset}) does not "
                                 f"fit BO {u.bo} ({self.bos[u.bo].size} bytes)")
        for z in self.zero_fills:
            bo(z.bo, "a zero fill")
            if z.offset < 0 or z.size < 0 or z.offset + z.size > self.bos[z.bo].size:
                raise ImageError(f"zero fill {z} does not fit its BO")
        for w in self.words:
            bo(w.bo, "regcmd words")
            a = arr(w.array, u64, "regcmd words")
            if w.word_index < 0 or 8 * (w.word_index + a.size) > self.bos[w.bo].size:
                raise ImageError(f"regcmd words {w.array!r} do not fit BO {w.bo}")
        r = arr(self.relocs, u64, "the relocation table")
        if r.ndim != 2 or r.shape[1] != RELOC_FIELDS:
            raise ImageError(f"the relocation table has shape {r.shape}, expected (n, 5)")
        ncontexts, nsources, njobs = max(self.contexts, 1), len(self.sources), len(self.jobs)
        for j, job in enumerate(self.jobs):
            if not 0 <= job.core < ncontexts:
                raise ImageError(f"job {j} runs on context {job.core} of {self.contexts}")
            for t in job.tasks:
                i = t[0]
                if not isinstance(i, int) or not 0 <= i < nb:
                    bo(i, f"a task of job {j}")
                if t[1] < 0 or t[2] <= 0 or t[1] + 8 * t[2] > sizes[i]:
                    raise ImageError(f"task {t} of job {j} does not fit its regcmd BO")
            for b in (*job.reads, *job.writes):
                if not isinstance(b, int) or not 0 <= b < nb:
                    bo(b, f"job {j}'s BO list")
            if job.source != -1 and not 0 <= job.source < nsources:
                raise ImageError(f"job {j}'s source {job.source} is out of range")
        for s in self.steps:
            if s.kind == "npu":
                for j in s.jobs:
                    if not isinstance(j, int) or not 0 <= j < njobs:
                        raise ImageError(f"an NPU step names job {j!r} of {len(self.jobs)}")
            elif s.kind == "host":
                if s.host is None:
                    raise ImageError("a host step without its description")
                for name, op in s.host.operands.items():
                    if len(op) != OPERAND_FIELDS:
                        raise ImageError(f"host step operand {name!r} is {op!r}")
                    i = op[0]
                    if not isinstance(i, int) or not 0 <= i < nb:
                        bo(i, f"host step {s.host.kind} operand {name!r}")
                    if not 0 <= op[1] <= sizes[i] or not 0 <= op[3] < 1 << 32:
                        raise ImageError(f"host step {s.host.kind} operand {name!r} {op} is "
                                         f"outside its BO")
            else:
                raise ImageError(f"step kind {s.kind!r} is neither 'npu' nor 'host'")
            if s.source != -1 and not 0 <= s.source < nsources:
                raise ImageError(f"a step's source {s.source} is out of range")
        for which, sigs in (("input", self.inputs), ("output", self.outputs)):
            logical = self.signature(which)
            if any(x is None for x in logical):
                raise ImageError(f"the {which} indices of the image have gaps")
        for sig in (*self.inputs, *self.outputs):
            bo(sig.bo, f"boundary tensor {sig.name!r}")
            # Python ints: a hostile shape must not wrap around int64 to a small size
            n = math.prod(sig.shape) * np.dtype(sig.storage_dtype).itemsize
            if sig.offset < 0 or sig.offset + n > self.bos[sig.bo].size:
                raise ImageError(f"boundary tensor {sig.name!r} does not fit its BO")

    def signature(self, which: str = "input") -> list["TensorSig | None"]:
        """One entry per logical input (or output), by index: what a caller passes (gets).
        Entries of one index must agree in shape and dtype."""
        sigs = self.inputs if which == "input" else self.outputs
        n = max((s.index for s in sigs), default=-1) + 1
        out: list[TensorSig | None] = [None] * n
        for s in sigs:
            if not 0 <= s.index < n:
                raise ImageError(f"boundary tensor {s.name!r} has index {s.index}")
            o = out[s.index]
            if o is not None and (o.shape != s.shape or o.dtype != s.dtype):
                raise ImageError(f"two placements of {which} {s.index} disagree: {o} / {s}")
            out[s.index] = out[s.index] or s
        return out

    # ---------------------------------------------------------------- JSON form
    def to_json(self) -> dict[str, Any]:
        """Everything but ``arrays``, as JSON-able data (by hand: dataclasses.asdict deep-copies
        every field and took seconds on a whole model)."""
        def flat(x: Any) -> dict[str, Any]:
            return {f: getattr(x, f) for f in x.__dataclass_fields__}

        return {
            "profile": self.profile, "contexts": self.contexts, "version": self.version,
            "bos": [flat(b) for b in self.bos], "uploads": [flat(u) for u in self.uploads],
            "zero_fills": [flat(z) for z in self.zero_fills],
            "words": [flat(w) for w in self.words], "relocs": self.relocs,
            "jobs": [{"core": j.core, "chained": j.chained, "tasks": [list(t) for t in j.tasks],
                      "reads": list(j.reads), "writes": list(j.writes), "source": j.source}
                     for j in self.jobs],
            "steps": [{"kind": st.kind, "jobs": list(st.jobs), "source": st.source,
                       "host": None if st.host is None else {
                           "kind": st.host.kind,
                           "operands": {k: list(v) for k, v in st.host.operands.items()},
                           "params": dict(st.host.params)}} for st in self.steps],
            "inputs": [dict(flat(t), shape=list(t.shape)) for t in self.inputs],
            "outputs": [dict(flat(t), shape=list(t.shape)) for t in self.outputs],
            "sources": [flat(x) for x in self.sources],
            "placement": [flat(x) for x in self.placement],
            "core_placement": [flat(x) for x in self.core_placement],
            "tilings": [flat(x) for x in self.tilings],
            "stats": dict(self.stats),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "ProgramImage":
        """The inverse of ``to_json``; raises ImageError (never KeyError/TypeError) on data of
        the wrong shape."""
        try:
            steps = []
            for s in d["steps"]:
                host = None
                if s.get("host") is not None:
                    h = s["host"]
                    host = HostStepSpec(str(h["kind"]),
                                        {str(k): _operand(v) for k, v in h["operands"].items()},
                                        {str(k): _scalar(v) for k, v in h["params"].items()})
                steps.append(StepSpec(str(s["kind"]), tuple(_int(j) for j in s["jobs"]), host,
                                      _int(s["source"])))
            img = cls(
                profile=str(d["profile"]), contexts=_int(d["contexts"]),
                bos=[BoSpec(str(b["role"]), _int(b["core"]), _int(b["size"])) for b in d["bos"]],
                uploads=[Upload(_int(u["bo"]), _int(u["offset"]), str(u["array"]))
                         for u in d["uploads"]],
                zero_fills=[ZeroFill(_int(z["bo"]), _int(z["offset"]), _int(z["size"]))
                            for z in d["zero_fills"]],
                words=[Words(_int(w["bo"]), _int(w["word_index"]), str(w["array"]))
                       for w in d["words"]],
                relocs=str(d["relocs"]),
                jobs=[JobSpec(_int(j["core"]), bool(j["chained"]),
                              tuple(tuple(_int(x) for x in t) for t in j["tasks"]),
                              tuple(_int(x) for x in j["reads"]),
                              tuple(_int(x) for x in j["writes"]), _int(j["source"]))
                      for j in d["jobs"]],
                steps=steps,
                inputs=[_sig(s) for s in d["inputs"]], outputs=[_sig(s) for s in d["outputs"]],
                sources=[Source(str(s["node"]), str(s["loc"]), str(s["emitter"]))
                         for s in d["sources"]],
                placement=[Placement(str(p["node"]), str(p["loc"]), str(p["where"]),
                                     str(p["how"]), str(p["why"])) for p in d["placement"]],
                stats={str(k): _int(v) for k, v in d["stats"].items()},
                arrays=dict(arrays), version=_int(d["version"]),
                core_placement=[CorePlacement(str(p["node"]), _int(p["jobs"]), _int(p["cores"]),
                                              _int(p["rule_cores"]), str(p["why"]))
                                for p in d.get("core_placement", [])],
                tilings=[TilingChoice(str(t["node"]), _int(t["agrees"]), str(t["why"]))
                         for t in d.get("tilings", [])])
        except ImageError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ImageError(f"the image description is malformed ({type(e).__name__}: {e})") \
                from None
        for t in (*(j.tasks for j in img.jobs),):
            for task in t:
                if len(task) != 3:
                    raise ImageError(f"a task is {task!r}, expected (bo, offset, words)")
        img.check()
        return img

    # ---------------------------------------------------------------- reports
    def report(self) -> str:
        """Where every op ran and why (one line per IR node)."""
        lines = []
        for d in self.placement:
            why = f"  [{d.why}]" if d.why else ""
            lines.append(f"{d.node:<28} {d.where:<5} {d.how:<32} {d.loc}{why}")
        return "\n".join(lines)

    def core_report(self) -> str:
        """One line per NPU step whose jobs could spread: the cores it uses and why."""
        return "\n".join(f"{c.node:<28} {c.cores} core(s)  {c.why}" for c in self.core_placement)

    def tiling_report(self) -> str:
        """One line per conv/matmul tiling: the plan run and, when overruled, the rule's."""
        return "\n".join(f"{t.node:<28} {t.why}" for t in self.tilings)

    def step_list(self) -> str:
        """One line per step: NPU jobs/tasks or the host step kind, and the op's source."""
        lines = []
        for i, s in enumerate(self.steps):
            src = self.sources[s.source] if s.source >= 0 else None
            at = f"{src.node}  {src.loc or f'[{src.emitter}]'}" if src else \
                "[cross-context copy]"
            if s.kind == "npu":
                tasks = sum(len(self.jobs[j].tasks) for j in s.jobs)
                cores = sorted({self.jobs[j].core for j in s.jobs})
                what = f"npu  {len(s.jobs)} job(s) {tasks} task(s) cores {cores}"
                ops = {self.jobs[j].source for j in s.jobs}
                if len(ops) > 1:
                    # a merged step (attention heads, batched matmuls side by side; adjacent
                    # context-0 steps in order, lowering/coalesce.py): one line per step
                    at += f"  (+{len(ops) - 1} more op(s) in this step)"
            else:
                what = f"host {s.host.kind}"
            lines.append(f"{i:5d}  {what:<42} {at}")
        return "\n".join(lines)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ImageError(f"expected an integer, got {v!r:.40}")
    return v


def _scalar(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ImageError(f"expected a number, got {v!r:.40}")
    return v


def _operand(v: Any) -> tuple[int, int, str, int]:
    if not isinstance(v, (list, tuple)) or len(v) != OPERAND_FIELDS:
        raise ImageError(f"a host-step operand is {v!r:.60}, expected [bo, offset, dtype, stride]")
    return (_int(v[0]), _int(v[1]), str(v[2]), _int(v[3]))


def _sig(s: Mapping[str, Any]) -> TensorSig:
    shape = tuple(_int(x) for x in s["shape"])
    if any(x < 0 for x in shape):
        raise ImageError(f"boundary tensor {s['name']!r} has a negative dimension")
    for key in ("dtype", "storage_dtype"):
        try:
            dt = np.dtype(s[key]) if isinstance(s[key], str) else None
        except TypeError:
            dt = None
        if dt is None or dt.kind not in "biuf":
            raise ImageError(f"boundary tensor {s['name']!r} has {key} {s[key]!r:.30}, not a "
                             f"numeric dtype")
    return TensorSig(str(s["name"]), _int(s["index"]), shape, str(s["dtype"]),
                     str(s["storage_dtype"]), _int(s["bo"]), _int(s["offset"]))
