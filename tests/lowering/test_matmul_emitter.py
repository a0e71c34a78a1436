"""The matmul emitter against the foreign (independently generated, hardware-validated)
conformance programs, register by register and field by field.

Every field where our task differs from the foreign one must be listed in ALLOWED_DIFFS with
the reason it computes the same result; any other difference fails the test."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.lowering.emitters.matmul import emit_matmul, plan_matmul_tile
from rockjit.lowering.profile import get_profile
from rockjit.lowering.regcmd import LoweringError, Reloc, link

from lowering_testutil import meta, task_words

P = get_profile("rk3588")

# (register full name, field) -> why a differing value computes the same result.
# Empty: on the three programs below our words are identical to the foreign ones once the
# relocations are placed at the case's IOVAs. Add an entry (with its reason) before changing a
# formula in a way that moves a field away from the foreign programs.
ALLOWED_DIFFS: dict[tuple[str, str], str] = {}


def _decode(words: np.ndarray) -> list[tuple[str, int, int, dict[str, int]]]:
    """[(name, op, value, fields)] in program order; trailer ops keep their raw op."""
    out = []
    for w in words.tolist():
        op, value, offset = R.decode(w)
        reg = R.lookup(op & 0xFF00, offset) if op & 0xFF == R.OP_WRITE else None
        if reg is None:
            out.append((f"op{op:04x}@{offset:04x}", op, value, {"VALUE": value}))
        else:
            fields = reg.unpack(value)
            covered = sum(f.mask for f in reg.fields)
            fields["_UNDECLARED_BITS"] = value & ~covered & 0xFFFFFFFF
            out.append((reg.full_name, op, value, fields))
    return out


def register_diffs(ours: np.ndarray, theirs: np.ndarray) -> list[str]:
    """Problems that ALLOWED_DIFFS does not excuse (empty list = equivalent programs)."""
    a, b = _decode(ours), _decode(theirs)
    problems = []
    if [x[0] for x in a] != [x[0] for x in b]:
        problems.append(f"register sequence differs:\n ours   {[x[0] for x in a]}\n theirs "
                        f"{[x[0] for x in b]}")
        # still compare the registers both write, by name (last write wins)
    ra = OrderedDict((x[0], x[3]) for x in a)
    rb = OrderedDict((x[0], x[3]) for x in b)
    for name in set(ra) ^ set(rb):
        problems.append(f"{name} written by {'us' if name in ra else 'the foreign program'} only")
    for name in ra.keys() & rb.keys():
        for field, va in ra[name].items():
            vb = rb[name][field]
            if va != vb and (name, field) not in ALLOWED_DIFFS:
                problems.append(f"{name}.{field}: ours {va:#x}, foreign {vb:#x}")
    return problems


def _addresses(prefix: str) -> dict[str, int]:
    return {b["name"]: b["iova"] for b in meta(prefix)["buffers"]}


CASES = [
    # (case, job, task, M, K, N, in, out, A, B, C, reuse)
    ("01", 0, 0, 8, 64, 32, DType.F16, DType.F16, ("input", 0), ("weight", 0), ("output", 0), "none"),
    ("03", 0, 0, 8, 64, 64, DType.I8, DType.I32, ("input", 0), ("weight", 0), ("output", 0), "none"),
    ("02", 0, 0, 16, 64, 16, DType.F16, DType.F16, ("input_tiles", 0), ("weight_tiles", 0),
     ("acc_ping", 0), "none"),
    ("02", 0, 1, 16, 64, 16, DType.F16, DType.F16, ("input_tiles", 0), ("weight_tiles", 0x1800),
     ("acc_ping", 0x200), "data"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-j{c[1]}t{c[2]}" for c in CASES])
def test_task_matches_foreign_program(case) -> None:
    prefix, job, task, m, k, n, i, o, a, b, c, reuse = case
    tile = plan_matmul_tile(m, k, n, i, o, P)
    prog = emit_matmul(tile, P, Reloc(*a), Reloc(*b), Reloc(*c), reuse=reuse)
    theirs = task_words(prefix, job, task)
    ours = prog.array(_addresses(prefix))
    assert len(ours) == len(theirs)
    problems = register_diffs(ours, theirs)
    assert not problems, "\n".join(problems)
    enable = int(meta(prefix)["jobs"][job]["tasks"][task]["enable_mask"], 16)
    assert prog.enable == enable


def test_comparison_catches_a_changed_field() -> None:
    # the comparison must be able to fail: nudge one field of our case-01 task
    tile = plan_matmul_tile(8, 64, 32, DType.F16, DType.F16, P)
    prog = emit_matmul(tile, P, Reloc("input"), Reloc("weight"), Reloc("output"))
    ours = prog.array(_addresses("01"))
    idx = next(j for j, x in enumerate(_decode(ours)) if x[0] == "CNA_CONV_CON2")
    ours[idx] = R.emit("CNA_CONV_CON2", FEATURE_GRAINS=10)
    problems = register_diffs(ours, task_words("01"))
    assert problems == ["CNA_CONV_CON2.FEATURE_GRAINS: ours 0xa, foreign 0x9"]
    ours[5], ours[6] = ours[6], ours[5]
    assert any("sequence differs" in p for p in register_diffs(ours, task_words("01")))


def test_relocations_are_the_three_address_registers() -> None:
    tile = plan_matmul_tile(8, 64, 32, DType.F16, DType.F16, P)
    prog = emit_matmul(tile, P, Reloc("A", 0x40), Reloc("B"), Reloc("C", 0x100))
    named = {_decode(np.asarray(prog.words, "<u8"))[i][0]: r for i, r in prog.relocs.items()}
    assert named == {"CNA_FEATURE_DATA_ADDR": Reloc("A", 0x40), "CNA_DCOMP_ADDR0": Reloc("B"),
                     "DPU_DST_BASE_ADDR": Reloc("C", 0x100)}
    words = prog.array({"A": 0x10000, "B": 0x20000, "C": 0x30000})
    vals = {x[0]: x[2] for x in _decode(words)}
    assert (vals["CNA_FEATURE_DATA_ADDR"], vals["CNA_DCOMP_ADDR0"], vals["DPU_DST_BASE_ADDR"]) \
        == (0x10040, 0x20000, 0x30100)
    with pytest.raises(LoweringError, match="no device address"):
        prog.array({"A": 0})


# -- padding and planning ---------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n,i,o,pads", [
    (1, 64, 32, DType.F16, DType.F16, (4, 64, 32)),     # M==1 -> a 4-row tile (matmul-as-conv)
    (6, 40, 20, DType.F16, DType.F32, (8, 64, 32)),     # K%32, N%16
    (5, 70, 33, DType.I8, DType.I32, (8, 96, 64)),      # int8 N%32
])
def test_padding(m, k, n, i, o, pads) -> None:
    tile = plan_matmul_tile(m, k, n, i, o, P)
    assert (tile.m_pad, tile.k_pad, tile.n_pad) == pads
    fields = {x[0]: x[3] for x in _decode(np.asarray(
        emit_matmul(tile, P, Reloc("a"), Reloc("b"), Reloc("c")).words, "<u8"))}
    assert fields["CNA_DATA_SIZE0"]["DATAIN_HEIGHT"] == pads[0]
    assert fields["CNA_DATA_SIZE1"]["DATAIN_CHANNEL"] == pads[1]
    assert fields["CNA_WEIGHT_SIZE2"]["WEIGHT_KERNELS"] == pads[2]
    assert fields["CNA_DMA_CON2"]["SURF_STRIDE"] == pads[0] - 4


def test_host_packing_pads_with_zeros() -> None:
    tile = plan_matmul_tile(3, 40, 20, DType.F16, DType.F16, P)
    a = np.ones((3, 40), np.float16)
    raw = tile.pack_a(a).view(np.float16)
    assert raw.size == tile.m_pad * tile.k_pad and raw.sum() == 3 * 40
    b = np.ones((20, 40), np.float16)
    assert tile.pack_b(b).view(np.float16).sum() == 20 * 40
    with pytest.raises(LoweringError, match=r"B must be \[20, 40\]"):
        tile.pack_b(np.ones((40, 20), np.float16))


def test_int8_feature_gets_a_slack_bank() -> None:
    # cbuf-bank-slack.md: data_bank = ceil(feature/bank) + 1 for int8, fp16 exact
    i8 = plan_matmul_tile(128, 256, 64, DType.I8, DType.I32, P)     # 32 KiB feature: 1 bank
    f16 = plan_matmul_tile(128, 128, 64, DType.F16, DType.F16, P)   # 32 KiB feature: 1 bank
    assert (i8.data_banks, i8.weight_banks) == (2, 10)
    assert (f16.data_banks, f16.weight_banks) == (1, 11)


def test_refusals_name_the_limit() -> None:
    with pytest.raises(LoweringError, match="CBUF banks"):
        plan_matmul_tile(512, 4096, 256, DType.F16, DType.F16, P)
    with pytest.raises(LoweringError, match="1022 feature rows"):
        plan_matmul_tile(1023, 32, 16, DType.F16, DType.F16, P)
    with pytest.raises(LoweringError, match="not supported"):
        plan_matmul_tile(4, 32, 16, DType.I8, DType.F16, P)
    with pytest.raises(LoweringError, match="cube channel limit 8190"):
        plan_matmul_tile(4, 32, 8191, DType.F16, DType.F16, P)
    # 8 feature + 4 weight banks exactly fill the CBUF: fine for fp16, but int8's slack bank
    # (cbuf-bank-slack.md: budget 11, not 12) makes the same byte counts refuse
    f16 = plan_matmul_tile(512, 256, 256, DType.F16, DType.F16, P)
    assert (f16.data_banks, f16.weight_banks) == (8, 4)
    with pytest.raises(LoweringError, match="needs 9 feature \\+ 4 weight CBUF banks"):
        plan_matmul_tile(512, 512, 256, DType.I8, DType.I32, P)


def test_planner_reads_the_profile() -> None:
    import dataclasses
    small = dataclasses.replace(P, name="small-cbuf", cbuf_banks=4)
    plan_matmul_tile(256, 256, 256, DType.F16, DType.F16, P)
    with pytest.raises(LoweringError, match="more than the 4 of small-cbuf"):
        plan_matmul_tile(256, 256, 256, DType.F16, DType.F16, small)
    other = dataclasses.replace(P, name="other", encoding="rk3576")
    with pytest.raises(LoweringError, match="RK3588 register encoding"):
        plan_matmul_tile(8, 32, 16, DType.F16, DType.F16, other)


def test_integer_tasks_refuse_chaining() -> None:
    t8 = plan_matmul_tile(8, 64, 64, DType.I8, DType.I32, P)
    progs = [emit_matmul(t8, P, Reloc("a"), Reloc("b"), Reloc("c", 4096 * j)) for j in range(2)]
    with pytest.raises(LoweringError, match="integer accumulator"):
        link(progs, P, "regcmd")
    link(progs[:1], P, "regcmd")  # a single task is a plain kick
