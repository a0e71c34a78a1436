"""Bundles: a compiled program on disk, loadable and runnable without JAX or the compiler.

One file (``.rjb``)::

    offset 0   b"RJBUNDLE"                      magic
           8   u32 container version            (CONTAINER_VERSION; newer is refused)
          12   u32 manifest length in bytes
          16   32 bytes sha256 of the manifest
          48   manifest (UTF-8 JSON)
           ..  zero padding to a multiple of 64
        base   the parts, each at manifest["parts"][name]["offset"] from ``base``

The manifest holds the format version, the chip profile, the rocket uAPI features the program
needs, the compiler version, the call signature (input/output pytrees, shapes, dtypes), the
program's stats, and each part's offset, size and sha256. The parts:

* ``image.json``: the ProgramImage's structure (runtime/image.py);
* ``image.safetensors``: its regcmd words and relocation table;
* ``weights.safetensors``: the packed resident bytes uploaded once (weights, LUTs, bias cubes,
  host-op descriptors), one tensor per buffer, named by the IR node they serve.

Each part is stored zlib-compressed (``encoding``; ``raw_size`` is its size before) unless
saved with ``compress=False``; the sha256 covers the stored bytes.

Every failure to read a bundle is a ``BundleError`` that says what was wrong; nothing in a
damaged or hostile file reaches the C runtime before every hash matches and every index in the
image has been checked.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .device_choice import make_device, resolve_auto
from .errors import BundleError
from .image import ImageError, ProgramImage
from .pytree import CANONICAL_DTYPE, tree_build, tree_flatten_into, tree_leaf_indices

MAGIC = b"RJBUNDLE"
CONTAINER_VERSION = 1
FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sII32s")
_ALIGN = 64
_MAX_MANIFEST = 64 << 20
_MAX_PART = 16 << 30          # more than an RK3588 board's memory
ENCODINGS = ("raw", "zlib")
PARTS = ("image.json", "image.safetensors", "weights.safetensors")

# The rocket uAPI features a program can need; a bundle naming another is refused.
UAPI_FEATURES = {
    "submit": "DRM_IOCTL_ROCKET_SUBMIT with per-job task lists and in/out BO handle lists",
    "self-chained-jobs": "jobs whose tasks the PC follows through the regcmd trailers in one "
                         "kick (the batched submit: TASK_NUMBER = task count)",
    "multi-context": "several open fds, one per core, each its own IOVA space",
}

# Chips a backend kind can run: the rocket uAPI exists on the RK3588's NPU only; the simulator
# and the null device run a program of any registered profile.
DEVICE_CHIPS = {"rocket": ("rk3588",)}


# ---------------------------------------------------------------------- writing

def _sha(b: bytes | memoryview) -> str:
    return hashlib.sha256(b).hexdigest()


def _safetensors_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v) for k, v in arrays.items()})


def _compresses(blob: bytes, windows: int = 16, width: int = 1 << 16) -> bool:
    """Whether zlib pays for this part, judged on evenly spaced windows: dense fp16 weights
    (SigLIP's 86 M) barely shrink and would cost seconds to compress for nothing."""
    if len(blob) <= windows * width:
        return len(zlib.compress(blob, 1)) < 0.8 * len(blob)
    step = len(blob) // windows
    sample = b"".join(blob[i * step:i * step + width] for i in range(windows))
    return len(zlib.compress(sample, 1)) < 0.8 * len(sample)


def uapi_features(image: ProgramImage) -> list[str]:
    feats = ["submit"]
    if any(j.chained for j in image.jobs):
        feats.append("self-chained-jobs")
    if len({b.core for b in image.bos}) > 1:
        feats.append("multi-context")
    return feats


def write_bundle(path: str | os.PathLike, image: ProgramImage, signature: Mapping[str, Any],
                 name: str = "", compress: bool = True,
                 modelled: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``image`` and the call ``signature`` (inputs/outputs: pytree spec + leaves) to
    ``path`` atomically; each part zlib-compressed unless ``compress=False``; returns the
    manifest. ``modelled``: the cost model's estimate (``rockjit.cost.to_manifest``), kept in
    the manifest for ``rockjit inspect``; informational, never read to run the program."""
    from .. import __version__
    from ._ffi import lib

    image.check()
    weights = {u.array: image.arrays[u.array] for u in image.uploads}
    program_arrays = {w.array: image.arrays[w.array] for w in image.words}
    program_arrays[image.relocs] = image.arrays[image.relocs]
    parts = {
        "image.json": json.dumps(image.to_json(), sort_keys=True).encode(),
        "image.safetensors": _safetensors_bytes(program_arrays),
        "weights.safetensors": _safetensors_bytes(weights) if weights else
        _safetensors_bytes({}),
    }
    layout, pos = {}, 0
    for k in PARTS:
        raw = len(parts[k])
        enc = "zlib" if compress and _compresses(parts[k]) else "raw"
        if enc == "zlib":
            # the broadcast constant cubes and padded regcmd regions are highly repetitive;
            # level 1 already gets most of it (whisper-tiny: 110 -> 16 MiB)
            parts[k] = zlib.compress(parts[k], 1)
        layout[k] = {"offset": pos, "size": len(parts[k]), "sha256": _sha(parts[k]),
                     "encoding": enc, "raw_size": raw}
        pos = -(-(pos + len(parts[k])) // _ALIGN) * _ALIGN
    manifest = {
        "format": "rockjit-bundle",
        "format_version": FORMAT_VERSION,
        "compiler": {"name": "rockjit", "version": __version__,
                     "runtime_abi": int(lib.rj_abi_version())},
        "name": name,
        "chip_profile": image.profile,
        "contexts": image.contexts,
        "uapi_features": uapi_features(image),
        "signature": dict(signature),
        "stats": dict(image.stats),
        "parts": layout,
    }
    if modelled is not None:
        manifest["modelled"] = dict(modelled)
    mbytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    head = _HEAD.pack(MAGIC, CONTAINER_VERSION, len(mbytes), hashlib.sha256(mbytes).digest())
    base = -(-(len(head) + len(mbytes)) // _ALIGN) * _ALIGN
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(head)
        f.write(mbytes)
        f.write(b"\0" * (base - len(head) - len(mbytes)))
        for k in PARTS:
            f.seek(base + layout[k]["offset"])
            f.write(parts[k])
    os.replace(tmp, path)
    return manifest


# ---------------------------------------------------------------------- reading

@dataclass
class BundleContents:
    manifest: dict[str, Any]
    image: ProgramImage
    size: int


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise BundleError(msg)


def _check_manifest(m: Any, where: str) -> None:
    _require(isinstance(m, dict), f"{where}: the manifest is not a JSON object")
    _require(m.get("format") == "rockjit-bundle", f"{where}: not a rockjit bundle manifest "
             f"(format {m.get('format')!r})")
    v = m.get("format_version")
    _require(isinstance(v, int) and not isinstance(v, bool),
             f"{where}: the manifest's format_version is {v!r}, not an integer")
    if v > FORMAT_VERSION:
        comp = m.get("compiler", {})
        made = comp.get("version") if isinstance(comp, dict) else None
        raise BundleError(f"{where}: bundle format version {v} is newer than this rockjit reads "
                          f"({FORMAT_VERSION}); it was written by rockjit {made!r}: upgrade "
                          f"rockjit, or re-export the bundle with this version")
    _require(v >= 1, f"{where}: bundle format version {v} is not a valid version")
    for key, typ in (("chip_profile", str), ("uapi_features", list), ("signature", dict),
                     ("parts", dict), ("stats", dict), ("contexts", int)):
        _require(isinstance(m.get(key), typ),
                 f"{where}: the manifest's {key!r} is missing or not a {typ.__name__}")
    _require(m.get("modelled") is None or isinstance(m.get("modelled"), dict),
             f"{where}: the manifest's 'modelled' entry is not a JSON object")
    unknown = [f for f in m["uapi_features"] if not isinstance(f, str) or f not in UAPI_FEATURES]
    _require(not unknown, f"{where}: the program needs rocket uAPI features {unknown} that this "
             f"runtime does not provide (known: {sorted(UAPI_FEATURES)}); upgrade rockjit")
    parts = m["parts"]
    for k in PARTS:
        p = parts.get(k)
        _require(isinstance(p, dict) and all(isinstance(p.get(f), int)
                                             and not isinstance(p.get(f), bool)
                                             and p.get(f) >= 0
                                             for f in ("offset", "size", "raw_size"))
                 and isinstance(p.get("sha256"), str),
                 f"{where}: the manifest's entry for part {k!r} is missing or malformed")
        _require(p.get("encoding") in ENCODINGS,
                 f"{where}: part {k!r} is encoded as {p.get('encoding')!r:.30}; this rockjit "
                 f"reads {sorted(ENCODINGS)}: upgrade rockjit")
        _require(p["raw_size"] <= _MAX_PART,
                 f"{where}: part {k!r} claims {p['raw_size']} bytes, more than any program "
                 f"({_MAX_PART})")
    sig = m["signature"]
    for which in ("inputs", "outputs"):
        _require(isinstance(sig.get(which), list) and isinstance(sig.get(f"{which}_tree"), list),
                 f"{where}: the manifest's signature lacks {which!r}")
        for leaf in sig[which]:
            _require(isinstance(leaf, dict) and isinstance(leaf.get("shape"), list)
                     and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                             for d in leaf["shape"]) and isinstance(leaf.get("dtype"), str),
                     f"{where}: a {which[:-1]} in the manifest's signature is malformed")
            try:
                ok = np.dtype(leaf["dtype"]).kind in "biuf"
            except TypeError:
                ok = False
            _require(ok, f"{where}: a {which[:-1]} has dtype {leaf['dtype']!r:.30}")
        idx: list[int] = []
        for spec in sig[f"{which}_tree"]:
            try:
                tree_leaf_indices(spec, idx)
            except BundleError as e:
                raise BundleError(f"{where}: the {which} pytree description: {e}") from None
            except RecursionError:
                raise BundleError(f"{where}: the {which} pytree description is nested too "
                                  f"deeply") from None
        _require(sorted(idx) == list(range(len(sig[which]))),
                 f"{where}: the {which} pytree's leaves are not each of the signature's "
                 f"{len(sig[which])} {which} once")
    _require(len(sig["outputs_tree"]) == 1, f"{where}: the signature must have one output tree")


def read_bundle(path: str | os.PathLike) -> BundleContents:
    """Read and verify a bundle: container, manifest hash, part hashes, image structure."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BundleError(f"cannot read bundle {where}: {e.strerror or e}") from None
    if len(data) < _HEAD.size:
        raise BundleError(f"{where}: {len(data)} bytes is too short for a rockjit bundle "
                          f"(truncated?)")
    magic, cver, mlen, mhash = _HEAD.unpack_from(data, 0)
    _require(magic == MAGIC, f"{where}: not a rockjit bundle (bad magic {magic!r})")
    if cver > CONTAINER_VERSION:
        raise BundleError(f"{where}: bundle container version {cver} is newer than this rockjit "
                          f"reads ({CONTAINER_VERSION}); upgrade rockjit")
    _require(cver >= 1, f"{where}: bundle container version {cver} is invalid")
    _require(mlen <= _MAX_MANIFEST and _HEAD.size + mlen <= len(data),
             f"{where}: the manifest ({mlen} bytes) runs past the end of the file "
             f"({len(data)} bytes): truncated")
    mbytes = data[_HEAD.size:_HEAD.size + mlen]
    _require(hashlib.sha256(mbytes).digest() == mhash,
             f"{where}: the manifest's sha256 does not match the header: the file is corrupted")
    try:
        manifest = json.loads(mbytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"{where}: the manifest is not valid JSON ({e})") from None
    _check_manifest(manifest, where)
    base = -(-(_HEAD.size + mlen) // _ALIGN) * _ALIGN
    blobs: dict[str, memoryview] = {}
    view = memoryview(data)
    for k in PARTS:
        p = manifest["parts"][k]
        lo, hi = base + p["offset"], base + p["offset"] + p["size"]
        _require(hi <= len(data), f"{where}: part {k!r} (bytes {lo}..{hi}) runs past the end of "
                 f"the file ({len(data)} bytes): truncated")
        blobs[k] = view[lo:hi]
        _require(_sha(blobs[k]) == p["sha256"],
                 f"{where}: part {k!r} does not match its sha256 in the manifest: the file is "
                 f"corrupted")
        blobs[k] = _decode(blobs[k], p, f"{where}: part {k!r}")
    try:
        desc = json.loads(bytes(blobs["image.json"]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"{where}: image.json is not valid JSON ({e})") from None
    arrays: dict[str, np.ndarray] = {}
    for k in ("image.safetensors", "weights.safetensors"):
        arrays.update(_load_safetensors(bytes(blobs[k]), f"{where}: {k}"))
    try:
        image = ProgramImage.from_json(desc, arrays)
    except ImageError as e:
        raise BundleError(f"{where}: the program image is inconsistent: {e}") from None
    _require(image.profile == manifest["chip_profile"],
             f"{where}: the manifest says chip {manifest['chip_profile']!r}, the image "
             f"{image.profile!r}")
    _require(image.version <= FORMAT_VERSION,
             f"{where}: image version {image.version} is newer than this rockjit reads")
    sig_in = image.signature("input")
    sig_out = image.signature("output")
    m_in, m_out = manifest["signature"]["inputs"], manifest["signature"]["outputs"]
    _require(len(m_in) == len(sig_in) and len(m_out) == len(sig_out) and all(
        tuple(a["shape"]) == tuple(b.shape) and a["dtype"] == b.dtype
        for a, b in zip(m_in + m_out, sig_in + sig_out)),
        f"{where}: the manifest's signature disagrees with the program image")
    return BundleContents(manifest, image, len(data))


def _decode(blob: memoryview, p: Mapping[str, Any], where: str) -> memoryview:
    """A part's bytes as written before encoding, exactly ``raw_size`` of them."""
    if p["encoding"] == "raw":
        _require(len(blob) == p["raw_size"], f"{where}: {len(blob)} bytes, the manifest says "
                 f"{p['raw_size']}")
        return blob
    d = zlib.decompressobj()
    try:
        # never more than the declared size: a hostile part cannot balloon past it
        out = d.decompress(blob, p["raw_size"] + 1)
    except zlib.error as e:
        raise BundleError(f"{where} does not decompress ({e})") from None
    _require(len(out) == p["raw_size"] and d.eof and not d.unconsumed_tail,
             f"{where}: decompresses to {len(out)}{'+' if not d.eof else ''} bytes, the "
             f"manifest says {p['raw_size']}")
    return memoryview(out)


def _load_safetensors(blob: bytes, where: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        return load(blob)
    except (SafetensorError, ValueError, TypeError, OverflowError, KeyError) as e:
        raise BundleError(f"{where} is not a valid safetensors blob ({e})") from None


class Bundle:
    """A loaded bundle: call it with the compiled function's (non-static, non-resident)
    arguments; ``manifest``, ``image``, ``stats()``, ``placement()``, ``report()``,
    ``step_list()``."""

    def __init__(self, contents: BundleContents, backend: str = "auto",
                 path: str = "") -> None:
        self.manifest = contents.manifest
        self.image = contents.image
        self.path = path
        self.size = contents.size
        chip = self.manifest["chip_profile"]
        from ..lowering.profile import profile_names

        if chip not in profile_names():
            raise BundleError(f"{path}: the bundle was compiled for chip {chip!r}, which this "
                              f"rockjit does not know (known: {', '.join(profile_names())}); "
                              f"use the rockjit that wrote it, or recompile")
        kind, _, want_chip = backend.partition(":")
        if want_chip and want_chip.lower() != chip:
            raise BundleError(f"{path}: the bundle was compiled for chip {chip!r}, the backend "
                              f"{backend!r} names {want_chip!r}; recompile for that chip")
        if kind == "auto":
            kind, _ = resolve_auto()
        chips = DEVICE_CHIPS.get(kind)
        if chips is not None and chip not in chips:
            raise BundleError(f"{path}: the bundle was compiled for chip {chip!r}; the {kind} "
                              f"device is {' / '.join(chips)}: recompile for it "
                              f"(rockjit compile ... backend {kind}:{chips[0]})")
        self.backend = kind
        self.device = make_device(kind, max(self.image.contexts, 1))
        from .program import load_image

        from .errors import RuntimeCError

        try:
            self.program = load_image(self.image, self.device)
        except RuntimeCError as e:
            self.device.close()
            raise BundleError(f"{path}: the runtime refused the bundle's program: {e}") from None
        except BaseException:
            self.device.close()
            raise
        sig = self.manifest["signature"]
        self._in_leaves = sig["inputs"]
        self._in_tree = sig["inputs_tree"]
        self._out_tree = sig["outputs_tree"]
        self._out_leaves = sig["outputs"]

    # ------------------------------------------------------------------ calling
    def flat_inputs(self, args: Sequence[Any]) -> list[np.ndarray]:
        """The arguments as the program's flat input list, each checked against the bundle's
        signature (shape, dtype; float64/int64 taken as float32/int32 as jax.jit does)."""
        if len(args) != len(self._in_tree):
            raise BundleError(f"the bundle takes {len(self._in_tree)} argument(s) (its inputs; "
                              f"static and resident arguments are compiled in), got {len(args)}")
        found: dict[int, Any] = {}
        for i, (spec, a) in enumerate(zip(self._in_tree, args)):
            tree_flatten_into(spec, a, found, f"argument {i}")
        return self._check_leaves([found[k] for k in range(len(self._in_leaves))])

    def _check_leaves(self, leaves: Sequence[tuple[str, Any]]) -> list[np.ndarray]:
        out = []
        for leaf, (path, x) in zip(self._in_leaves, leaves):
            name = leaf.get("name") or path
            want_shape, want_dt = tuple(leaf["shape"]), leaf["dtype"]
            # Python scalars as jax.jit types them (x64 off)
            if isinstance(x, bool):
                x = np.asarray(x, np.bool_)
            elif isinstance(x, int):
                x = np.asarray(x, np.int32)
            elif isinstance(x, float):
                x = np.asarray(x, np.float32)
            elif not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise BundleError(f"input {name}: expected an array, got {type(x).__name__}")
            x = np.asarray(x)
            got_dt = CANONICAL_DTYPE.get(x.dtype.name, x.dtype.name)
            if tuple(x.shape) != want_shape or got_dt != want_dt:
                raise BundleError(f"input {name}: the bundle was compiled for "
                                  f"{want_dt}{list(want_shape)}, got {x.dtype.name}"
                                  f"{list(x.shape)}; pass that shape and dtype (a bundle runs one "
                                  f"signature: compile another for other shapes)")
            out.append(x.astype(want_dt, copy=False))
        return out

    def call_flat(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Run on the flat input leaves (signature order), each checked; the flat outputs."""
        if len(inputs) != len(self._in_leaves):
            raise BundleError(f"the bundle takes {len(self._in_leaves)} input array(s), got "
                              f"{len(inputs)}")
        return self.run_flat(self._check_leaves([("", x) for x in inputs]))

    def run_flat(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.program.run(inputs)

    def __call__(self, *args: Any) -> Any:
        outs = self.run_flat(self.flat_inputs(args))
        trees = [tree_build(spec, outs) for spec in self._out_tree]
        return trees[0] if len(trees) == 1 else tuple(trees)

    # ------------------------------------------------------------------ describing
    def stats(self) -> dict[str, int]:
        return self.program.stats()

    def placement(self):
        """Where each op ran (NPU, host, view, const) and why: ``image.Placement`` records."""
        return list(self.image.placement)

    def report(self) -> str:
        return self.image.report()

    def step_list(self) -> str:
        return self.image.step_list()

    def close(self) -> None:
        self.program.close()
        self.device.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | os.PathLike, backend: str = "auto") -> Bundle:
    """Read, verify and load a bundle on a device; no JAX, no compiler."""
    return Bundle(read_bundle(path), backend, os.fspath(path))
