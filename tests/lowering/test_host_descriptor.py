"""A descriptor encoded once per structure and reused with other offsets (host_descriptor.py)
holds the same bytes as one encoded field by field with those offsets."""
from __future__ import annotations

import numpy as np

from rockjit.ir.types import DType
from rockjit.lowering.compile_cache import compile_scope
from rockjit.lowering.host_descriptor import DESC_DTYPE, HostView, encode_descriptor


def _by_hand(shape, views) -> bytes:
    # the rj_host_op fields written directly (an independent encoding of the same record)
    d = np.zeros((), DESC_DTYPE)
    d["rank"], d["ninputs"] = len(shape), len(views) - 1
    d["shape"][:len(shape)] = shape
    for i, v in enumerate(views):
        d["view"][i]["offset"] = v.offset
        d["view"][i]["stride"][:len(shape)] = v.strides
    return d.tobytes()


def _masked(b: bytes) -> bytes:
    # magic, version, kind and dtype codes come from the ABI tables: compared as encoded
    d = np.frombuffer(b, DESC_DTYPE).copy()
    d["magic"] = d["version"] = d["kind"] = 0
    d["view"]["dtype"] = 0
    return d.tobytes()


def test_reused_structure_takes_each_callers_offsets() -> None:
    rng = np.random.default_rng(3)
    with compile_scope():
        first = None
        for _ in range(20):
            lo = int(rng.integers(0, 1 << 36))
            views = [HostView("dst", DType.U8, lo, (96, 1)), HostView("src", DType.U8, lo + 7, (96, 1))]
            got = encode_descriptor("copy", (5, 64), views)
            assert _masked(got.tobytes()) == _masked(_by_hand((5, 64), views))
            if first is None:
                first = got
            else:   # the memo's copy is the caller's own: earlier results are untouched
                assert not np.shares_memory(first, got)
        assert np.frombuffer(first.tobytes(), DESC_DTYPE)["view"][0, 0]["offset"] != 0
