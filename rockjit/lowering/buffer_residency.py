"""Residency per lowered buffer, over runs in the unplaced space (buffer id + 1 << ``SHIFT`` |
offset in the buffer): which contexts hold each buffer's current bytes. Core placement
(resident_placement.py) prices the copies with it and the image's walk (context_copies.py)
plans them with it.

Why per buffer and not per arena byte: two buffers share arena bytes only when their live
intervals are disjoint (memory.check_plan), every run lies inside one buffer (a run past its
buffer's end is refused here), and a buffer's bytes are reset to "current everywhere" when its
interval begins (context_copies.py: its old bytes are dead). So the bits of a buffer's bytes
are a function of that buffer's own writes and brings, and each buffer can keep them alone:

* a buffer written or brought whole is one set of contexts, an int, and needs no mask;
* a buffer touched in part gets a ContextResidency of its own, in cells of its own grain
  (``grains_by_buffer``): host steps that touch lane 0 of each row atom (2-byte chunks) make
  only their buffers fine, where one arena-wide mask took the finest grain of all (a 39 MB
  mask on ModernBERT x22, filled at ~10-35 us per fresh page on the VM).

The copies a run needs depend only on its bytes' bits (ContextResidency.bring plans in cells
and returns bytes, so the cell size does not change them).
"""
from __future__ import annotations

from typing import Sequence

from .residency_copies import ContextResidency, Run

SHIFT = 40


class _Node:
    """A buffer's history since its last uniform state: ``next``, the node each state-changing
    op leads to; ``answers``, what each query gave in this state."""

    __slots__ = ("next", "answers")

    def __init__(self) -> None:
        self.next: dict[tuple, _Node] = {}
        self.answers: dict[tuple, object] = {}


class BufferResidency:
    """Which contexts hold each lowered buffer's current bytes, over runs in the unplaced
    space. A buffer written or brought whole is one set of contexts (its *root*: no mask).
    After that its state is the sequence of partial writes and brings since the root, a node
    of a trie shared by all buffers of the same size, grain and root bits: the layers of a
    model repeat each buffer's ops at other buffer ids, so a query (``copies``, ``missing``,
    ``holder``) is answered once per distinct history. A query never seen is answered by the
    buffer's own ContextResidency, brought up to date by replaying the ops it has not seen."""

    def __init__(self, sizes: dict[int, int], contexts: Sequence[int], grain: int = 1,
                 grains: dict[int, int] | None = None, slack: int = 0) -> None:
        """``grains``: per buffer, the cell size of its residency (``grain_of_runs`` of the
        runs inside it; ``grain`` for a buffer it does not name): one buffer's runs share
        coarser cells than the whole arena's (a 2-byte grain anywhere would give every
        buffer a cell per 2 bytes). ``slack``: bytes a run may reach past its buffer's end
        (placement's runs are byte counts only; the walk's must stay inside)."""
        self.sizes, self.contexts = sizes, sorted(contexts)
        self.grain, self.grains, self.slack = grain, grains or {}, slack
        self.all = sum(1 << c for c in self.contexts)
        self.uniform: dict[int, int] = {}       # buffer -> its root's bits (absent: all)
        self.node: dict[int, _Node] = {}        # buffer -> its history node (absent: root)
        self.ops: dict[int, list[tuple]] = {}   # buffer -> its ops since the root
        self.mask: dict[int, tuple[ContextResidency, int]] = {}  # with how many ops applied
        self.roots: dict[tuple[int, int, int], _Node] = {}
        self.memo: dict = {}    # shared by the buffers' residencies (their runs repeat)
        self._splits: dict[Run, tuple[int, Run, bool]] = {}

    def _split(self, run: Run) -> tuple[int, Run, bool]:
        """(buffer, the run inside it, whether it covers the whole buffer); once per run (a
        job's runs are asked about by every query and op of the walk)."""
        hit = self._splits.get(run)
        if hit is None:
            bid = (run[0] >> SHIFT) - 1
            lo, pieces, pitch, chunk = run[0] & ((1 << SHIFT) - 1), run[1], run[2], run[3]
            whole = lo == 0 and (pieces <= 1 or pitch == chunk) and \
                pieces * chunk >= self.sizes[bid]
            hit = self._splits[run] = (bid, (lo, pieces, pitch, chunk), whole)
        return hit

    def _root(self, bid: int, bits: int | None) -> None:
        """The buffer's bytes all held by ``bits`` (None: every context)."""
        if bits is None:
            self.uniform.pop(bid, None)
        else:
            self.uniform[bid] = bits
        self.node.pop(bid, None)
        self.ops.pop(bid, None)
        self.mask.pop(bid, None)

    def _here(self, bid: int) -> _Node:
        """The buffer's history node (its root's when no partial op happened since)."""
        node = self.node.get(bid)
        if node is None:
            key = (self.sizes[bid] + self.slack, self.grains.get(bid, self.grain),
                   self.uniform.get(bid, self.all))
            node = self.roots.get(key)
            if node is None:
                node = self.roots[key] = _Node()
        return node

    def _step(self, bid: int, node: _Node, op: tuple) -> None:
        """A partial write ("w", run, ctx) or bring ("b", run, ctx) from ``node``."""
        nxt = node.next.get(op)
        if nxt is None:
            nxt = node.next[op] = _Node()
        self.node[bid] = nxt
        self.ops.setdefault(bid, []).append(op)

    def _res(self, bid: int) -> ContextResidency:
        """The buffer's mask, with every op since its root applied."""
        ops = self.ops.get(bid, ())
        res, done = self.mask.get(bid, (None, 0))
        if res is None:
            res = ContextResidency(self.sizes[bid] + self.slack, self.contexts,
                                   self.grains.get(bid, self.grain), self.memo,
                                   self.uniform.get(bid, self.all))
        for kind, r, ctx in ops[done:]:
            (res.write if kind == "w" else res.mark)(r, ctx)
        self.mask[bid] = (res, len(ops))
        return res

    def reset(self, bid: int) -> None:
        """The buffer's bytes are dead: every context holds "the" value (none is needed)."""
        self._root(bid, None)

    def missing(self, run: Run, contexts: Sequence[int]) -> list[int]:
        bid, r, _ = self._split(run)
        node = self.node.get(bid)
        if node is None:
            u = self.uniform.get(bid, self.all)
            return [0 if u >> c & 1 else r[1] * r[3] for c in contexts]
        key = ("m", r, tuple(contexts))
        hit = node.answers.get(key)
        if hit is None:
            hit = node.answers[key] = tuple(self._res(bid).missing(r, contexts))
        return list(hit)

    def bring(self, run: Run, ctx: int) -> None:
        """``copies``' effect on the state, without planning the copies (placement)."""
        bid, r, whole = self._split(run)
        if bid not in self.node:
            u = self.uniform.get(bid, self.all)
            if u >> ctx & 1:
                return
            if whole:
                self._root(bid, u | 1 << ctx)
                return
        self._step(bid, self._here(bid), ("b", r, ctx))

    def copies(self, run: Run, ctx: int) -> list[tuple[int, Run]]:
        """ContextResidency.bring of the run in its buffer: the copies (source context, run
        inside the buffer) that make it current in ``ctx``, recorded as done."""
        bid, r, whole = self._split(run)
        node = self.node.get(bid)
        if node is None:
            u = self.uniform.get(bid, self.all)
            if u >> ctx & 1:
                return []
            if whole:
                # what ContextResidency.bring gives for cells that all hold u: the run from
                # the first context holding it, contiguous pieces as one piece
                self._root(bid, u | 1 << ctx)
                src = next(c for c in self.contexts if u >> c & 1)
                lo, pieces, pitch, chunk = r
                if pieces <= 1 or pitch == chunk:
                    return [(src, (lo, 1, pieces * chunk, pieces * chunk))]
                return [(src, r)]
            node = self._here(bid)
        op = ("b", r, ctx)      # the transition, and the key of its answer
        hit = node.answers.get(op)
        if hit is None:
            # the mask answers, and marks the run: in step with the op recorded
            hit = node.answers[op] = tuple(self._res(bid).bring(r, ctx))
            self._step(bid, node, op)
            self.mask[bid] = (self.mask[bid][0], len(self.ops[bid]))
        else:
            self._step(bid, node, op)
        return list(hit)

    def write(self, run: Run, ctx: int) -> None:
        bid, r, whole = self._split(run)
        if whole:
            self._root(bid, 1 << ctx)
            return
        self._step(bid, self._here(bid), ("w", r, ctx))

    def holder(self, run: Run) -> int | None:
        """A context holding every byte of the run (the lowest first), or None."""
        bid, r, _ = self._split(run)
        node = self.node.get(bid)
        if node is None:
            u = self.uniform.get(bid, self.all)
            return next((c for c in self.contexts if u >> c & 1), None)
        key = ("h", r)
        hit = node.answers.get(key, -1)
        if hit == -1:
            hit = node.answers[key] = self._res(bid).holder(r)
        return hit
