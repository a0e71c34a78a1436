"""examples/whisper_transcribe.py end to end in a subprocess, as a user runs it: one short
espeak sentence, rockjit's encoder on the simulator with the real packaged Whisper-base, and
its transcript against the HF fp32 encoder's (both printed by the script)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_real_whisper import require_real_whisper, require_speech_tools

pytestmark = [pytest.mark.reference, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_whisper_transcribe_example(tmp_path):
    require_real_whisper()
    require_speech_tools()
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "whisper_transcribe.py"),
                        "--say", "Good morning. Please open the window.", "--runs", "0",
                        "--out", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    fields = dict(re.findall(r"^(\w[\w ]*?)\s{2,}(.*)$", r.stdout, re.M))
    assert fields["backend"] == "sim"
    assert float(fields["compile"].split()[0]) > 0
    assert "morning" in fields["hf fp32"].lower(), fields["hf fp32"]
    cos = float(fields["cosine"].split()[0])
    assert fields["transcript"] == fields["hf fp32"], f"cosine {cos}"
    # the example saves the compiled encoder as a bundle and runs it back: the same bits
    assert fields["bundle"].endswith("bit-identical"), fields["bundle"]
    assert (tmp_path / "whisper-base.rjb").stat().st_size > 0
