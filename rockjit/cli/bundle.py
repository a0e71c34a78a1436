"""The bundle verbs: ``compile``, ``run``, ``inspect``, ``bench``.

    rockjit compile models.siglip:trace_spec --set num_hidden_layers=2 --weights w.safetensors -o s.rjb
    rockjit compile siglip --weights siglip.safetensors -o siglip.rjb      # a model preset
    rockjit run siglip.rjb pixels.npz -o out.npz                           # first + steady time
    rockjit inspect siglip.rjb                     # manifest, stats, steps with source lines,
                                                   # modelled time per step, where each op ran
    rockjit bench siglip.rjb -n 20                 # median / min wall per forward

``run``, ``inspect`` and ``bench`` need no JAX: a bundle runs on the runtime alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from .common import EXIT_COMPILE_ERROR, EXIT_OK, UsageError, add_verb, parse_assignments

PRESETS = ("siglip", "modernbert", "whisper-tiny", "whisper-base")


def _fail(verb: str, e: BaseException) -> int:
    print(f"rockjit {verb}: {type(e).__name__}: {e}", file=sys.stderr)
    return EXIT_COMPILE_ERROR


# ---------------------------------------------------------------------- compile

def _preset_program(args: argparse.Namespace, overrides: dict[str, Any]):
    """(fn, args, resident_argnums, description) for a model preset."""
    import jax

    from models.presets import MODELS, default_weights

    entry = MODELS[args.target]
    try:
        config = entry.configure(overrides)
    except (TypeError, ValueError) as e:
        raise UsageError(f"--set for {args.target}: {e}") from None
    if args.weights is None and not args.seeded_weights:
        raise UsageError(f"preset {args.target!r} needs --weights FILE (a safetensors checkpoint "
                         f"with HF tensor names), or --seeded-weights for the repo's seeded "
                         f"default")
    path = args.weights or default_weights(args.target, entry.module, config, args.out_dir,
                                           overrides)
    params = entry.module.load_params(path, config)
    specs = [jax.ShapeDtypeStruct(s, d) for s, d in entry.input_specs(config, args.seq_len)]
    return entry.forward(config), (params, *specs), (0,), f"{args.target} ({path})"


def _target_program(args: argparse.Namespace, overrides: dict[str, Any]):
    """(fn, args, resident_argnums, description) for a ``module:function`` TraceSpec."""
    import jax
    from jax.tree_util import tree_flatten

    from .trace import trace_spec

    spec = trace_spec(args.target, overrides)
    call_args = list(spec.args)
    for i in spec.resident_argnums:
        leaves, _ = tree_flatten(call_args[i])
        if not any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
            continue
        if args.weights is None:
            raise UsageError(f"{args.target}: resident argument {i} has shapes but no values; "
                             f"pass --weights FILE (safetensors, one tensor per name)")
        if not isinstance(call_args[i], dict) or not all(
                isinstance(v, jax.ShapeDtypeStruct) for v in call_args[i].values()):
            raise UsageError(f"{args.target}: --weights fills a flat dict of named tensors; "
                             f"resident argument {i} is a {type(call_args[i]).__name__}")
        from models.weights import load_safetensors

        call_args[i] = load_safetensors(args.weights, {k: tuple(v.shape)
                                                      for k, v in call_args[i].items()})
    if spec.static_argnums:
        raise UsageError(f"{args.target}: static arguments are not supported by compile yet; "
                         f"bind them in the spec's function (functools.partial)")
    return spec.fn, tuple(call_args), spec.resident_argnums, args.target


def _compile(args: argparse.Namespace) -> int:
    from ..errors import RockjitError

    overrides = parse_assignments(args.set)
    backend = "auto" if args.chip == "rk3588" else f"auto:{args.chip}"
    t0 = time.perf_counter()
    try:
        if args.target in PRESETS:
            fn, call_args, resident, what = _preset_program(args, overrides)
        elif ":" in args.target:
            fn, call_args, resident, what = _target_program(args, overrides)
        else:
            raise UsageError(f"target {args.target!r} is neither a preset ({', '.join(PRESETS)}) "
                             f"nor 'package.module:function'")
        t_load = time.perf_counter() - t0
        import rockjit

        t0 = time.perf_counter()
        compiled = rockjit.compile(fn, resident_argnums=resident, backend=backend,
                                   cores=args.cores).lower(*call_args).compile()
        t_trace = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled.build_program()
        t_lower = time.perf_counter() - t0
        t0 = time.perf_counter()
        manifest = compiled.save(args.output)
        t_save = time.perf_counter() - t0
    except UsageError:
        raise
    except (RockjitError, ValueError) as e:
        return _fail("compile", e)
    st = manifest["stats"]
    print(f"compiled    {what}")
    print(f"chip        {manifest['chip_profile']}  uAPI: {', '.join(manifest['uapi_features'])}")
    print(f"times       weights {t_load:.2f} s, trace {t_trace:.2f} s, lower {t_lower:.2f} s, "
          f"save {t_save:.2f} s")
    print(f"program     {st['jobs']} jobs, {st['tasks']} tasks, {st['host_steps']} host steps, "
          f"{st['npu_ops']} NPU ops, {st['host_ops']} host ops")
    md = manifest.get("modelled")
    if md:
        print(f"{md['label']:<11} {md['total_ms']:.2f} ms per forward at NPU {md['clock_mhz']:g} MHz "
              f"(rockjit.cost: a model, not a measurement; `rockjit inspect --only modelled`)")
    print(f"bundle      {args.output}  {os.path.getsize(args.output) / 2**20:.2f} MiB")
    return EXIT_OK


# ---------------------------------------------------------------------- run / bench helpers

def _load(path: str, backend: str):
    from ..runtime.bundle import BundleError, load

    try:
        return load(path, backend=backend)
    except BundleError as e:
        raise _Refused(e) from None


class _Refused(Exception):
    def __init__(self, e: BaseException) -> None:
        self.e = e


def _leaf_names(sig: dict, which: str) -> list[str]:
    return [leaf.get("name") or f"{which}{i}" for i, leaf in enumerate(sig[which])]


def _read_inputs(path: str, bundle) -> list[np.ndarray]:
    """The bundle's inputs from an .npz: by the signature's leaf names, or positionally as
    np.savez names them (arr_0, arr_1, ...)."""
    sig = bundle.manifest["signature"]
    names = _leaf_names(sig, "inputs")
    try:
        with np.load(path) as z:
            files = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read inputs {path!r}: {e}") from None
    if all(n in files for n in names):
        return [files[n] for n in names]
    pos = [f"arr_{i}" for i in range(len(names))]
    if all(n in files for n in pos):
        return [files[n] for n in pos]
    raise UsageError(f"{path} holds {sorted(files)}; the bundle takes {names} (or arr_0.. in "
                     f"order)")


def _synthetic_inputs(bundle) -> list[np.ndarray]:
    """Seeded inputs of the signature: normal floats; ones for integers (valid token ids and
    an all-ones attention mask)."""
    rng = np.random.default_rng(0)
    out = []
    for leaf in bundle.manifest["signature"]["inputs"]:
        dt = np.dtype(leaf["dtype"])
        shape = tuple(leaf["shape"])
        out.append(rng.standard_normal(shape).astype(dt) if dt.kind == "f"
                   else np.ones(shape, dt))
    return out


def _output_names(bundle) -> list[str]:
    from ..runtime.pytree import tree_paths

    return tree_paths(bundle.manifest["signature"]["outputs_tree"][0])


def _timed_runs(bundle, inputs: list[np.ndarray], n: int) -> tuple[list[np.ndarray], list[float]]:
    times = []
    outs: list[np.ndarray] = []
    for _ in range(max(n, 1)):
        t0 = time.perf_counter()
        outs = bundle.call_flat(inputs)
        times.append(time.perf_counter() - t0)
    return outs, times


def _run(args: argparse.Namespace) -> int:
    from ..errors import RockjitError

    try:
        t0 = time.perf_counter()
        b = _load(args.bundle, args.backend)
        t_load = time.perf_counter() - t0
    except _Refused as r:
        return _fail("run", r.e)
    with b:
        inputs = _read_inputs(args.inputs, b)
        try:
            outs, times = _timed_runs(b, inputs, args.n)
        except RockjitError as e:
            return _fail("run", e)
        names = _output_names(b)
        print(f"bundle      {args.bundle}  on {b.backend}  (load {t_load:.3f} s)")
        print(f"first call  {times[0] * 1e3:.1f} ms")
        if len(times) > 1:
            print(f"steady      {statistics.median(times[1:]) * 1e3:.1f} ms per forward "
                  f"(median of {len(times) - 1})")
        for name, o in zip(names, outs):
            print(f"output      {name}: {o.dtype}{list(o.shape)}")
        if args.output:
            np.savez(args.output, **dict(zip(names, outs)))
            print(f"wrote       {args.output}")
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from ..errors import RockjitError

    try:
        b = _load(args.bundle, args.backend)
    except _Refused as r:
        return _fail("bench", r.e)
    with b:
        inputs = _read_inputs(args.inputs, b) if args.inputs else _synthetic_inputs(b)
        try:
            _, warm = _timed_runs(b, inputs, args.warmup)
            _, times = _timed_runs(b, inputs, args.n)
        except RockjitError as e:
            return _fail("bench", e)
        print(f"bundle      {args.bundle}  on {b.backend}")
        print(f"warmup      {args.warmup} run(s), first {warm[0] * 1e3:.1f} ms")
        print(f"per forward median {statistics.median(times) * 1e3:.2f} ms, "
              f"min {min(times) * 1e3:.2f} ms over {len(times)} run(s)")
    return EXIT_OK


# ---------------------------------------------------------------------- inspect

def _inspect(args: argparse.Namespace) -> int:
    from ..runtime.bundle import BundleError, read_bundle

    try:
        c = read_bundle(args.bundle)
    except BundleError as e:
        return _fail("inspect", e)
    m, img = c.manifest, c.image
    show = set(args.only or ("manifest", "stats", "steps", "modelled", "placement"))
    if "manifest" in show:
        comp = m["compiler"]
        print(f"# manifest of {args.bundle} ({c.size} bytes)")
        print(f"format        rockjit-bundle v{m['format_version']}")
        print(f"compiler      {comp.get('name')} {comp.get('version')} "
              f"(runtime ABI {comp.get('runtime_abi')})")
        print(f"function      {m.get('name', '')}")
        print(f"chip profile  {m['chip_profile']}, {m['contexts']} context(s)")
        print(f"uAPI needs    {', '.join(m['uapi_features'])}")
        for which in ("inputs", "outputs"):
            for leaf in m["signature"][which]:
                print(f"{which[:-1]:<13} {leaf.get('name')}: {leaf['dtype']}{leaf['shape']}")
        for name, p in m["parts"].items():
            print(f"part          {name:<20} {p['size']:>10} bytes  sha256 {p['sha256'][:16]}…")
    if "stats" in show:
        print("\n# stats")
        width = max(len(k) for k in m["stats"])
        for k, v in m["stats"].items():
            print(f"{k:<{width}}  {v}")
    if "steps" in show:
        print(f"\n# steps ({len(img.steps)}): step, what ran, the op and its source line")
        print(img.step_list())
    if "modelled" in show:
        _print_modelled(m.get("modelled"))
    if "placement" in show:
        counts: dict[str, int] = {}
        for p in img.placement:
            counts[p.where] = counts.get(p.where, 0) + 1
        print(f"\n# placement: where each op ran and why "
              f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
        print(img.report())
        if img.core_placement:
            moved = sum(1 for c in img.core_placement if c.cores != c.rule_cores)
            print(f"\n# cores per NPU step, by modelled cost ({len(img.core_placement)} steps "
                  f"could spread; {moved} use fewer cores than round-robin over all)")
            print(img.core_report())
        if img.tilings:
            moved = sum(1 for t in img.tilings if not t.agrees)
            print(f"\n# conv/matmul tilings, by modelled cost ({len(img.tilings)} plans; "
                  f"{moved} overrule the fixed rule's)")
            print(img.tiling_report())
    return EXIT_OK


def _print_modelled(md: dict | None) -> None:
    """The manifest's cost-model estimate, step by step (rockjit.cost.to_manifest)."""
    if not md:
        print("\n# modelled time: not in this bundle (written before rockjit kept it, or by "
              "a backend without an NPU program); re-compile it to see it")
        return
    lab = md.get("label", "modelled")
    steps = md.get("steps", [])
    print(f"\n# {lab} time per step at NPU {md.get('clock_mhz', 0):g} MHz (rockjit.cost: a "
          f"model from published figures, not a measurement) ({len(steps)} steps)")
    names = ("dispatch", "dma", "mac", "host")
    print(f"{'step':>5} {'kind':4} {lab + ' ms':>12} " + " ".join(f"{n:>9}" for n in names)
          + "  what")
    for i, s in enumerate(steps):
        b = s.get("buckets_ms", {})
        print(f"{i:5d} {s.get('kind', ''):4} {s.get('ms', 0.0):12.4f} "
              + " ".join(f"{b.get(n, 0.0):9.4f}" for n in names) + f"  {s.get('label', '')}")
    b = md.get("buckets_ms", {})
    print(f"{'total':>5} {'':4} {md.get('total_ms', 0.0):12.3f} "
          + " ".join(f"{b.get(n, 0.0):9.3f}" for n in names) + f"  ({lab} ms per forward)")


# ---------------------------------------------------------------------- registration

def register(sub: Any) -> None:
    c = add_verb(sub, "compile", "compile a function or a model preset into a bundle (.rjb)",
                 "Trace, lower and save a bundle. TARGET is a model preset "
                 f"({', '.join(PRESETS)}) or package.module:function returning a "
                 "rockjit.api.TraceSpec.")
    c.add_argument("target", help=f"{' | '.join(PRESETS)} | package.module:function")
    c.add_argument("--set", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="config fields of a preset, or keyword arguments of the spec function")
    c.add_argument("--weights", help="safetensors weights (HF tensor names for the presets)")
    c.add_argument("--seeded-weights", action="store_true",
                   help="a preset without a checkpoint: the repo's seeded default weights")
    c.add_argument("--seq-len", type=int, default=512, help="tokens (ModernBERT)")
    c.add_argument("--chip", default="rk3588", help="chip profile to compile for")
    c.add_argument("--cores", type=int, default=None,
                   help="lay the program out for this many NPU cores (default: all the chip's; "
                        "1 copies nothing between cores and holds the weights once)")
    c.add_argument("--out-dir", default="out", help="where seeded weights are written")
    c.add_argument("-o", "--output", required=True, help="the bundle file to write")
    c.set_defaults(run=_compile)

    r = add_verb(sub, "run", "run a bundle on inputs from an .npz, printing per-forward time")
    r.add_argument("bundle")
    r.add_argument("inputs", help=".npz with the bundle's inputs by name (or arr_0, arr_1..)")
    r.add_argument("--backend", default="auto", help="auto (default), sim, rocket or null")
    r.add_argument("-n", type=int, default=3, help="forwards to run (the first is reported "
                                                   "apart; default 3)")
    r.add_argument("-o", "--output", help=".npz to write the outputs to")
    r.set_defaults(run=_run)

    i = add_verb(sub, "inspect", "print a bundle's manifest, stats, steps, modelled time and op "
                                "placement")
    i.add_argument("bundle")
    i.add_argument("--only", nargs="+", choices=("manifest", "stats", "steps", "modelled", "placement"),
                   help="print only these sections")
    i.set_defaults(run=_inspect)

    b = add_verb(sub, "bench", "median and min wall time per forward of a bundle")
    b.add_argument("bundle")
    b.add_argument("-n", type=int, default=10, help="timed forwards (default 10)")
    b.add_argument("--warmup", type=int, default=1, help="untimed forwards first (default 1)")
    b.add_argument("--inputs", help=".npz inputs (default: seeded inputs of the signature)")
    b.add_argument("--backend", default="auto", help="auto (default), sim, rocket or null")
    b.set_defaults(run=_bench)
