"""Rendering of an OpLowering's regcmd for the golden tests (test_golden_regcmd.py,
test_golden_layer.py): one word per line with its register name, relocations at fixed fake
addresses so the text does not depend on memory placement."""
from __future__ import annotations

from rockjit.lowering import registers as R
from rockjit.lowering.op_lowering import HostStep, OpLowering


def render(prog: OpLowering) -> str:
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
