"""The regcmd BOs' words and the relocation table of a program image (ImageBuilder).

Every kick of every placed job is written once in its context's regcmd BO, at the span the
image builder gave its job (image_builder._lay_out_regcmd); its
address words become relocations (regcmd BO, word index, target BO, target byte offset, 0) that
the runtime patches at load. The layers share their kicks (compile_cache.py), so a kick's words
and relocations are taken apart once (``_KickParts``) and each placed copy only adds its
region's word index and its call's buffer addresses, as numpy columns over all of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .job_shapes import job_span

if TYPE_CHECKING:
    from .image_builder import ImageBuilder


def lay_out_regcmd(b: "ImageBuilder") -> tuple[dict[tuple[int, int, int], int], dict[int, int],
                                                set[tuple[int, int, int]]]:
    """Per context, the kicks of the jobs that run there, job after job, in schedule order. A
    call's jobs are dealt over the contexts, so reserving the call's whole regcmd region in
    each context would leave most of every BO unwritten (two thirds with three contexts). A
    job's kicks are one span of its call's region whose only regcmd addresses (chain links)
    point inside it (job_shapes.job_span checks), so the span moves as a whole. It keeps its
    offset modulo the PC's fetch alignment (16 bytes), so every alignment inside it holds, and
    a job's span starts where the one before it on that context ends (spans are whole 16-byte
    units): job_merge.py can chain them into one kick.

    Returns (``(context, call, span start) -> base``: the byte offset in the context's regcmd
    BO that the call's regcmd name resolves to for that job; per context, the bytes used; the
    keys placed by more than one job reference, whose words those references share)."""
    jbase: dict[tuple[int, int, int], int] = {}
    reused: set[tuple[int, int, int]] = set()
    rsize = {c: 0 for c in range(b.ncores)}
    align = b.lowered.profile.regcmd_align_bytes
    for st in b.steps:
        for jr in st.jobs:
            sp = b.rspec[jr.call]
            if sp is None:
                continue
            lo, hi = job_span(b._spans, jr.job, sp.name)
            key = (jr.core, jr.call, lo)
            if key in jbase:
                reused.add(key)
                continue
            pos = rsize[jr.core]
            pos += (lo - pos) % align
            jbase[key] = pos - lo
            rsize[jr.core] = pos + hi - lo
    return jbase, rsize, reused


class _KickParts:
    """A kick's words as u64 and its relocations as columns: word index, index into the
    distinct target names, offset in the target."""

    def __init__(self, kick) -> None:
        self.kick = kick                  # held: the cache is keyed by its id
        self.words = np.asarray(kick.words, dtype="<u8")
        self.names = list(dict.fromkeys(rel.buffer for rel in kick.relocs.values()))
        at = {n: i for i, n in enumerate(self.names)}
        rel = list(kick.relocs.items())
        self.wi = np.array([wi for wi, _ in rel], np.int64)
        self.name_ix = np.array([at[r.buffer] for _, r in rel], np.int64)
        self.off = np.array([r.offset for _, r in rel], np.int64)


def words_and_relocations(b: "ImageBuilder") -> tuple[dict[int, np.ndarray], np.ndarray]:
    """(per used context, its regcmd BO's words (unwritten gaps are zero); the (n, 5) u64
    relocation table, in step, job, kick and word order)."""
    words_of = {c: np.zeros(b.bos[b.regcmd_c[c]].size // 8, dtype="<u8") for c in b.used}
    written: set[tuple[int, int]] = set()
    parts: dict[int, _KickParts] = {}
    placed: list[_KickParts] = []
    s8s: list[int] = []
    bos: list[int] = []
    targets: list[tuple[int, int]] = []     # per placed kick, per distinct name: (BO, offset)
    first: list[int] = []                   # per placed kick, its first row in ``targets``
    for st in b.steps:
        for jr in st.jobs:
            names = b._job_names(jr)
            for kick in jr.job.kicks:
                bo, base = names[kick.regcmd_buffer]
                start = base + kick.base_offset
                if (bo, start) in written:      # a kick placed twice: written once
                    continue
                written.add((bo, start))
                assert start % 8 == 0 and bo == b.regcmd_c[jr.core]
                kp = parts.get(id(kick))
                if kp is None:
                    kp = parts[id(kick)] = _KickParts(kick)
                s8 = start // 8
                words_of[jr.core][s8:s8 + kp.words.size] = kp.words
                placed.append(kp)
                s8s.append(s8)
                bos.append(bo)
                first.append(len(targets))
                targets += [names[n] for n in kp.names]
    return words_of, _relocations(placed, s8s, bos, first, targets)


def _relocations(placed: list[_KickParts], s8s: list[int], bos: list[int], first: list[int],
                 targets: list[tuple[int, int]]) -> np.ndarray:
    if not placed:
        return np.zeros((0, 5), np.uint64)
    counts = np.array([kp.wi.size for kp in placed], np.int64)
    tgt = np.array(targets, np.int64).reshape(-1, 2)
    row = np.concatenate([kp.name_ix for kp in placed]) + np.repeat(np.array(first, np.int64),
                                                                    counts)
    out = np.zeros((int(counts.sum()), 5), np.int64)
    out[:, 0] = np.repeat(np.array(bos, np.int64), counts)
    out[:, 1] = np.repeat(np.array(s8s, np.int64), counts) + np.concatenate(
        [kp.wi for kp in placed])
    out[:, 2] = tgt[row, 0]
    out[:, 3] = tgt[row, 1] + np.concatenate([kp.off for kp in placed])
    if out.min() < 0:
        i = int(np.argmax((out < 0).any(axis=1)))
        raise ValueError(f"relocation {i} {out[i].tolist()}: a negative word index or address "
                         f"(a kick's relocation offset reaches before its target buffer)")
    # checked non-negative: the same bits as u64, without a copy (fresh pages cost ~10-35 us
    # each on the VM; the table is ~2 MB on ModernBERT x22)
    return out.view(np.uint64)
