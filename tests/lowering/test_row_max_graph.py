"""Attention's row max on the PPU through rockjit.compile(..., backend="sim") against JAX on
CPU: the scores' max itself (a graph output) and a whole softmax attention, with a partial
last channel group and masked scores (a large negative bias, as models/layers.mask_bias;
-inf and ties are the emitter test's, test_row_max_ppu.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_sim
from rockjit import cost


def scores_max(q, k, bias):
    return jnp.max(jnp.einsum("hpd,hqd->hpq", q, k) + bias, axis=-1)


def attention(q, k, v):
    s = jnp.einsum("hpd,hqd->hpq", q, k) * 0.125
    return jnp.einsum("hpq,hqd->hpd", jax.nn.softmax(s, axis=-1), v)


def _row_max_on_npu(rep: str) -> None:
    lines = [l for l in rep.splitlines() if "= reduce_max" in l]
    assert lines and all(" npu " in l and "build_row_max" in l for l in lines), rep


@pytest.mark.parametrize("heads,rows,npu_first", [(12, 256, False), (3, 124, True)])
def test_attention_scores_row_max(heads, rows, npu_first, monkeypatch) -> None:
    if npu_first:      # a small cube the cost model leaves on the host
        monkeypatch.setenv("ROCKJIT_NPU_FIRST", "1")
    rng = np.random.default_rng(heads * rows)
    q, k, v = (rng.standard_normal((heads, rows, 64)).astype(np.float32) for _ in range(3))
    bias = np.where(rng.random((heads, rows, rows)) > 0.3, 0, -30000).astype(np.float32)
    bias[:, 0, :] = -30000                 # a row masked everywhere
    bias[:, 1, :rows - 2] = -30000         # the max in the partial last channel group
    got, ref, bound, _, rep = run_sim(scores_max, None, q, k, bias)
    _row_max_on_npu(rep)
    check_bound(got, ref, bound, "scores row max")
    got, ref, bound, _, rep = run_sim(attention, None, q, k, v)
    _row_max_on_npu(rep)
    check_bound(got, ref, bound, "attention")


def test_the_tail_lanes_cross_cores_alone() -> None:
    """Keys not a multiple of 8 (SigLIP's 196, Whisper's 1500): the host adds the last group's
    real lanes to the PPU's row max. It reads those lanes of every head's scores, not the whole
    cube, so only they are copied between the cores' contexts (before: two thirds of every
    head's scores, Whisper-base 22.6 MB a layer); the softmax is still JAX's."""
    heads, rows = 6, 196
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((heads, rows, 64)).astype(np.float32) for _ in range(3))
    got, ref, bound, st, rep = run_sim(attention, None, q, k, v)
    _row_max_on_npu(rep)
    check_bound(got, ref, bound, "attention, 196 keys")
    f = rockjit.compile(attention, backend="null")
    f(q, k, v)
    before, pending = [], 0       # the bytes copied between contexts before each row max tail
    for s in cost.describe(cost.program_of(f.compiled(q, k, v))).steps:
        if isinstance(s, cost.CostHostStep) and s.label == "cross-context copy":
            pending += s.nbytes
            continue
        if "reduce_max" in (s.label or "") and isinstance(s, cost.CostHostStep):
            before.append(pending)
        pending = 0
    # at most the last channel plane of every head (the tail lanes' 16-byte atoms)
    last_planes = heads * rows * 16
    assert before and max(before) <= last_planes, (before, last_planes)
