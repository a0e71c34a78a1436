"""Golden lowering diffs (design.md convention 8): the regcmd words emitted for a fixed set of
small ops must stay byte-identical. A deliberate change regenerates the files with
ROCKJIT_UPDATE_GOLDEN=1 (registered in rockjit/debugflags.py) and is committed with its reason.

The programs themselves are checked elsewhere (test_conv_foreign.py against the hardware-
validated foreign programs, test_matmul_tiled.py / test_conv.py on the simulator); this file
only pins their exact words. Relocations are patched with fixed fake addresses so the files do
not depend on placement."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rockjit import debugflags
from rockjit.ir.types import DType
from rockjit.lowering import registers as R
from rockjit.lowering.emitters.conv import ConvSpec, lower_conv2d
from rockjit.lowering.emitters.matmul import lower_matmul
from rockjit.lowering.opprogram import HostStep, OpProgram
from rockjit.lowering.profile import get_profile

P = get_profile("rk3588")
GOLDEN = Path(__file__).resolve().parent / "golden"
F16, I8, I32 = DType.F16, DType.I8, DType.I32


def _ops() -> dict[str, OpProgram]:
    return {
        "matmul_f16_kacc_16x192x32_kt64_nt16": lower_matmul(
            16, 192, 32, F16, F16, P, b=np.zeros((32, 192), np.float16), max_k=64, max_n=16),
        "matmul_i8_8x128x64_kt64": lower_matmul(
            8, 128, 64, I8, I32, P, b=np.zeros((64, 128), np.int8), max_k=64),
        "conv3x3_s2_p1_f16_64x10x12_to_32": lower_conv2d(
            ConvSpec(1, 64, 10, 12, 32, 3, 3, (2, 2), ((1, 0), (1, 0))), F16, F16, P,
            np.zeros((32, 64, 3, 3), np.float16)),
        "dwconv3x3_s2_p1_f16_64x8x12": lower_conv2d(
            ConvSpec(1, 64, 8, 12, 64, 3, 3, (2, 2), ((1, 0), (1, 0)), groups=64), F16, F16, P,
            np.zeros((64, 1, 3, 3), np.float16)),
    }


def render(prog: OpProgram) -> str:
    """Every kick's words (relocations at fake addresses), one per line with its register."""
    fake = {b.name: 0x10000000 + 0x01000000 * i for i, b in enumerate(sorted(prog.buffers, key=lambda b: b.name))}
    lines = ["# buffers: " + ", ".join(f"{b.name}={b.role}:{b.nbytes}@{fake[b.name]:#x}"
                                      for b in prog.buffers)]
    for ji, job in enumerate(prog.jobs()):
        for ki, k in enumerate(job.kicks):
            lines.append(f"# job {ji} kick {ki}: regcmd+{k.base_offset:#x}, tasks "
                         f"{list(k.task_counts)}, enables {[hex(e) for e in k.enables]}")
            for i, w in enumerate(k.array(fake).tolist()):
                op, value, off = R.decode(w)
                reg = R.lookup(op & 0xFF00, off) if op & 0xFF == R.OP_WRITE else None
                name = reg.full_name if reg else f"op{op:04x}"
                rel = f"  <- {k.relocs[i].buffer}+{k.relocs[i].offset:#x}" if i in k.relocs else ""
                lines.append(f"{w:#018x} {name}{rel}")
    for s in prog.steps:
        if isinstance(s, HostStep):
            ops = ", ".join(f"{n}={sl.buffer}+{sl.offset:#x}:{sl.nbytes}" for n, sl in s.operands.items())
            lines.append(f"# host {s.kind}({ops}) {dict(sorted(s.params.items()))}")
    return "\n".join(lines) + "\n"


def first_difference(want: str, got: str) -> str:
    for i, (a, b) in enumerate(zip(want.splitlines(), got.splitlines())):
        if a != b:
            return f"line {i + 1}:\n  golden  {a}\n  emitted {b}"
    return f"length differs: golden {len(want.splitlines())} lines, emitted {len(got.splitlines())}"


@pytest.mark.parametrize("name", sorted(_ops()))
def test_golden_regcmd(name: str) -> None:
    got = render(_ops()[name])
    path = GOLDEN / f"{name}.txt"
    if debugflags.enabled("ROCKJIT_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
        pytest.skip(reason=f"ROCKJIT_UPDATE_GOLDEN is set: rewrote {path.name}; commit it with the reason")
    assert path.exists(), (f"no golden file {path}; generate it deliberately with "
                           f"ROCKJIT_UPDATE_GOLDEN=1 and review it")
    want = path.read_text()
    assert got == want, (f"{name}: emitted regcmd differs from {path.name} -- "
                         f"{first_difference(want, got)}\nIf the change is deliberate, rerun with "
                         f"ROCKJIT_UPDATE_GOLDEN=1 and commit the new file with the reason.")


def test_golden_comparison_can_fail() -> None:
    text = render(_ops()["conv3x3_s2_p1_f16_64x10x12_to_32"])
    changed = text.replace("CNA_PAD_CON0", "CNA_PAD_CON0 ", 1)
    assert changed != text and "line" in first_difference(text, changed)


def test_update_flag_is_registered() -> None:
    names = {f.name for f in debugflags.registered()}
    assert "ROCKJIT_UPDATE_GOLDEN" in names
    with pytest.raises(debugflags.FlagError):
        debugflags.value("ROCKJIT_NO_SUCH_FLAG")
