"""Each context's regcmd BO holds only the kicks of the jobs that run there
(regcmd_image.lay_out_regcmd): a call whose jobs are dealt over three contexts does not reserve
its whole regcmd region in each. A job's kicks move as one span, which is faithful only when
their chain links point inside it (job_shapes.job_span refuses anything else).
"""
from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.lowering.job_shapes import job_span
from rockjit.lowering.loaded_graph import LoadedGraph
from rockjit.lowering.pipeline import lower_graph
from rockjit.lowering.regcmd import Kick, Reloc
from rockjit.oracle import tolerance as T
from rockjit.runtime import SimDevice


def _two_matmuls(p, x):
    return jnp.tanh(x @ p["w1"]) @ p["w2"]


def test_three_contexts_hold_only_their_own_kicks_and_still_match_numpy() -> None:
    rng = np.random.default_rng(5)
    p = {"w1": (rng.standard_normal((512, 2048)) / 23).astype(np.float32),
         "w2": (rng.standard_normal((2048, 1024)) / 45).astype(np.float32)}
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ref = np.tanh(x.astype(np.float64) @ p["w1"]) @ p["w2"]
    comp = rockjit.compile(_two_matmuls, resident_argnums=0).compiled(p, x)
    dev = SimDevice(cores=3)
    try:
        g = LoadedGraph(lower_graph(comp.graph, comp.params), dev)
        y, = g.run([x])
        T.check(y, ref, T.graph_bound(comp.graph, comp.params, [x])[0]
                + 2.0 ** -23 * np.abs(ref), "two matmuls on 3 contexts, tight regcmd")
        img = g.image
        regcmd = {k: bo for k, bo in enumerate(img.bos) if bo.role == "regcmd"}
        assert len(regcmd) == 3
        # what the jobs fetch, from the image alone: per regcmd BO, the task bytes (a job's
        # segments sit back to back, each at most 15 bytes of padding, each job's span at most
        # 63 bytes of alignment before it)
        fetched = dict.fromkeys(regcmd, 0)
        jobs = dict.fromkeys(regcmd, 0)
        for j in img.jobs:
            for bo, _, words in j.tasks:
                fetched[bo] += 8 * words + 15
            jobs[j.tasks[0][0]] += 1
        split = 0
        for k, bo in regcmd.items():
            assert bo.size <= fetched[k] + 63 * jobs[k], (k, bo.size, fetched[k], jobs[k])
            split += jobs[k] > 0
        assert split == 3
    finally:
        dev.close()


def _kick(base: int, nwords: int, relocs: dict[int, Reloc], buf: str = "regcmd") -> Kick:
    return Kick(buf, base, (0,) * nwords, relocs, (0,), (nwords,), (1,))


def test_a_job_span_refuses_a_chain_link_outside_it() -> None:
    job = types.SimpleNamespace(kicks=(_kick(64, 4, {1: Reloc("regcmd", 80)}),
                                       _kick(96, 4, {1: Reloc("w", 4096)})))
    assert job_span({}, job, "regcmd") == (64, 128)
    out = types.SimpleNamespace(kicks=(_kick(64, 4, {1: Reloc("regcmd", 128)}),))
    with pytest.raises(ValueError, match="outside its job's span"):
        job_span({}, out, "regcmd")
    other = types.SimpleNamespace(kicks=(_kick(0, 2, {}, buf="regcmd2"),))
    with pytest.raises(ValueError, match="not its call's regcmd"):
        job_span({}, other, "regcmd")
