"""matmul_epilogue{bias}: the structural match (ir/passes/epilogue.py), its golden text, its
values against numpy, what it must not match, and its expansion."""
from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from rockjit.ir import Builder, DType, Loc, Op, TensorType
from rockjit.ir.composites import expand
from rockjit.ir.interpreter import run
from rockjit.ir.parser import parse
from rockjit.ir.passes import PassManager
from rockjit.ir.passes.epilogue import fuse_matmul_epilogue
from rockjit.ir.printer import print_graph
from rockjit.ir.verifier import verify
from test_ir_golden import MM, build_mlp, run_mlp_against_numpy

GOLDEN = Path(__file__).parent / "golden"
F32 = DType.F32


def test_mlp_epilogue_golden() -> None:
    g = PassManager(["fuse", "fuse_epilogue"]).run(build_mlp())
    verify(g)
    text = print_graph(g)
    assert text == (GOLDEN / "mlp_epilogue.ir").read_text()
    assert parse(text) == g
    ops = g.op_counts()
    # fc1 (with a bias) fused; fc2 (no bias) stays a dot_general
    assert ops.get("matmul_epilogue") == 1 and ops.get("dot_general") == 1
    assert "add" not in ops and "broadcast_in_dim" not in ops


def test_epilogue_values_match_numpy() -> None:
    g = parse((GOLDEN / "mlp_epilogue.ir").read_text())
    x, p, y = run_mlp_against_numpy(g)
    # the expansion is the same function
    (y2,) = run(expand(g), [x], p)
    np.testing.assert_allclose(y2, y, rtol=1e-6, atol=1e-7)


def _linear(bias_from_input: bool = False, weight_from_input: bool = False,
            bias_axis: int = 1, extra_use: bool = False):
    b = Builder("lin")
    x = b.input(TensorType(F32, (8, 8)))    # square: a bias along the rows types too
    w = b.input(TensorType(F32, (8, 8))) if weight_from_input else \
        b.add(Op.PARAM, [], TensorType(F32, (8, 8)), {"name": "w"}, Loc("m.py", 1))
    v = b.input(TensorType(F32, (8,))) if bias_from_input else \
        b.add(Op.PARAM, [], TensorType(F32, (8,)), {"name": "b"}, Loc("m.py", 1))
    h = b.add(Op.DOT_GENERAL, [x, w], attrs=MM, loc=Loc("m.py", 1))
    vb = b.add(Op.BROADCAST_IN_DIM, [v], TensorType(F32, (8, 8)),
               {"broadcast_dimensions": [bias_axis]}, Loc("m.py", 1))
    y = b.add(Op.ADD, [vb, h], loc=Loc("m.py", 2))     # bias first: add matched both ways
    return b.finish([y, h] if extra_use else [y])


def test_matches_a_linear_either_operand_order() -> None:
    g = fuse_matmul_epilogue(_linear())
    assert g.op_counts() == {"param": 2, "matmul_epilogue": 1}


def test_what_is_not_an_epilogue() -> None:
    # a run-time bias or weight, a bias along the rows, a product used elsewhere
    for kw in ({"bias_from_input": True}, {"weight_from_input": True}, {"bias_axis": 0},
               {"extra_use": True}):
        g = _linear(**kw)
        assert "matmul_epilogue" not in fuse_matmul_epilogue(g).op_counts(), kw


def test_accept_can_refuse() -> None:
    g = _linear()
    assert fuse_matmul_epilogue(g, accept=lambda dot, bias: False) is g


def test_jax_linear_layer_fuses() -> None:
    import rockjit

    def f(p, x):
        return x @ p["w"].T + p["b"]        # models/layers.py's linear, 3-D input

    p = {"w": np.ones((16, 8), np.float32), "b": np.ones(16, np.float32)}
    x = np.zeros((1, 5, 8), np.float32)
    g = rockjit.compile(f, resident_argnums=(0,), backend="interpreter").lower(p, x).graph
    fused = fuse_matmul_epilogue(g)
    assert fused.op_counts().get("matmul_epilogue") == 1, print_graph(fused)
    rng = np.random.default_rng(3)
    p = {"w": rng.standard_normal((16, 8)).astype(np.float32),
         "b": rng.standard_normal(16).astype(np.float32)}
    x = rng.standard_normal((1, 5, 8)).astype(np.float32)
    names = sorted(g.params(), key=lambda k: g.params()[k].rank)    # b [16], w [16, 8]
    params = {names[0]: p["b"], names[1]: p["w"]}
    (y,) = run(fused, [x], params)
    want = np.asarray(jnp.asarray(x) @ jnp.asarray(p["w"]).T + jnp.asarray(p["b"]))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
