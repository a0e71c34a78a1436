"""The bundle loader under hypothesis: truncations, flipped bytes, edited manifests and
edited (re-hashed) images.

* truncations, flipped bytes, edited manifests: the only way out is a BundleError, or a
  bundle whose outputs are bit-identical to the original's (a change the loader may accept:
  a flipped padding byte, an edited name or stats field, a reordered output pytree);
* an edited image.json whose hashes were recomputed is a self-consistent hostile file: it may
  describe another valid program, so its results may differ; it must still be refused with a
  BundleError, or load and then run or be refused by the C runtime's own checks (a
  RuntimeCError) -- never crash the process or raise anything else."""
from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rockjit
from rockjit.runtime.bundle import BundleError

from .bundle_testutil import join, part, replace_part, save_block, split

EXAMPLES = 500
# every example reads, verifies and (when it passes) loads and runs a ~100 KB bundle: about
# 30 ms each here; the bound leaves room for a loaded 2-core CI machine
TIME_BOUND_S = 120.0


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "block.rjb"
    x, y = save_block(path)
    return path.read_bytes(), x, sorted(np.asarray(v).tobytes() for v in y.values()), \
        path.parent / "mutated.rjb"


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64),
                      st.floats(allow_nan=False), st.text(max_size=8))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def _paths(obj, prefix=()):
    """Every path to a value inside a JSON document."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _edit(doc, path, value, delete: bool):
    doc = copy.deepcopy(doc)
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    if delete:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return doc


@st.composite
def mutations(draw, data: bytes) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["truncate", "flip", "manifest", "image"]))
    return kind, draw(_mutated(data, kind))


@st.composite
def _mutated(draw, data: bytes, kind: str) -> bytes:
    if kind == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            out[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if kind == "manifest":
        manifest, parts = split(data)
        paths = list(_paths(manifest))
        path = draw(st.sampled_from(paths))
        edited = _edit(manifest, path, draw(JSON_VALUE), draw(st.booleans()) and bool(path))
        return join(edited, parts) if isinstance(edited, dict) else \
            join({"not": "an object"}, parts)
    image = json.loads(part(data, "image.json"))
    paths = list(_paths(image))
    path = draw(st.sampled_from(paths))
    edited = _edit(image, path, draw(JSON_VALUE), draw(st.booleans()) and bool(path))
    return replace_part(data, "image.json", json.dumps(edited).encode())


@pytest.mark.slow
def test_loader_fuzz(original) -> None:
    data, x, want, path = original
    from rockjit.runtime.errors import RuntimeCError

    outcomes = {"refused": 0, "ran": 0, "call refused": 0, "image ran": 0,
                "image run refused by the runtime": 0}
    t0 = time.perf_counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(d) -> None:
        kind, mutated = d.draw(mutations(data), label="mutation")
        path.write_bytes(mutated)
        try:
            b = rockjit.load(path, backend="sim")
        except BundleError:
            outcomes["refused"] += 1
            return
        with b:
            try:
                y = b(x)
            except BundleError:
                outcomes["call refused"] += 1
                return
            except RuntimeCError:
                assert kind == "image", "only a re-hashed image may reach a runtime refusal"
                outcomes["image run refused by the runtime"] += 1
                return
        if kind == "image":
            outcomes["image ran"] += 1
            return
        leaves = y.values() if isinstance(y, dict) else [y]
        assert sorted(np.asarray(v).tobytes() for v in leaves) == want
        outcomes["ran"] += 1

    run()
    dt = time.perf_counter() - t0
    print(f"\n[fuzz] {EXAMPLES} examples in {dt:.1f} s: {outcomes}")
    assert sum(outcomes.values()) >= EXAMPLES
    assert outcomes["refused"] > EXAMPLES // 2
    assert dt < TIME_BOUND_S
