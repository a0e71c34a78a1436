"""Cross-context copies only where a reader's context does not hold the current bytes
(rockjit/lowering/residency_copies.py, used by ImageBuilder._walk_steps).

The planner is checked against an independent model of the arenas: every context's mirror
holds, per byte, the id of the write whose value it has; writes stamp new ids into the writer's
mirror, the planned copies move ids between mirrors byte by byte, and every read must then see
the latest id of each byte. Placement by those copies (resident_placement.py) is checked on
hand-made steps: a job follows the data the step before left on a core, whatever the two
steps' tilings. On the simulator (each context's jobs see only their own arena,
csrc/runtime/sim_device.c) two small graphs spread over three cores give the eager scheme's bits
(ROCKJIT_EAGER_COPIES) with fewer bytes copied, within the numpy bound.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.lowering.loaded_graph import LoadedGraph
from rockjit.lowering.pipeline import lower_graph
from rockjit.cost import CostJob, CostTask
from rockjit.lowering.placement import StepJob
from rockjit.lowering.residency_copies import ContextResidency
from rockjit.lowering.buffer_residency import BufferResidency
from rockjit.lowering.resident_placement import ResidentPlacement
from rockjit.oracle import tolerance as T
from rockjit.runtime import SimDevice

ARENA = 4096


def _bytes(run) -> np.ndarray:
    lo, pieces, pitch, chunk = run
    return np.array([lo + i * pitch + j for i in range(pieces) for j in range(chunk)], np.int64)


class _Mirrors:
    """Per context, the write id each arena byte holds; ``truth``: the latest write id."""

    def __init__(self, contexts, grain: int = 1) -> None:
        self.res = ContextResidency(ARENA, contexts, grain)
        self.arena = {c: np.zeros(ARENA, np.int64) for c in contexts}
        self.truth = np.zeros(ARENA, np.int64)
        self.next_id = 1
        self.copied = 0

    def write(self, run, ctx: int) -> None:
        b = _bytes(run)
        self.arena[ctx][b] = self.truth[b] = self.next_id
        self.next_id += 1
        self.res.write(run, ctx)

    def read(self, run, ctx: int) -> list:
        b = _bytes(run)
        stale = int(np.count_nonzero(self.arena[ctx][b] != self.truth[b]))
        assert self.res.missing(run, [ctx]) == [stale], (run, ctx)   # what placement prices
        copies = self.res.bring(run, ctx)
        for src, r in copies:
            assert src != ctx
            b = _bytes(r)
            self.arena[ctx][b] = self.arena[src][b]
            self.copied += b.size
        b = _bytes(run)
        assert np.array_equal(self.arena[ctx][b], self.truth[b]), (run, ctx)
        return copies


def test_a_rewrite_after_a_copy_is_copied_again() -> None:
    m = _Mirrors([0, 1, 2])
    x = (256, 4, 64, 32)
    m.write(x, 0)
    assert m.read(x, 1) == [(0, x)]
    assert m.read(x, 1) == []                    # still current in 1
    m.write((256 + 64, 2, 64, 32), 0)           # context 0 rewrites two of the pieces
    assert m.read(x, 1) == [(0, (256 + 64, 2, 64, 32))]
    assert m.read(x, 0) == []


def test_a_value_made_on_context_1_moves_only_to_its_other_readers() -> None:
    m = _Mirrors([0, 1, 2])
    y = (1024, 8, 128, 64)
    m.write(y, 1)
    assert m.read(y, 1) == []                    # consumed where it was made: no copy
    m.write((1024 + 64, 1, 64, 64), 0)          # a gap between its pieces, made on ctx 0
    assert m.res.holder((1024, 1, 192, 192)) is None
    assert m.res.holder((1024, 1, 64, 64)) == 1  # one whole piece: a host step reads ctx 1
    assert m.read(y, 0) == [(1, y)]
    assert m.res.holder(y) == 0                  # both hold it now; context 0 preferred
    # context 2 wrote half of every piece since: ctx 0 needs exactly those halves, in one run
    m.write((1024 + 32, 8, 128, 32), 2)
    assert m.read(y, 0) == [(2, (1024 + 32, 8, 128, 32))]
    # context 1 needs the halves too; 0 holds them now and is asked first
    assert m.read(y, 1) == [(0, (1024 + 32, 8, 128, 32))]


def test_a_run_finer_than_the_grain_is_refused() -> None:
    res = ContextResidency(ARENA, [0, 1], grain=16)
    with pytest.raises(ValueError, match="16-byte cells"):
        res.write((8, 2, 32, 16), 1)


def test_dead_bytes_are_never_copied() -> None:
    m = _Mirrors([0, 1])
    m.write((0, 1, 512, 512), 1)
    m.res.reset(0, 512)                          # its buffer's live interval ended
    m.truth[:512] = 0                            # nothing may depend on the dead bytes
    assert m.res.bring((0, 1, 512, 512), 0) == []


@pytest.mark.parametrize("seed,grain", [(0, 1), (1, 1), (2, 4), (3, 16)])
def test_random_writes_and_reads_always_see_the_latest_bytes(seed, grain) -> None:
    rng = np.random.default_rng(seed)
    m = _Mirrors([0, 1, 2], grain)
    cells = ARENA // grain
    eager_bytes = 0
    for _ in range(150):
        pieces = int(rng.integers(1, 6))
        chunk = int(rng.integers(1, 48 // grain + 2))
        pitch = chunk + int(rng.integers(0, 40 // grain + 2))
        lo = int(rng.integers(0, cells - pieces * pitch - chunk))
        run = (lo * grain, pieces, pitch * grain, chunk * grain)
        ctx = int(rng.integers(0, 3))
        nbytes = pieces * chunk * grain
        if rng.random() < 0.4:
            m.write(run, ctx)
            eager_bytes += nbytes if ctx else 0      # copied back to context 0
        else:
            m.read(run, ctx)
            eager_bytes += nbytes if ctx else 0      # copied in from context 0
    assert m.copied < eager_bytes


def _buf(bid: int, off: int = 0) -> int:
    """An unplaced run start (ImageBuilder._ranges(placed=False)): buffer id << 40 + offset."""
    return ((bid + 1) << 40) + off


def _sj(macs: int, reads, writes) -> StepJob:
    return StepJob((CostJob(0, [CostTask({"fp16": macs}, 1 << 20, 1 << 20)], kicks=1),),
                   tuple(reads), tuple(writes))


def test_per_head_jobs_follow_the_scores_across_tilings() -> None:
    """QK^T in two jobs per head (row halves), then x - max in one job per head: each head's
    second step runs on the core that made its scores, so only the (small) max moves, though
    round-robin over the job index would put head h on core h mod 3 and job 2h on 2h mod 3."""
    heads, half = 6, 64 * 1024
    q, scores, mx, out = 0, 1, 2, 3
    res = BufferResidency({q: 4096, scores: heads * 2 * half, mx: heads * 256,
                           out: heads * 2 * half}, [0, 1, 2], grain=16)
    for b, n in ((q, 4096), (mx, heads * 256)):      # made on context 0
        res.write((_buf(b), 1, n, n), 0)
    walk = ResidentPlacement(res, host_reads={}, outputs=set())
    qk = [_sj(40_000_000, [(_buf(q), 1, 4096, 4096)],
              [(_buf(scores, (2 * h + r) * half), 1, half, half)])
          for h in range(heads) for r in range(2)]
    made, choice = walk.npu_step(qk, 3, 0, "qk")
    assert choice is not None and choice.cores == 3 and sorted(set(made)) == [0, 1, 2]
    for h in range(heads):                           # a head's halves on one core
        assert made[2 * h] == made[2 * h + 1]
    sub = [_sj(40_000_000, [(_buf(scores, 2 * h * half), 1, 2 * half, 2 * half),
                            (_buf(mx, h * 256), 1, 256, 256)],
               [(_buf(out, 2 * h * half), 1, 2 * half, 2 * half)]) for h in range(heads)]
    follow, choice = walk.npu_step(sub, 3, 1, "sub")
    assert follow == [made[2 * h] for h in range(heads)]
    assert choice.copy_bytes[3] == sum(256 for h in range(heads) if follow[h])
    # on one core the scores made elsewhere would move: the option was priced with them
    assert choice.copy_bytes[1] == sum(2 * half for h in range(heads) if made[2 * h])


def test_a_repeated_step_reuses_a_decision_only_where_its_data_lie_alike() -> None:
    """Placement remembers a step's decision by its jobs' costs and the bytes each core lacks
    (the layers repeat their steps at other offsets): the same jobs over scores made on three
    cores and over scores made on context 0 are priced apart, each as a walk that never saw the
    other prices it, and a layer whose data lie like the one before reuses its decisions."""
    import copy
    heads, half = 6, 64 * 1024
    kinds = (True, False, True, True)       # scores made on the cores / by a host step
    sizes = {0: 4096, 1: heads * 256}
    for i in range(len(kinds)):
        sizes[2 + 2 * i] = sizes[3 + 2 * i] = heads * 2 * half
    res = BufferResidency(sizes, [0, 1, 2], grain=16)
    for b, n in ((0, 4096), (1, heads * 256)):
        res.write((_buf(b), 1, n, n), 0)
    walk = ResidentPlacement(res, host_reads={}, outputs=set())
    qk_costs = [_sj(40_000_000, [], []).jobs for _ in range(2 * heads)]
    sub_costs = [(CostJob(0, [CostTask({"fp16": 1000}, 4096, 4096)], kicks=1),)
                 for _ in range(heads)]
    decided = []
    for layer, on_cores in enumerate(kinds):
        scores, out = 2 + 2 * layer, 3 + 2 * layer
        if on_cores:
            qk = [StepJob(qk_costs[j], ((_buf(0), 1, 4096, 4096),),
                          ((_buf(scores, j * half), 1, half, half),)) for j in range(2 * heads)]
            walk.npu_step(qk, 3, 2 * layer, "qk")
        else:
            walk.host_step([("dst", (_buf(scores), 1, 2 * heads * half, 2 * heads * half))])
        sub = [StepJob(sub_costs[h], ((_buf(scores, 2 * h * half), 1, 2 * half, 2 * half),
                                      (_buf(1, h * 256), 1, 256, 256)),
                       ((_buf(out, 2 * h * half), 1, 2 * half, 2 * half),)) for h in range(heads)]
        fresh = ResidentPlacement(copy.deepcopy(res), host_reads={}, outputs=set())
        want = fresh.npu_step(sub, 3, 2 * layer + 1, "sub")
        got = walk.npu_step(sub, 3, 2 * layer + 1, "sub")
        assert got == want
        decided.append((got[1].assignment, got[1].modelled_ms, got[1].copy_bytes))
    assert decided[1] != decided[0] and decided[1] != decided[2]
    assert decided[3] == decided[2]
    # qk and sub of layer 0; sub over context 0's scores; qk and sub once q and the max are
    # on every core (layer 2, reused by layer 3)
    assert len(walk._decided) == 5


def test_a_write_a_host_step_reads_whole_is_priced_as_copied_back() -> None:
    """Two jobs each make half of a value a host step reads whole: on a core > 0 a half will be
    copied to context 0 later, so placement prices it now; a graph output likewise."""
    n = 1 << 16
    res = BufferResidency({0: 2 * n, 1: 2 * n}, [0, 1, 2], grain=16)
    jobs = [_sj(1000, [], [(_buf(0, i * n), 1, n, n)]) for i in range(2)]
    walk = ResidentPlacement(res, host_reads={0: [(_buf(0), _buf(0) + 2 * n)]}, outputs={1})
    assert walk._back(jobs[1].writes[0]) == n
    assert walk._back((_buf(1), 1, 64, 64)) == 64
    quiet = ResidentPlacement(res, host_reads={0: [(_buf(0), _buf(0) + n)]}, outputs=set())
    assert quiet._back(jobs[0].writes[0]) == 0      # the host slice lies in the job's write


@pytest.mark.parametrize("seed", range(3))
def test_per_buffer_grains_count_the_bytes_of_a_byte_model(seed) -> None:
    """Placement keeps each buffer's residency in cells of that buffer's own grain
    (grains_by_buffer): the bytes each context lacks match a byte-per-cell model of the same
    writes and brings, and a run finer than its buffer's grain is refused."""
    from rockjit.lowering.residency_copies import grains_by_buffer
    rng = np.random.default_rng(seed)
    sizes = {0: 4096, 1: 4096, 2: 2048}
    unit = {0: 64, 1: 16, 2: 2}         # each buffer's runs in whole units of its own
    runs = []
    for bid, u in unit.items():
        for _ in range(12):
            chunk = u * int(rng.integers(1, 4))
            pieces = int(rng.integers(1, 4))
            pitch = chunk + u * int(rng.integers(0, 3))
            lo = u * int(rng.integers(0, (sizes[bid] - pieces * pitch) // u))
            runs.append((_buf(bid, lo), pieces, pitch, chunk))
    grains = grains_by_buffer(runs, 40)
    assert all(grains[b] % unit[b] == 0 for b in unit) and grains[0] > grains[2]
    cells = BufferResidency(sizes, [0, 1, 2], grains=grains)
    model = BufferResidency(sizes, [0, 1, 2], grain=1)
    for _ in range(60):
        run, ctx = runs[int(rng.integers(len(runs)))], int(rng.integers(3))
        assert cells.missing(run, range(3)) == model.missing(run, range(3))
        assert cells.holder(run) == model.holder(run)
        write = rng.random() < 0.5
        for res in (cells, model):
            (res.write if write else res.bring)(run, ctx)
    finer = (_buf(0, grains[0] // 2), 1, grains[0], grains[0])
    cells.write((_buf(0), 1, 64, 64), 1)        # a partial write: a mask of 64-byte cells
    with pytest.raises(ValueError, match="whole"):
        cells.missing(finer, range(3))


@pytest.mark.parametrize("shape", [(4, 8), (64, 96), (1, 5000)])
def test_the_bits_key_tells_any_two_views_apart(shape) -> None:
    """The residency's plans are remembered by the cells' bits of a run (_bits_key: the bytes,
    or for a large view its runs of equal bits): views with the same bits share a key
    wherever they lie, and a view one cell different (first, last, inside a run, at a run's
    edge) never does."""
    from rockjit.lowering.residency_copies import _bits_key
    rng = np.random.default_rng(0)
    rows, cols = shape
    base = np.repeat(rng.integers(0, 8, (rows, 3), dtype=np.uint8), -(-cols // 3), axis=1)
    base = np.ascontiguousarray(base[:, :cols])
    mask = np.zeros(rows * 2 * cols + 7, np.uint8)
    strided = mask[7:7 + rows * 2 * cols].reshape(rows, 2 * cols)[:, :cols]
    strided[...] = base
    assert _bits_key(strided) == _bits_key(base)
    flat = base.reshape(-1)
    for i in {0, flat.size - 1, flat.size // 2, cols // 3, cols // 3 - 1}:
        other = flat.copy()
        other[i] ^= 1
        assert _bits_key(other.reshape(shape)) != _bits_key(base), i
    # the same edges, other bits in one run (the last, the first); one bits value throughout
    for sl in (slice(flat.size - 1 - np.flatnonzero(flat[::-1] != flat[-1])[0], None),
               slice(0, np.flatnonzero(flat != flat[0])[0])):
        other = flat.copy()
        other[sl] = 9
        assert _bits_key(other.reshape(shape)) != _bits_key(base)
    assert _bits_key(np.zeros(shape, np.uint8)) != _bits_key(np.ones(shape, np.uint8))


def _two_uses(p, x):
    """h is made in N tiles on three cores; the next matmul's jobs on those cores read all of
    it, the LUT and the add read it on context 0."""
    h = x @ p["w1"]
    return jnp.tanh(h) + h @ p["w2"]


def _attention(p, x):
    """Six heads of attention at 256 tokens: QK^T, the row max, x - max, exp, the row sum and
    e @ v, made per head on every core."""
    q, k, v = ((x @ p[n]).reshape(256, 6, 32).transpose(1, 0, 2) for n in ("wq", "wk", "wv"))
    s = jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k), axis=-1)
    return jnp.einsum("hqk,hkd->hqd", s, v)


def _case(name: str, rng):
    if name == "two_uses":
        p = {"w1": (rng.standard_normal((512, 2048)) / 23).astype(np.float32),
             "w2": (rng.standard_normal((2048, 2048)) / 45).astype(np.float32)}
        x = rng.standard_normal((64, 512)).astype(np.float32)
        h = x.astype(np.float64) @ p["w1"]
        return _two_uses, p, x, np.tanh(h) + h @ p["w2"]
    p = {n: (rng.standard_normal((192, 192)) / 14).astype(np.float32) for n in ("wq", "wk", "wv")}
    x = rng.standard_normal((256, 192)).astype(np.float32)
    q, k, v = ((x.astype(np.float64) @ p[n]).reshape(256, 6, 32).transpose(1, 0, 2)
               for n in ("wq", "wk", "wv"))
    s = np.einsum("hqd,hkd->hqk", q, k)
    e = np.exp(s - s.max(-1, keepdims=True))
    return _attention, p, x, np.einsum("hqk,hkd->hqd", e / e.sum(-1, keepdims=True), v)


def _host_ops(st: dict) -> int:
    """Host ops other than the cross-context copies, a fused step counting each op it runs."""
    return (st["host_steps"] - st["host_copy_steps"] + st["host_fused_ops"]
            - st["host_fused_steps"])


@pytest.mark.parametrize("case", ["two_uses", "attention"])
def test_three_contexts_match_the_eager_copies_with_fewer_bytes(case, monkeypatch) -> None:
    fn, p, x, ref = _case(case, np.random.default_rng(11))
    comp = rockjit.compile(fn, resident_argnums=0).compiled(p, x)
    dev = SimDevice(cores=3)
    try:
        lazy = LoadedGraph(lower_graph(comp.graph, comp.params), dev)
        monkeypatch.setenv("ROCKJIT_EAGER_COPIES", "1")
        eager = LoadedGraph(lower_graph(comp.graph, comp.params), dev)
        y_lazy, = lazy.run([x])
        y_eager, = eager.run([x])
        sl, se = lazy.stats(), eager.stats()
        assert sl["cores_used"] == 3 and se["host_bytes_copied"] > 0
        # a missing copy would leave stale bytes in some context's arena: the bits differ
        assert np.array_equal(y_lazy, y_eager)
        T.check(y_lazy, ref, T.graph_bound(comp.graph, comp.params, [x])[0]
                + 2.0 ** -23 * np.abs(ref), f"{case} on 3 contexts, copies by residency")
        assert sl["host_bytes_copied"] < se["host_bytes_copied"]
        # the same host ops (copies placed apart, more or fewer of them run fused: host_fuse.py)
        assert _host_ops(sl) == _host_ops(se)
    finally:
        dev.close()


@pytest.mark.parametrize("case", ["two_uses", "attention"])
def test_the_walk_takes_placements_runs_as_if_it_had_asked_for_them(case) -> None:
    """ImageBuilder hands the image's walk the runs and grains placement found (WalkRuns): the
    walk must see what it finds asking the builder itself, the graph's boundary runs refining
    the grains included."""
    from rockjit.lowering.buffer_residency import SHIFT
    from rockjit.lowering.context_copies import ResidencyWalk, boundary_run, host_runs
    from rockjit.lowering.image_builder import ImageBuilder
    from rockjit.lowering.residency_copies import grains_by_buffer

    fn, p, x, _ = _case(case, np.random.default_rng(11))
    comp = rockjit.compile(fn, resident_argnums=0).compiled(p, x)
    b = ImageBuilder(lower_graph(comp.graph, comp.params), contexts=3)
    assert b._job_runs is not None and b._job_runs.grains
    told = ResidencyWalk(b, b._job_runs)
    # what the walk would find asking the builder itself
    ranges = {id(jr): (b._ranges(jr, "r", placed=False), b._ranges(jr, "w", placed=False))
              for st in b.steps for jr in st.jobs}
    host = {(st.host[0], id(st.host[1])): host_runs(b, *st.host)
            for st in b.steps if st.kind != "npu"}
    boundary = [r for bd in (*b.lowered.inputs, *b.lowered.outputs)
                if (r := boundary_run(b, bd)) is not None]
    every = [r for rw in ranges.values() for rs in rw for r in rs]
    every += [r for hr in host.values() for _, r in hr]

    def runs(rs):
        return {k: tuple(map(tuple, rw)) for k, rw in rs.items()}

    assert runs(told.ranges) == runs(ranges) and told.host == host
    assert told.res.grains == grains_by_buffer(every + boundary, SHIFT)
