"""The user API: ``rockjit.compile``, following ``jax.jit``'s conventions.

    @rockjit.compile(static_argnums=1, resident_argnums=0)
    def model(weights, n_layers, x): ...

    y = model(weights, 4, x)                # traces on the first call per signature, then cached
    lowered = model.lower(weights, 4, x)    # Lowered: .graph, .as_text()
    compiled = lowered.compile()            # Compiled: call it with the same kind of arguments

A *signature* is what a call's arguments look like to the tracer: per argument its pytree
structure and its leaves' shapes and dtypes, or the value of a static argument.  Leaves of the
arguments at ``resident_argnums`` become ``param`` nodes named by their pytree path; their
values are bound to the Compiled object (as numpy copies) and are not part of the signature.

A compiled program depends on the signature and the resident values only, never on the data
of a call: ``lower(weights, jax.ShapeDtypeStruct(...)).compile()`` builds it without inputs.
On the NPU backends (fp16), a float input holding NaN, +-Inf or |x| > 65504 is refused with
``InputRangeError`` naming the argument and pytree path, and such a resident weight with
``WeightError`` when the program is built (rockjit/lowering/value_checks.py); the interpreter
backend computes in float32 and propagates NaN like JAX.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from .errors import InputRangeError, TraceError, WeightError
from .gc_pause import gc_paused
from .ir.graph import Graph
from .ir.types import DType, TensorType
from .backends import Runner, check_cores, make_runner, resolve_backend
from .binding import ResidentBinding
from .signature import (LeafSpec, Signature, arg_location, arg_name, bind_kwargs, call_key,
                        graph_name, leaf_dtype, make_signature, resident_dtype, trace)
from .weight_timing import timed

# ------------------------------------------------------------------ Lowered / Compiled

class _Traced:
    """One traced signature: its IR graph, the signature and the output pytree structure."""

    def __init__(self, graph: Graph, sig: Signature, out_tree: Any, backend: str,
                 cores: int | None = None) -> None:
        resolve_backend(backend)
        self.graph = graph
        self.signature = sig
        self.out_tree = out_tree
        self.backend = backend
        self.cores = cores      # NPU cores the program is laid out for (None: all)

    def as_text(self) -> str:
        """The IR text form (``rockjit.ir.parser.parse`` reads it back)."""
        from .ir.printer import print_graph

        return print_graph(self.graph)

    def __str__(self) -> str:
        return self.as_text()


class Compiled(_Traced):
    """A traced, imported and simplified function, ready to run on its backend."""

    def __init__(self, graph: Graph, sig: Signature, out_tree: Any, backend: str,
                 binding: ResidentBinding, cores: int | None = None) -> None:
        super().__init__(graph, sig, out_tree, backend, cores)
        self._binding = binding
        self._runner: Runner | None = None
        # One call at a time per Compiled: the resident binding, the lazily built runner and
        # the program's staging buffers (one arena per program) are shared by every call.
        self._call_lock = threading.Lock()

    @property
    def params(self) -> Mapping[str, np.ndarray]:
        """The bound resident values by param name (read-only float32 copies)."""
        return dict(self._binding.values)

    def _split_args(self, args: tuple) -> list[tuple[int, Any]]:
        """Arguments by position; static ones may be passed again (checked) or left out."""
        sig = self.signature
        n_all = len(sig.args)
        n_dyn = n_all - sig.n_static
        if len(args) == n_all:
            out = []
            for i, (a, spec) in enumerate(zip(args, sig.args)):
                if spec.kind == "static":
                    if not (type(a) is type(spec.static_value) and a == spec.static_value):
                        raise TraceError(f"static {arg_location(sig.fn, i)}: compiled for "
                                         f"{spec.static_value!r}, got {a!r}; call the "
                                         f"rockjit.compile'd function to trace a new variant")
                else:
                    out.append((i, a))
            return out
        if len(args) == n_dyn:
            dyn_positions = [i for i, s in enumerate(sig.args) if s.kind != "static"]
            return list(zip(dyn_positions, args))
        raise TraceError(f"compiled for {n_all} argument(s) ({sig.n_static} static), called with "
                         f"{len(args)}")

    def _check(self, i: int, arg: Any) -> list[Any]:
        """The leaves of argument ``i``, checked against the compiled signature."""
        sig = self.signature
        spec = sig.args[i]
        with_path, treedef = tree_flatten_with_path(arg)
        if treedef != spec.treedef:
            raise TraceError(f"{arg_location(sig.fn, i)}: pytree structure differs from the compiled "
                             f"signature: expected {spec.treedef}, got {treedef}")
        leaves = []
        for (path, leaf), want in zip(with_path, spec.leaves):
            p = keystr(path)
            shape, dt = leaf_dtype(leaf, sig.fn, i, p)
            if spec.kind == "resident":
                dt = resident_dtype(dt)
            if shape != want.shape or dt != want.dtype:
                got = TensorType(DType.from_numpy(dt), shape)
                raise TraceError(f"{arg_location(sig.fn, i, p)}: expected {want}, got {got} (a "
                                 f"Compiled object runs one signature; call the "
                                 f"rockjit.compile'd function to trace a new one)")
            leaves.append(leaf)
        return leaves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = bind_kwargs(self.signature.fn, args, kwargs)
        leaves_by_arg: list[list[Any] | None] = [None] * len(self.signature.args)
        for i, arg in self._split_args(args):
            leaves_by_arg[i] = self._check(i, arg)
        return self._call_leaves(leaves_by_arg)

    def _call_leaves(self, leaves_by_arg: list[list[Any] | None]) -> Any:
        """Run on each dynamic argument's leaves (None for a static one), already known to
        match the signature (``_check``, or ``call_key`` equal to the signature's key)."""
        sig = self.signature
        inputs: list[np.ndarray] = []
        input_at: list[tuple[int, int]] = []
        resident: list[tuple[str, Any, LeafSpec]] = []
        for i, leaves in enumerate(leaves_by_arg):
            if leaves is None:
                continue
            spec = sig.args[i]
            for j, leaf in enumerate(leaves):
                if spec.kind == "resident":
                    resident.append((sig.param_names[(i, j)], leaf, spec.leaves[j]))
                    continue
                if isinstance(leaf, jax.ShapeDtypeStruct):
                    raise TraceError(f"{arg_location(sig.fn, i, spec.leaves[j].path)}: "
                                     f"a ShapeDtypeStruct has no value to run on")
                inputs.append(np.asarray(leaf, dtype=spec.leaves[j].dtype))
                input_at.append((i, j))
        try:
            with self._call_lock:
                return self._run(resident, inputs)
        except InputRangeError as e:
            if e.index is None or not 0 <= e.index < len(input_at):
                raise
            i, j = input_at[e.index]
            raise InputRangeError(f"{arg_location(sig.fn, i, sig.args[i].leaves[j].path)}: {e}",
                                  e.index) from None
        except WeightError as e:
            raise self._named_weight_error(e) from None

    def _named_weight_error(self, e: WeightError) -> WeightError:
        """The backend names a refused weight by its param name; add the argument and pytree
        path the user passed it at."""
        sig = self.signature
        for (i, j), name in sig.param_names.items():
            if e.param is not None and name == e.param:
                return WeightError(f"{arg_location(sig.fn, i, sig.args[i].leaves[j].path)}: {e}",
                                   e.param)
        return e

    def _run(self, resident: list[tuple[str, Any, LeafSpec]], inputs: list[np.ndarray]) -> Any:
        changed = self._binding.update(resident)
        runner = self._runner
        if runner is None:
            runner = self._make_runner()
        elif changed:
            rebind = getattr(runner, "rebind", None)
            if rebind is not None:
                rebind(self._binding.values)
            else:
                runner = self._make_runner()
        self._runner = runner
        outs = runner(inputs)
        return tree_unflatten(self.out_tree, [np.asarray(o) for o in outs])

    def _make_runner(self) -> Runner:
        return make_runner(self.backend, self.graph, self._binding.values, self.cores)

    def _build(self) -> None:
        """Make the backend's runner now and let it compile its program (NPU backends), from
        the graph and the bound resident values alone: a program never depends on a call's
        inputs (lowering/calibrate.py), so no example data is needed."""
        if self._runner is None:
            self._runner = self._make_runner()
        build = getattr(self._runner, "compile", None)
        if build is not None and getattr(self._runner, "image", True) is None:
            try:
                build()
            except WeightError as e:
                raise self._named_weight_error(e) from None

    def check(self, *args: Any, threshold: float | None = None, by: str = "auto") -> Any:
        """Per-layer accuracy of this program on ``args`` against the fp32 interpreter
        (``rockjit.check``): ``print(report)`` or ``report.html()``."""
        from . import check as _check

        return _check.check(self, *args, by=by, threshold=(
            _check.DEFAULT_THRESHOLD if threshold is None else threshold))

    def stats(self) -> dict[str, int]:
        """The compiled program's counters (NPU backends; after compile(), the first call or
        ``build_program``)."""
        stats = getattr(self._runner, "stats", None)
        if stats is None:
            raise TraceError(f"backend {self.backend!r} keeps no program stats"
                             + ("" if self._runner else "; call the function first"))
        return stats()

    def range_plan(self) -> list:
        """The compiled program's range plan: one record per float value it computes (value,
        op, source line, bound, action; rockjit.lowering.range_plan.RangeRecord). NPU
        backends, after the first call."""
        plan = getattr(self._runner, "range_plan", None)
        if plan is None:
            raise TraceError(f"backend {self.backend!r} keeps no range plan"
                             + ("" if self._runner else "; call the function first"))
        return plan()

    # ------------------------------------------------------------------ the NPU program
    def _npu_runner(self, what: str):
        """The NPU runner (made now if the function was not called yet)."""
        if self._runner is None:
            if any(name not in self._binding.values for name in self.signature.param_names.values()):
                raise TraceError(f"{what}: resident params are unbound (lowered from "
                                 f"ShapeDtypeStructs); call the function or compile it with the "
                                 f"weights")
            self._runner = self._make_runner()
        if not hasattr(self._runner, "image"):
            raise TraceError(f"{what} needs an NPU program; backend {self.backend!r} has none "
                             f"(use backend='auto', 'sim' or 'rocket')")
        return self._runner

    def build_program(self, *args: Any) -> "Compiled":
        """Lower to the NPU program now instead of on the first call. The program depends on
        the graph and the resident values only, so ``args`` (the same kinds as a call) are
        checked against the signature and otherwise not looked at. Returns self."""
        runner = self._npu_runner("build_program")
        if runner.image is None:
            example = None
            if args:
                example = self._inputs_of(args)
            runner.compile(example)
        return self

    def _inputs_of(self, args: tuple) -> list[np.ndarray]:
        inputs = []
        for i, arg in self._split_args(args):
            spec = self.signature.args[i]
            if spec.kind == "resident":
                continue
            for j, leaf in enumerate(self._check(i, arg)):
                inputs.append(np.asarray(leaf, dtype=spec.leaves[j].dtype))
        return inputs

    @property
    def image(self):
        """The program image (runtime/image.py: plain data), after the first call or
        ``build_program``; None before."""
        return getattr(self._runner, "image", None)

    def placement(self) -> list:
        """Where each IR op runs (``npu``, ``host``, ``view``, ``const``), how, and why the
        NPU refused it when it is on the host: ``rockjit.runtime.image.Placement`` records.
        Lowers the program now if the function was not called yet."""
        return list(self.build_program().image.placement)

    def report(self) -> str:
        """The placement report as text, one line per IR op."""
        self.placement()
        return self.image.report()

    def bundle_signature(self) -> dict[str, Any]:
        """The call signature a bundle stores: the input arguments' pytrees and leaves (static
        and resident arguments are compiled in) and the output pytree."""
        from .runtime.pytree import tree_paths, tree_spec_of

        inputs, trees, k = [], [], 0
        for i, a in enumerate(self.signature.args):
            if a.kind != "input":
                continue
            n = len(a.leaves)
            trees.append(tree_spec_of(tree_unflatten(a.treedef, list(range(k, k + n))),
                                      arg_location(self.signature.fn, i)))
            for leaf in a.leaves:
                inputs.append({"name": f"{arg_name(self.signature.fn, i) or f'arg{i}'}"
                                       f"{leaf.path}", "shape": list(leaf.shape),
                               "dtype": np.dtype(leaf.dtype).name})
            k += n
        g = self.graph
        n_out = len(g.outputs)
        out_spec = tree_spec_of(tree_unflatten(self.out_tree, list(range(n_out))), "the result")
        names = tree_paths(out_spec)
        outputs = [{"name": names[i], "shape": list(v.type.shape),
                    "dtype": v.type.dtype.to_numpy().name} for i, v in enumerate(g.outputs)]
        return {"inputs": inputs, "inputs_tree": trees, "outputs": outputs,
                "outputs_tree": [out_spec]}

    def save(self, path: str) -> dict[str, Any]:
        """Write the NPU program as a bundle (``rockjit.load(path)`` runs it without JAX).
        Compiles it first if the function was not called yet. Returns the manifest."""
        from .runtime.bundle import write_bundle

        self.build_program()
        return write_bundle(path, self.image, self.bundle_signature(), self.graph.name,
                            modelled=self._modelled())

    def _modelled(self) -> dict[str, Any] | None:
        """The cost model's estimate of the program (rockjit.cost, at 600 MHz), per step and
        in total, for the bundle's manifest: a bundle runs without the compiler, so
        ``rockjit inspect`` reads it from there. None when the runner has no image builder."""
        builder = getattr(self._runner, "builder", None)
        if builder is None:
            return None
        from . import cost

        return cost.to_manifest(cost.estimate(cost.describe(builder)))


class Lowered(_Traced):
    """A traced function in rockjit IR (after import and simplification)."""

    def __init__(self, graph: Graph, sig: Signature, out_tree: Any, backend: str,
                 args: Sequence[Any], cores: int | None = None) -> None:
        super().__init__(graph, sig, out_tree, backend, cores)
        self._args = args

    @gc_paused
    def compile(self) -> Compiled:
        """Bind the resident values and, when all of them have values, build the program now
        (inputs may be jax.ShapeDtypeStruct: the program does not depend on them); resident
        leaves given as ShapeDtypeStruct defer the build to the first call."""
        binding = ResidentBinding()
        items = []
        flat = {i: tree_flatten(self._args[i])[0] for i in self.signature.resident_argnums}
        missing = False
        for (i, j), name in self.signature.param_names.items():
            leaf = flat[i][j]
            if not isinstance(leaf, jax.ShapeDtypeStruct):  # lowered without values: bind later
                items.append((name, leaf, self.signature.args[i].leaves[j]))
            else:
                missing = True
        with timed("bind") as bound:
            binding.update(items)
            bound[0] = sum(v.nbytes for v in binding.values.values())
        compiled = Compiled(self.graph, self.signature, self.out_tree, self.backend, binding,
                            self.cores)
        if not missing:
            compiled._build()
        return compiled


# ------------------------------------------------------------------ the decorator

class CompiledFunction:
    """What ``rockjit.compile`` returns: traces per signature, caches, and runs."""

    def __init__(self, fn: Callable[..., Any], static_argnums: int | Sequence[int],
                 resident_argnums: int | Sequence[int], backend: str,
                 cores: int | None = None) -> None:
        resolve_backend(backend)
        check_cores(backend, cores)
        self.fn = fn
        self.static_argnums = ((static_argnums,) if isinstance(static_argnums, int)
                               else tuple(static_argnums))
        self.resident_argnums = ((resident_argnums,) if isinstance(resident_argnums, int)
                                 else tuple(resident_argnums))
        overlap = set(self.static_argnums) & set(self.resident_argnums)
        if overlap:
            raise ValueError(f"arguments {sorted(overlap)} are both static and resident")
        self.backend = backend
        self.cores = cores
        self._cache: dict[tuple, Compiled] = {}
        self.trace_count = 0
        # Threads that miss the cache together trace and compile the signature once.
        self._trace_lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def _signature(self, args: tuple) -> Signature:
        return make_signature(self.fn, args, self.static_argnums, self.resident_argnums)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace for these arguments (arrays or jax.ShapeDtypeStruct leaves) without running."""
        args = bind_kwargs(self.fn, args, kwargs)
        sig = self._signature(args)
        self.trace_count += 1
        graph, out_tree = trace(sig, graph_name(self.fn))
        return Lowered(graph, sig, out_tree, self.backend, args, self.cores)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = bind_kwargs(self.fn, args, kwargs)
        # A warm call: the key from tree_flatten alone; the full signature (paths, names) only
        # on a miss, which traces.
        fast = call_key(args, self.static_argnums, self.resident_argnums)
        if fast is not None:
            compiled = self._cache.get(fast[0])
            if compiled is not None:
                return compiled._call_leaves(fast[1])
        return self._compiled_for(args)(*args)

    def _compiled_for(self, args: tuple) -> "Compiled":
        sig = self._signature(args)
        key = sig.key()
        compiled = self._cache.get(key)
        if compiled is None:
            with self._trace_lock:
                compiled = self._cache.get(key)
                if compiled is None:
                    self.trace_count += 1
                    graph, out_tree = trace(sig, graph_name(self.fn))
                    compiled = Lowered(graph, sig, out_tree, self.backend, args,
                                       self.cores).compile()
                    self._cache[key] = compiled
        return compiled

    def clear_cache(self) -> None:
        with self._trace_lock:
            self._cache.clear()

    def compiled(self, *args: Any, **kwargs: Any) -> "Compiled":
        """The Compiled object for these arguments' signature (traced if needed)."""
        return self._compiled_for(bind_kwargs(self.fn, args, kwargs))

    def stats(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        """Program stats of the most recently compiled signature (or of ``args``')."""
        if args or kwargs:
            return self.compiled(*args, **kwargs).stats()
        if not self._cache:
            raise TraceError("nothing compiled yet; call the function first")
        return list(self._cache.values())[-1].stats()


def compile(fn: Callable[..., Any] | None = None, *, static_argnums: int | Sequence[int] = (),
            resident_argnums: int | Sequence[int] = (), backend: str = "auto",
            cores: int | None = None) -> Any:
    """Compile ``fn`` like ``jax.jit``: usable as ``@rockjit.compile``,
    ``@rockjit.compile(static_argnums=...)`` and ``rockjit.compile(fn, ...)``.

    ``backend``: "auto" (the NPU through /dev/accel/accel0 when it opens, else the C
    simulator; says once which), "sim", "rocket", "null", "KIND:CHIP", or "interpreter"
    (the IR's numpy reference). ``cores``: how many of the chip's NPU cores the program is
    laid out for (None, the default: all; the cost model still decides how many each step
    uses). One core copies nothing between cores and holds the weights once, at the cost of
    the other cores' throughput (bench/modelled_time.py --contexts 1 prices it)."""
    if fn is None:
        return functools.partial(compile, static_argnums=static_argnums,
                                 resident_argnums=resident_argnums, backend=backend,
                                 cores=cores)
    return CompiledFunction(fn, static_argnums, resident_argnums, backend, cores)


def export(fn: Callable[..., Any], *args: Any, static_argnums: int | Sequence[int] = (),
           resident_argnums: int | Sequence[int] = (), backend: str = "auto",
           cores: int | None = None) -> Compiled:
    """Compile ``fn`` for ``args`` without running it: input leaves may be
    ``jax.ShapeDtypeStruct``s (no example data: LUT domains are planned statically); resident
    arguments must be the weights themselves. ``export(...).save(path)`` writes a bundle.
    ``fn`` may be a ``rockjit.compile``'d function: its argnums and cores are used unless
    given."""
    if isinstance(fn, CompiledFunction):
        static_argnums = static_argnums or fn.static_argnums
        resident_argnums = resident_argnums or fn.resident_argnums
        cores = fn.cores if cores is None else cores
        fn = fn.fn
    f = compile(fn, static_argnums=static_argnums, resident_argnums=resident_argnums,
                backend=backend, cores=cores)
    return f.lower(*args).compile().build_program()


@dataclass(frozen=True)
class TraceSpec:
    """What ``rockjit trace module:function`` needs: the function and example arguments
    (arrays or jax.ShapeDtypeStruct leaves)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    static_argnums: tuple[int, ...] = ()
    resident_argnums: tuple[int, ...] = ()

    def lower(self) -> Lowered:
        return compile(self.fn, static_argnums=self.static_argnums,
                       resident_argnums=self.resident_argnums).lower(*self.args)
