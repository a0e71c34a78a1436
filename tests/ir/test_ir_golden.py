"""Golden text of two small models built with Builder; their values checked against numpy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.special

from rockjit.ir import Builder, DType, Graph, Loc, Op, TensorType, Value
from rockjit.ir.interpreter import run
from rockjit.ir.parser import parse
from rockjit.ir.printer import print_graph
from rockjit.ir.verifier import verify

GOLDEN = Path(__file__).parent / "golden"
F32 = DType.F32
MM = {"lhs_contract": [1], "rhs_contract": [0], "lhs_batch": [], "rhs_batch": []}


def T(*shape: int) -> TensorType:
    return TensorType(F32, shape)


def _scalar(b: Builder, x: float, like: TensorType, line: int, file: str) -> Value:
    c = b.add(Op.CONSTANT, [], attrs={"value": np.array(x, np.float32)}, loc=Loc(file, line))
    return b.add(Op.BROADCAST_IN_DIM, [c], like, {"broadcast_dimensions": []}, Loc(file, line))


def build_mlp() -> Graph:
    f = "mlp.py"
    b = Builder("mlp")
    x = b.input(T(4, 16))
    w1 = b.add(Op.PARAM, [], T(16, 32), {"name": "fc1.weight"}, Loc(f, 3))
    b1 = b.add(Op.PARAM, [], T(32), {"name": "fc1.bias"}, Loc(f, 3))
    w2 = b.add(Op.PARAM, [], T(32, 8), {"name": "fc2.weight"}, Loc(f, 5))
    h = b.add(Op.DOT_GENERAL, [x, w1], attrs=MM, loc=Loc(f, 3))
    bb = b.add(Op.BROADCAST_IN_DIM, [b1], T(4, 32), {"broadcast_dimensions": [1]}, Loc(f, 3))
    h = b.add(Op.ADD, [h, bb], loc=Loc(f, 3))
    # gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))
    t = b.add(Op.MUL, [h, _scalar(b, 0.70710677, h.type, 4, f)], loc=Loc(f, 4))
    t = b.add(Op.ERF, [t], loc=Loc(f, 4))
    t = b.add(Op.ADD, [t, _scalar(b, 1.0, h.type, 4, f)], loc=Loc(f, 4))
    t = b.add(Op.MUL, [h, t], loc=Loc(f, 4))
    g = b.add(Op.MUL, [t, _scalar(b, 0.5, h.type, 4, f)], loc=Loc(f, 4))
    y = b.add(Op.DOT_GENERAL, [g, w2], attrs=MM, loc=Loc(f, 5))
    return b.finish([y])


def build_attention() -> Graph:
    f = "attn.py"
    s, d = 6, 8
    b = Builder("attention")
    x = b.input(T(s, d))
    proj = {}
    for i, name in enumerate(("q", "k", "v")):
        w = b.add(Op.PARAM, [], T(d, d), {"name": f"attn.{name}.weight"}, Loc(f, 10 + i))
        proj[name] = b.add(Op.DOT_GENERAL, [x, w], attrs=MM, loc=Loc(f, 10 + i))
    scores = b.add(Op.DOT_GENERAL, [proj["q"], proj["k"]],
                   attrs={"lhs_contract": [1], "rhs_contract": [1], "lhs_batch": [],
                          "rhs_batch": []}, loc=Loc(f, 13))
    scores = b.add(Op.MUL, [scores, _scalar(b, 1 / np.sqrt(d), scores.type, 13, f)],
                   loc=Loc(f, 13))
    m = b.add(Op.REDUCE_MAX, [scores], attrs={"axes": [1]}, loc=Loc(f, 14))
    mb = b.add(Op.BROADCAST_IN_DIM, [m], T(s, s), {"broadcast_dimensions": [0]}, Loc(f, 14))
    e = b.add(Op.EXP, [b.add(Op.SUB, [scores, mb], loc=Loc(f, 14))], loc=Loc(f, 14))
    z = b.add(Op.REDUCE_SUM, [e], attrs={"axes": [1]}, loc=Loc(f, 15))
    zb = b.add(Op.BROADCAST_IN_DIM, [z], T(s, s), {"broadcast_dimensions": [0]}, Loc(f, 15))
    p = b.add(Op.DIV, [e, zb], loc=Loc(f, 15))
    ctx = b.add(Op.DOT_GENERAL, [p, proj["v"]], attrs=MM, loc=Loc(f, 16))
    wo = b.add(Op.PARAM, [], T(d, d), {"name": "attn.out.weight"}, Loc(f, 17))
    out = b.add(Op.DOT_GENERAL, [ctx, wo], attrs=MM, loc=Loc(f, 17))
    return b.finish([out])


def _check_golden(g: Graph, name: str) -> None:
    verify(g)
    expected = (GOLDEN / name).read_text()
    assert print_graph(g) == expected
    assert parse(expected) == g


def test_mlp_golden() -> None:
    _check_golden(build_mlp(), "mlp.ir")


def test_attention_golden() -> None:
    _check_golden(build_attention(), "attention.ir")


def _params(g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {k: rng.standard_normal(t.shape).astype(np.float32) / 4 for k, t in g.params().items()}


def test_mlp_values_match_numpy() -> None:
    g = parse((GOLDEN / "mlp.ir").read_text())
    rng = np.random.default_rng(0)
    p = _params(g, rng)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (y,) = run(g, [x], p)
    h = x.astype(np.float64) @ p["fc1.weight"] + p["fc1.bias"]
    h = 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(2)))
    np.testing.assert_allclose(y, h @ p["fc2.weight"], rtol=1e-5, atol=1e-6)


def test_attention_values_match_numpy() -> None:
    g = parse((GOLDEN / "attention.ir").read_text())
    rng = np.random.default_rng(1)
    p = _params(g, rng)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    (y,) = run(g, [x], p)
    x64 = x.astype(np.float64)
    q, k, v = (x64 @ p[f"attn.{n}.weight"] for n in "qkv")
    a = scipy.special.softmax(q @ k.T / np.sqrt(8), axis=1)
    np.testing.assert_allclose(y, a @ v @ p["attn.out.weight"], rtol=1e-5, atol=1e-6)


def run_mlp_against_numpy(g) -> tuple[np.ndarray, dict, np.ndarray]:
    """Run an MLP graph of ``build_mlp``'s shape (fused or not) on seeded inputs and check it
    against numpy float64: gelu(x @ fc1.weight + fc1.bias) @ fc2.weight. Returns (x, params, y)."""
    import scipy.special

    from rockjit.ir.interpreter import run

    rng = np.random.default_rng(0)
    p = {k: rng.standard_normal(t.shape).astype(np.float32) / 4 for k, t in g.params().items()}
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (y,) = run(g, [x], p)
    h = x.astype(np.float64) @ p["fc1.weight"] + p["fc1.bias"]
    h = 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(2)))
    np.testing.assert_allclose(y, h @ p["fc2.weight"], rtol=1e-5, atol=1e-6)
    return x, p, y
