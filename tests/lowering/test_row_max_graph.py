"""Attention's row max on the PPU through rockjit.compile(..., backend="sim") against JAX on
CPU: the scores' max itself (a graph output) and a whole softmax attention, with a partial
last channel group and masked scores (a large negative bias, as models/layers.mask_bias;
-inf and ties are the emitter test's, test_row_max_ppu.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graphs_testutil import check_bound, run_sim


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
