"""Our tiled-matmul, conv and depthwise lowerings against the foreign (independently generated,
hardware-validated) conformance programs 02, 04 and 09, register by register and field by field,
and then run on the simulator with the case's own data.

Every field where one of our tasks differs from the foreign task it corresponds to must be
listed in that case's DIFFS table with the reason the result is the same; any other difference
fails, and so does a table entry that no longer differs (the table must stay true)."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.lowering.emitters.conv import ConvSpec, build_conv2d
from rockjit.lowering.emitters.matmul import build_matmul
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import TRAILER_WORDS

from lowering_testutil import expected_output, meta, reference, task_words
from op_lowering_sim import MISSING, run_program

P = get_profile("rk3588")

# (register, field) -> why the differing value computes the same result.
DIFFS: dict[str, dict[tuple[str, str], str]] = {
    "02": {
        ("CNA_CBUF_CON0", "DATA_REUSE"):
            "the foreign job is one K step over both N tiles, so its second task reuses the "
            "resident A tile; our job is one output tile over its K steps (chained in one kick, "
            "notes encodings/regcmd-task-model.md 'in-kick data dependency'), so consecutive "
            "tasks never share A. DATA_REUSE only skips a re-fetch of identical bytes: results "
            "are bit-identical (notes encodings/cbuf-reuse.md)",
        ("TRAILER", "filler"):
            "our non-final K steps are self-chained: the trailer filler becomes PC_BASE_ADDRESS "
            "-> next segment (notes encodings/regcmd-task-model.md 'Contiguous chaining'); the "
            "foreign program submits each task as its own kick",
        ("PC_REGISTER_AMOUNTS", "PC_DATA_AMOUNT"):
            "same chaining: a linked trailer carries the next segment's length; the kernel "
            "programs the first one (rocket_job.c), so an unchained trailer holds 0",
        # fp32 K partials (emitters/conv.build_tiled): the precision-safe fp16 K-accumulation
        # the notes describe (encodings/sdp-stage-precision.md: ERDMA_DATA_SIZE 3 = 32-bit,
        # used as fp32 for this variant); the foreign program keeps fp16 partials, which round
        # the running sum to 11 bits once per K step. Each non-final step writes fp32 (output
        # precision, element size, no fp32->fp16 conversion, the fp32 cube's surface pitch)
        # into a partial slot of its own (other destination/operand addresses); each later step
        # reads it back as a 32-bit EW operand.
        ("DPU_DATA_FORMAT", "OUT_PRECISION"): "fp32 partials (see above)",
        ("DPU_BS_OW_CFG", "SIZE_E_0"): "fp32 partials: 4-byte output elements",
        ("DPU_BS_OW_CFG", "SIZE_E_1"): "fp32 partials: 4-byte output elements",
        ("DPU_BS_OW_CFG", "SIZE_E_2"): "fp32 partials: 4-byte output elements",
        ("DPU_OUT_CVT_SCALE", "FP32TOFP16_EN"): "fp32 partials are written without narrowing",
        ("DPU_SURFACE_ADD", "SURF_ADD"): "fp32 partials: an fp32 cube's surface pitch",
        ("DPU_DST_BASE_ADDR", "DST_BASE_ADDR"): "fp32 partials live in their own slots",
        ("DPU_RDMA_RDMA_ERDMA_CFG", "ERDMA_DATA_SIZE"): "the partial is read as 32-bit (3)",
        ("DPU_EW_CFG", "EDATA_SIZE"): "the partial is read as 32-bit (3)",
        ("DPU_RDMA_RDMA_EW_BASE_ADDR", "EW_BASE_ADDR"): "fp32 partials live in their own slots",
        ("DPU_RDMA_RDMA_SRC_BASE_ADDR", "SRC_BASE_ADDR"): "fp32 partials live in their own slots",
    },
    "04": {},
    "09": {},
}


def _decode(words: np.ndarray) -> list[tuple[str, dict[str, int]]]:
    out = []
    for i, w in enumerate(words.tolist()):
        op, value, offset = R.decode(w)
        if i == len(words) - TRAILER_WORDS:
            out.append(("TRAILER", {"filler": w}))
            continue
        reg = R.lookup(op & 0xFF00, offset) if op & 0xFF == R.OP_WRITE else None
        if reg is None:
            out.append((f"op{op:04x}@{offset:04x}", {"VALUE": value}))
        else:
            f = reg.unpack(value)
            f["_UNDECLARED_BITS"] = value & ~sum(x.mask for x in reg.fields) & 0xFFFFFFFF
            out.append((reg.full_name, f))
    return out


def field_diffs(ours: np.ndarray, theirs: np.ndarray) -> tuple[list[str], set[tuple[str, str]]]:
    """(problems that are not field differences, the set of differing (register, field))."""
    a, b = _decode(ours), _decode(theirs)
    problems: list[str] = []
    if [x[0] for x in a] != [x[0] for x in b]:
        problems.append(f"register sequence differs:\n ours   {[x[0] for x in a]}\n theirs "
                        f"{[x[0] for x in b]}")
        return problems, set()
    diffs = set()
    for (name, fa), (_, fb) in zip(a, b):
        for k, v in fa.items():
            if fb.get(k) != v:
                diffs.add((name, k))
    return problems, diffs


def _addresses(prefix: str, mapping: dict[str, str], prog) -> dict[str, int]:
    iova = {b["name"]: b["iova"] for b in meta(prefix)["buffers"]}
    out = {ours: iova[theirs] for ours, theirs in mapping.items()}
    assert set(out) >= {b.name for b in prog.buffers}, "every buffer needs a foreign address"
    return out


def _task_words(prog, addresses) -> list[list[np.ndarray]]:
    """Per job, per task (in kick order), the patched words of that task's segment."""
    out = []
    for job in prog.jobs():
        tasks = []
        for k in job.kicks:
            words = k.array(addresses)
            tasks += [words[o:o + n] for o, n in zip(k.task_offsets, k.task_counts)]
        out.append(tasks)
    return out


def _case02():
    ref = reference("02")
    a = ref.unpack_inputs(ref.load("input_tiles", np.float16))
    b = ref.unpack_weights(ref.load("weight_tiles", np.float16))
    # the foreign generator's forced tiling (ROCKET_MM_KT=64 ROCKET_MM_NT=16, case.md)
    prog = build_matmul(16, 192, 32, DType.F16, DType.F16, P, b=b, max_k=64, max_n=16)
    mapping = {"a": "input_tiles", "b": "weight_tiles", "c": "acc_ping", "kacc": "acc_pong",
               "regcmd": "regcmd"}
    # ours: job = N tile, task = K step; theirs: job = K step, task = N tile
    pairs = {(j, ki): (ki, j) for j in range(2) for ki in range(3)}
    from rockjit.lowering.layouts import pack_matrix
    inputs = {"a": pack_matrix(prog.buffer("a").layout, a)}
    return prog, mapping, pairs, inputs, "c"


def _case04():
    ref = reference("04")
    x = ref.unpack_cube(ref.load("input", np.float16), 64, 10, 12)
    w = ref.unpack_weight(ref.load("weight", np.float16))
    spec = ConvSpec(1, 64, 10, 12, 32, 3, 3, (2, 2), ((1, 0), (1, 0)))
    prog = build_conv2d(spec, DType.F16, DType.F16, P, w)
    lay = prog.buffer("x").layout
    inputs = {"x": lay.pack(np.ascontiguousarray(x.transpose(1, 2, 0)))}
    return prog, {"x": "input", "w": "weight", "y": "output", "regcmd": "regcmd"}, {(0, 0): (0, 0)}, inputs, "y"


def _case09():
    ref = reference("09")
    x = ref.unpack_cube(ref.load("input", np.float16), 64, 8, 12)
    w = ref.unpack_weight(ref.load("weight", np.float16))
    spec = ConvSpec(1, 64, 8, 12, 64, 3, 3, (2, 2), ((1, 0), (1, 0)), groups=64)
    prog = build_conv2d(spec, DType.F16, DType.F16, P, w.reshape(64, 1, 3, 3))
    lay = prog.buffer("x").layout
    inputs = {"x": lay.pack(np.ascontiguousarray(x.transpose(1, 2, 0)))}
    return prog, {"x": "input", "w": "weight", "y": "output", "regcmd": "regcmd"}, {(0, 0): (0, 0)}, inputs, "y"


CASES = {"02": _case02, "04": _case04, "09": _case09}


@pytest.mark.parametrize("prefix", sorted(CASES))
def test_registers_agree_with_foreign_program(prefix: str) -> None:
    prog, mapping, pairs, _, _ = CASES[prefix]()
    addrs = _addresses(prefix, mapping, prog)
    ours = _task_words(prog, addrs)
    assert sum(len(t) for t in ours) == len(pairs), "task count differs from the foreign program"
    seen: set[tuple[str, str]] = set()
    problems: list[str] = []
    for (j, t), (fj, ft) in pairs.items():
        mine, theirs = ours[j][t], task_words(prefix, fj, ft)
        assert len(mine) == len(theirs)
        probs, diffs = field_diffs(mine, theirs)
        problems += probs
        for d in diffs - set(DIFFS[prefix]):
            problems.append(f"job {j} task {t} vs foreign j{fj} t{ft}: {d[0]}.{d[1]} differs and "
                            f"is not in DIFFS[{prefix!r}]")
        seen |= diffs
        enable = int(meta(prefix)["jobs"][fj]["tasks"][ft]["enable_mask"], 16)
        job = prog.jobs()[j]
        assert enable in {e for k in job.kicks for e in k.enables}
    stale = set(DIFFS[prefix]) - seen
    assert not stale, f"DIFFS[{prefix!r}] lists fields that no longer differ: {sorted(stale)}"
    assert not problems, "\n".join(problems)


def test_field_comparison_can_fail() -> None:
    prog, mapping, pairs, _, _ = _case04()
    mine = _task_words(prog, _addresses("04", mapping, prog))[0][0].copy()
    idx = next(i for i, x in enumerate(_decode(mine)) if x[0] == "CNA_PAD_CON0")
    mine[idx] = R.emit("CNA_PAD_CON0", PAD_TOP=2, PAD_LEFT=1)
    _, diffs = field_diffs(mine, task_words("04"))
    assert diffs == {("CNA_PAD_CON0", "PAD_TOP")}


@pytest.mark.skipif(bool(MISSING), reason=MISSING or "simulator available")
@pytest.mark.parametrize("prefix", sorted(CASES))
def test_our_program_reproduces_expected_output(prefix: str) -> None:
    prog, _, _, inputs, out = CASES[prefix]()
    run = run_program(prog, inputs)
    exp = expected_output(prefix)
    assert run[out][:len(exp)].tobytes() == exp
