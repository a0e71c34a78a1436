"""`rockjit trace` prints the IR of each encoder at its published config, as a user runs it.

The expectations come from the architectures, not from our output: the input and output types,
one matmul per projection (SigLIP: 12 layers x (q, k, v, out, fc1, fc2, QK^T, PV) + the same 8
in the pooling head; ModernBERT: 22 x (Wqkv, Wo, Wi, Wo, QK^T, PV); Whisper-base: 6 x 8), one
LayerNorm rsqrt per norm, and every HF tensor as a named param."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models import modernbert, siglip, whisper
from rockjit.cli import main
from rockjit.ir.ops import Op
from rockjit.ir.parser import parse
from rockjit.ir.types import DType, TensorType
from rockjit.ir.verifier import verify

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / "models"
F32, I32 = DType.F32, DType.I32

# target -> (module, config, input types, output types, dot_generals, LayerNorms)
ENCODERS = {
    "models.siglip:trace_spec": (
        siglip, siglip.SiglipVisionConfig(), [TensorType(F32, (1, 3, 224, 224))],
        [TensorType(F32, (1, 196, 768)), TensorType(F32, (1, 768))], 12 * 8 + 8, 12 * 2 + 2),
    "models.modernbert:trace_spec": (
        modernbert, modernbert.ModernBertConfig(), [TensorType(I32, (1, 512))] * 2,
        [TensorType(F32, (1, 512, 768))], 22 * 6, 1 + 21 + 22 + 1),
    "models.whisper:trace_spec": (
        whisper, whisper.WhisperEncoderConfig.base(), [TensorType(F32, (1, 80, 3000))],
        [TensorType(F32, (1, 1500, 512))], 6 * 8, 6 * 2 + 1),
}


@pytest.fixture(scope="module")
def traced() -> dict[str, subprocess.CompletedProcess]:
    """All three `rockjit trace` runs started at once (each is mostly a jax import)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    procs = {t: subprocess.Popen([sys.executable, "-m", "rockjit.cli", "trace", t, "--stats"],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
             for t in ENCODERS}
    out = {}
    for t, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[t] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


def _count(graph, op: Op) -> int:
    return sum(n.op is op for n in graph.nodes)


@pytest.mark.parametrize("target", sorted(ENCODERS))
def test_trace_prints_each_encoder(traced, target: str) -> None:
    module, config, in_types, out_types, n_dot, n_norms = ENCODERS[target]
    r = traced[target]
    assert r.returncode == 0, r.stderr
    ir_text, stats = r.stdout.split("\n# op counts\n")
    graph = parse(ir_text)
    verify(graph)
    assert [v.type for v in graph.inputs] == in_types
    assert [v.type for v in graph.outputs] == out_types
    # Every HF tensor is a resident, named param of its checkpoint shape; none is an input.
    assert graph.params() == {k: TensorType(F32, s)
                              for k, s in module.expected_shapes(config).items()}
    assert _count(graph, Op.DOT_GENERAL) == n_dot
    # every LayerNorm is fused into one layer_norm op (the trace runs the fuse pass); none is
    # left as its primitive rsqrt chain
    assert _count(graph, Op.LAYER_NORM) == n_norms
    assert _count(graph, Op.RSQRT) == 0
    # Each node points at the model source that produced it.
    assert all(n.loc is not None and Path(n.loc.file).parent == MODELS_DIR
               for n in graph.nodes)
    counts = dict(line.split() for line in stats.strip().splitlines())
    assert int(counts.pop("total")) == len(graph.nodes)
    assert {k: int(v) for k, v in counts.items()} == graph.op_counts()
    print(f"\n[trace] {target}: {len(graph.nodes)} IR ops")


def _trace_in_process(capsys, *argv: str):
    assert main(["trace", *argv]) == 0
    return parse(capsys.readouterr().out)


def test_trace_takes_config_arguments(capsys) -> None:
    # image_size is a parameter: 512 px gives 32 x 32 = 1024 patch tokens.
    g = _trace_in_process(capsys, "models.siglip:trace_spec", "image_size=512",
                          "num_hidden_layers=1")
    assert [v.type for v in g.outputs] == [TensorType(F32, (1, 1024, 768)),
                                           TensorType(F32, (1, 768))]
    assert g.params()["embeddings.position_embedding.weight"] == TensorType(F32, (1024, 768))
    assert _count(g, Op.DOT_GENERAL) == 8 + 8
    # Whisper-tiny: d_model 384; a short ModernBERT with padding mask inputs of that length.
    g = _trace_in_process(capsys, "models.whisper:trace_spec", "preset=tiny", "encoder_layers=1")
    assert [v.type for v in g.outputs] == [TensorType(F32, (1, 1500, 384))]
    g = _trace_in_process(capsys, "models.modernbert:trace_spec", "seq_len=40",
                          "num_hidden_layers=2")
    assert [v.type for v in g.inputs] == [TensorType(I32, (1, 40))] * 2
    assert _count(g, Op.DOT_GENERAL) == 2 * 6


@pytest.mark.parametrize("argv,needle", [
    (["models.siglip:trace_spec", "image_sise=512"],
     "SiglipVisionConfig has no field(s) ['image_sise']"),
    (["models.siglip:trace_spec", "image_size=big"], "image_size takes int values, got 'big'"),
    (["models.siglip:trace_spec", "image_size=100"],
     "image_size 100 is not a multiple of patch_size 16"),
    (["models.whisper:trace_spec", "preset=huge"], "unknown Whisper preset 'huge'"),
    (["models.whisper:trace_spec", "layers"], "must look like name=value"),
])
def test_bad_config_arguments_are_usage_errors(capsys, argv: list[str], needle: str) -> None:
    assert main(["trace", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and len(err.strip().splitlines()) == 1, err
