"""Shared pieces of the bundle tests: a small model with every kind of step (NPU matmuls, a
fused GELU LUT, softmax with its host row tails, host packs at the boundary), its weights, and
an independent reference (JAX on the CPU) with the fp16 error bound of its graph."""
from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import jax
import numpy as np

from rockjit.oracle import tolerance as T


def block(p, x):
    """matmul + bias + GELU, a second matmul, then a softmax over the last axis; returns a
    dict (a pytree output survives the bundle)."""
    h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
    y = h @ p["w2"]
    return {"y": y, "probs": jax.nn.softmax(y, axis=-1)}


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, 96)) / 8).astype(np.float32),
            "b1": rng.standard_normal(96).astype(np.float32),
            "w2": (rng.standard_normal((96, 48)) / 8).astype(np.float32)}


def example(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((16, 64)).astype(np.float32)


def save_block(path: Path, backend: str = "sim") -> tuple[np.ndarray, dict]:
    """``block`` compiled for ``backend`` with resident ``weights()``, run once on
    ``example()`` and saved as a bundle at ``path``: (that input, the in-process outputs)."""
    import rockjit

    p, x = weights(), example()
    f = rockjit.compile(block, resident_argnums=0, backend=backend)
    y = f(p, x)
    f.compiled(p, x).save(str(path))
    return x, y


def check_against_jax(compiled, params, x, got: dict) -> None:
    """``got`` (a bundle's or the compiled function's result) is within the graph's fp16
    bound of JAX on the CPU (the independent reference)."""
    ref = jax.tree_util.tree_leaves(jax.jit(block)(params, x))
    bounds = T.graph_bound(compiled.graph, compiled.params, [x])
    for g, r, b in zip(jax.tree_util.tree_leaves(got), ref, bounds):
        r = np.asarray(r, np.float64)
        T.check(np.asarray(g, np.float64), r, b + 2.0 ** -23 * np.abs(r), "bundle vs JAX")


# ---------------------------------------------------------------- container surgery
# The container layout (rockjit/runtime/bundle.py docstring), re-read here so tests can make
# hostile files whose hashes are consistent.
HEAD = struct.Struct("<8sII32s")


def _base(mlen: int) -> int:
    return -(-(HEAD.size + mlen) // 64) * 64


def split(data: bytes) -> tuple[dict, bytes]:
    """(manifest, the parts region) of a well-formed bundle."""
    _, _, mlen, _ = HEAD.unpack_from(data, 0)
    return json.loads(data[HEAD.size:HEAD.size + mlen]), data[_base(mlen):]


def join(manifest: dict, parts: bytes, version: int = 1, magic: bytes = b"RJBUNDLE") -> bytes:
    """A container around ``manifest`` (header hash recomputed) and the parts region."""
    m = json.dumps(manifest, indent=1, sort_keys=True).encode()
    head = HEAD.pack(magic, version, len(m), hashlib.sha256(m).digest()) + m
    return head + b"\0" * (_base(len(m)) - len(head)) + parts


def replace_part(data: bytes, name: str, blob: bytes) -> bytes:
    """The bundle with part ``name`` replaced by ``blob`` (encoded as the original was) and
    every size and hash recomputed (a crafted, self-consistent file)."""
    manifest, parts = split(data)
    order = sorted(manifest["parts"], key=lambda k: manifest["parts"][k]["offset"])
    blobs = {k: parts[manifest["parts"][k]["offset"]:
                      manifest["parts"][k]["offset"] + manifest["parts"][k]["size"]]
             for k in order}
    raw = {k: manifest["parts"][k]["raw_size"] for k in order}
    enc = {k: manifest["parts"][k]["encoding"] for k in order}
    blobs[name] = zlib.compress(blob, 1) if enc[name] == "zlib" else blob
    raw[name] = len(blob)
    out, pos = b"", 0
    for k in order:
        manifest["parts"][k] = {"offset": pos, "size": len(blobs[k]),
                                "sha256": hashlib.sha256(blobs[k]).hexdigest(),
                                "encoding": enc[k], "raw_size": raw[k]}
        out += blobs[k]
        pos += len(blobs[k])
        pad = -(-pos // 64) * 64 - pos
        out += b"\0" * pad
        pos += pad
    return join(manifest, out)


def part(data: bytes, name: str) -> bytes:
    """Part ``name`` as written before its encoding."""
    manifest, parts = split(data)
    p = manifest["parts"][name]
    stored = parts[p["offset"]:p["offset"] + p["size"]]
    return zlib.decompress(stored) if p["encoding"] == "zlib" else stored
