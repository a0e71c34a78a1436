"""The extra conformance cases (tests/sim/conformance_extra, built by
tools/gen_conformance_extra.py from public facts): each leaves its expected output -- computed
by the case's own numpy reference -- on the simulator, in the mode its ``simulator_flags`` name;
a case that shows a hardware quirk is refused by a strict, non-faithful simulator."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import CONFORMANCE, SimError, Simulator

HERE = Path(__file__).resolve().parent
EXTRA = HERE / "conformance_extra"
TOOL = HERE.parents[1] / "tools" / "gen_conformance_extra.py"
CASES = sorted(p.name for p in EXTRA.iterdir() if (p / "program" / "buffers.json").is_file())
RJ_EHAZARD = -4


class Case:
    """A case in the conformance format (the shared set's README, 'How a test loads a case')."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = json.loads((path / "program" / "buffers.json").read_text())

    def initial_memory(self) -> dict[str, tuple[int, bytearray]]:
        mem = {}
        for b in self.meta["buffers"]:
            data = bytearray(b["size"])
            if b["file"]:
                raw = (self.path / "program" / b["file"]).read_bytes()
                assert len(raw) == b["size"], b["name"]
                data[:] = raw
            mem[b["name"]] = (b["iova"], data)
        return mem

    def run(self, sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
        mem = self.initial_memory()
        for job in self.meta["jobs"]:
            placed = []
            for t in job["tasks"]:
                words = (self.path / "program" / t["file"]).read_bytes()
                for base, data in mem.values():
                    off = t["regcmd_iova"] - base
                    if 0 <= off and off + len(words) <= len(data):
                        data[off:off + len(words)] = words
                        break
                else:
                    raise AssertionError(f"regcmd IOVA {t['regcmd_iova']:#x} outside every buffer")
                placed.append((t["regcmd_iova"], len(words) // 8))
            sim.run_job(mem, placed)
        e = self.meta["expected_output"]
        got = np.frombuffer(bytes(mem[e["buffer"]][1][e["offset"]:e["offset"] + e["size"]]), e["dtype"])
        want = np.frombuffer((self.path / "expected_output.bin").read_bytes(), e["dtype"])
        return got.astype(np.float64), want.astype(np.float64)


def test_cases_exist():
    assert len(CASES) >= 4, CASES


@pytest.mark.parametrize("name", CASES)
def test_extra_case(name: str) -> None:
    case = Case(EXTRA / name)
    flags = case.meta.get("simulator_flags", [])
    got, want = case.run(Simulator(strict="lenient" not in flags, faithful="faithful" in flags))
    tol = case.meta["expected_output"]["tolerance"]
    assert got.shape == want.shape and not np.isnan(got).any()
    if tol["kind"] == "exact":
        assert np.array_equal(got, want)
    else:
        err = np.abs(got - want)
        assert err.max() <= tol["atol"], f"{name}: max |err| {err.max():.4g} at {int(err.argmax())}"


@pytest.mark.parametrize("name", [n for n in CASES if "faithful" in
                                  json.loads((EXTRA / n / "program" / "buffers.json").read_text())
                                  .get("simulator_flags", [])])
def test_quirk_case_is_refused_in_strict_mode(name: str) -> None:
    """Without RJ_SIM_FAITHFUL the documented quirk is a hazard (design.md convention 9)."""
    with pytest.raises(SimError) as e:
        Case(EXTRA / name).run(Simulator(strict=True))
    assert e.value.code == RJ_EHAZARD and "QUIRK" in e.value.message, e.value.message


@pytest.mark.parametrize("name", [n for n in CASES if "lenient" in
                                  json.loads((EXTRA / n / "program" / "buffers.json").read_text())
                                  .get("simulator_flags", [])])
def test_lenient_case_is_a_hazard_in_strict_mode(name: str) -> None:
    """A case whose geometry silicon is not documented to write is refused by strict mode."""
    with pytest.raises(SimError) as e:
        Case(EXTRA / name).run(Simulator(strict=True))
    assert e.value.code == RJ_EHAZARD, e.value.message


def test_quirk_cases_show_the_quirk():
    """The faithful cases are not vacuous: their expected outputs contain the quirk values."""
    for name, value in (("12_lut_elu_quirk2_faithful", 128.0), ("13_lut_exp_quirk4_faithful", 4.0)):
        want = Case(EXTRA / name).run(Simulator(strict=True, faithful=True))[1]
        hits = np.abs(want - value) < 1.0
        assert 5 <= hits.sum() < want.size, name


def test_generated_cases_are_up_to_date():
    """tools/gen_conformance_extra.py reproduces the committed files byte for byte."""
    rc = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True)
    assert rc.returncode == 0, rc.stdout + rc.stderr


def test_generator_framing_is_conformance_05():
    """The generator's flying LUT program is conformance 05's, word for word, given 05's
    tables and values (apart from the out-of-table slopes, which the shifted kinds zero)."""
    if not (CONFORMANCE / "05_lut_sigmoid_fp16").is_dir():
        pytest.skip("conformance set not present")
    sys.path.insert(0, str(TOOL.parent))
    import gen_conformance_extra as gen
    w = np.fromfile(CONFORMANCE / "05_lut_sigmoid_fp16" / "program" / "j0_t000.regcmd", dtype="<u8")
    v = ((w >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.int64)
    c = gen.LutCase("05", "", np.zeros(128, np.float16), v[3:516], v[517:1030], 2596.0,
                    0x80000000, 1, 15, {}, "")
    mine = np.array(gen.lut_words(c), dtype="<u8")
    assert mine.size == w.size
    assert list(np.flatnonzero(mine != w)) == [1055, 1056]   # DPU_LUT_LE_SLOPE_SCALE / SHIFT


def test_rj_sim_faithful_environment_flag(monkeypatch):
    """RJ_SIM_FAITHFUL=1 in the environment makes every simulator created afterwards faithful
    (csrc/runtime/envflags.c); it is registered on both sides (rockjit/debugflags.py)."""
    from rockjit import debugflags
    from rockjit.runtime import env_flags
    assert "RJ_SIM_FAITHFUL" in env_flags()
    assert "RJ_SIM_FAITHFUL" in {f.name for f in debugflags.registered()}
    case = Case(EXTRA / "13_lut_exp_quirk4_faithful")
    monkeypatch.setenv("RJ_SIM_FAITHFUL", "1")
    got, want = case.run(Simulator(strict=True))
    assert np.abs(got - want).max() <= 1e-3
    monkeypatch.setenv("RJ_SIM_FAITHFUL", "0")
    with pytest.raises(SimError):
        case.run(Simulator(strict=True))
