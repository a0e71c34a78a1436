"""A channel concat of NPU results costs no copy (issue 4, "Placement").

When every piece of a concat along the channel (last) axis is an NPU op's output cube with the
same rows, and every piece starts at a whole channel group, the pipeline places the producers'
output cubes side by side inside the concat's result cube (each at its group offset, the
parent's surface stride), and the concat is a view. Anything else (an offset inside a channel
group, a piece made on the host or given as input, a concat along another axis) takes the host
concat. Results are compared with JAX on CPU under tolerance.graph_bound (graphs_testutil), and
the free form with the host form of the same graph.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from graphs_testutil import check_bound, run_sim
from rockjit.lowering import concat_slots
from rockjit.oracle import tolerance as T
from rockjit.lowering.layouts import CubeLayout
from rockjit.lowering.rules import forms as F
from rockjit.lowering.rules.base import CubeForm


def _fused_qkv(p, x):
    # Q|K|V-style fusion: three projections of one input side by side, then one matmul
    qkv = jnp.concatenate([x @ p["wq"], x @ p["wk"], x @ p["wv"]], axis=-1)
    return qkv @ p["wo"]


def _pair(p, x):
    return jnp.concatenate([x @ p["w1"], x @ p["w2"]], axis=-1) @ p["w3"]


def _params(rng, d: int, widths: tuple[int, ...], names: tuple[str, ...], out: int,
            last: str) -> dict[str, np.ndarray]:
    p = {n: (rng.standard_normal((d, w)) / np.sqrt(d)).astype(np.float32)
         for n, w in zip(names, widths)}
    tot = sum(widths)
    p[last] = (rng.standard_normal((tot, out)) / np.sqrt(tot)).astype(np.float32)
    return p


def _concat_line(report: str) -> str:
    lines = [l for l in report.splitlines() if "= concatenate" in l]
    assert len(lines) == 1, report
    return lines[0]


def _host_only(monkeypatch) -> None:
    """The same compiler with no concat placement hints: every concat takes the host path."""
    monkeypatch.setattr(concat_slots, "SLICE_PLACEMENTS", {})


def test_qkv_concat_is_a_view_and_matches_jax_and_the_host_path(monkeypatch) -> None:
    rng = np.random.default_rng(40)
    d, m = 64, 20
    p = _params(rng, d, (32, 32, 64), ("wq", "wk", "wv"), 48, "wo")
    x = rng.standard_normal((m, d)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_fused_qkv, p, x)
    check_bound(got, ref, bound, "concat(Q, K, V) @ Wo, free concat")
    assert " view " in _concat_line(rep), rep
    # nothing but the boundary touches the host: x packed in, the result unpacked out
    assert st["retiles"] == 0 and st["host_steps"] == 2 and st["host_ops"] == 0, st
    # four matmuls back to back: one NPU step (lowering/coalesce.py)
    assert st["npu_ops"] == 4 and st["npu_steps"] == 1
    assert st["macs"] == m * d * 128 + m * 128 * 48

    _host_only(monkeypatch)
    hgot, href, hbound, hst, hrep = run_sim(_fused_qkv, p, x)
    assert " host " in _concat_line(hrep), hrep
    assert hst["host_ops"] == 1 and hst["retiles"] > 0 and hst["host_steps"] > st["host_steps"]
    check_bound(hgot, href, hbound, "concat(Q, K, V) @ Wo, host concat")
    T.check(got, hgot, bound, "free concat vs host concat")


@pytest.mark.parametrize("widths", [(16, 16), (16, 48), (48, 16)])
def test_pieces_narrower_than_the_matmul_k_atom_still_fit_their_slots(widths) -> None:
    # a piece is padded only to the N atom (16), not to the next matmul's K atom (32): wider
    # padding would spill into the next piece's groups
    rng = np.random.default_rng(41 + widths[0])
    p = _params(rng, 64, widths, ("w1", "w2"), 40, "w3")
    x = rng.standard_normal((12, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_pair, p, x)
    check_bound(got, ref, bound, f"concat{widths} @ W3")
    assert " view " in _concat_line(rep), rep
    assert st["retiles"] == 0 and st["host_steps"] == 2, st


def test_unaligned_concat_takes_the_host_and_is_correct() -> None:
    # the second piece would start at channel 20, inside the third group of 8
    rng = np.random.default_rng(42)
    p = _params(rng, 64, (20, 12), ("w1", "w2"), 40, "w3")
    x = rng.standard_normal((12, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_pair, p, x)
    check_bound(got, ref, bound, "concat(20, 12) @ W3")
    line = _concat_line(rep)
    assert " host " in line and "whole channel group" in line, line
    assert st["host_ops"] == 1 and st["retiles"] > 0, st


@pytest.mark.parametrize("t", [8, 7])
def test_batched_rows_concat_is_a_view(t: int) -> None:
    # [B, T, D] inputs: the batch is folded into the cube's rows, so the pieces still share
    # one surface stride (T = 7: the rows padded to 16 in the cube)
    rng = np.random.default_rng(43 + t)
    p = _params(rng, 64, (32, 64), ("w1", "w2"), 24, "w3")
    x = rng.standard_normal((2, t, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_pair, p, x)
    check_bound(got, ref, bound, f"batched concat @ W3, T={t}")
    assert " view " in _concat_line(rep), rep
    if t % 4 == 0:
        # (a [2, 7, N] result's padded rows cost a boundary re-tile with or without a concat)
        assert st["retiles"] == 0, st


def _reused_piece(p, x):
    a, b = x @ p["w1"], x @ p["w2"]
    return jnp.concatenate([a, b], axis=-1) @ p["w3"] + a @ p["w4"]


def test_a_piece_read_alone_never_takes_the_next_piece_as_its_padding() -> None:
    # a (16 channels) is also a matmul's A, which reads K padded to 32: the groups past a's
    # are b's, so that reader must get a re-tiled copy, not b's values as zero padding
    rng = np.random.default_rng(44)
    p = _params(rng, 64, (16, 16), ("w1", "w2"), 40, "w3")
    p["w4"] = (rng.standard_normal((16, 40)) / 4).astype(np.float32)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_reused_piece, p, x)
    check_bound(got, ref, bound, "concat(a, b) @ W3 + a @ W4")
    assert " view " in _concat_line(rep), rep


def _swapped(p, x):
    # a relu between: a swap of a projection's own columns is folded into its weights
    # (rotation_fold.py) and leaves no concatenate to test
    h = jnp.maximum(x @ p["w1"], 0.0)
    return jnp.concatenate([h[:, 32:], h[:, :32]], axis=-1) @ p["w3"]


def test_slices_of_one_cube_rejoin_only_in_their_own_order() -> None:
    rng = np.random.default_rng(45)
    p = _params(rng, 64, (64,), ("w1",), 40, "w3")
    x = rng.standard_normal((12, 64)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(_swapped, p, x)
    check_bound(got, ref, bound, "concat(h[:, 32:], h[:, :32]) @ W3")
    assert " host " in _concat_line(rep), rep


def test_channel_parent_slices_address_the_concatenated_elements() -> None:
    # the parent form's channel slices, read through the byte layout, are numpy's slices
    rng = np.random.default_rng(46)
    h, widths = 12, (16, 24, 8)
    tot = sum(widths)
    piece_lay = CubeLayout(h, 1, widths[0], 8, np.float16)
    piece = CubeForm(piece_lay, ("h", "c"), (0, 0), (h, widths[0]))
    parent = F.channel_parent(piece, (h, tot))
    assert parent is not None and parent.layout.surf_stride == piece_lay.surf_stride
    a = rng.standard_normal((h, tot)).astype(np.float16)
    raw = parent.layout.pack(a.reshape(h, 1, tot))
    at = 0
    for w in widths:
        sub, off = F.slice_form(parent, (0, at), (h, at + w), (1, 1))
        got = sub.layout.unpack(raw[off:]).reshape(h, w)
        np.testing.assert_array_equal(got, a[:, at:at + w])
        at += w
    # an emitter batch (items a whole cube apart) cannot be widened in place
    items = F.cube_form(piece_lay, (3, h, widths[0]), ("b", "h", "c"), piece_lay.nbytes)
    assert F.channel_parent(items, (3, h, tot)) is None
