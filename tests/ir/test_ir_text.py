"""Text form: random graphs round-trip exactly, errors carry line and column."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from ir_graphgen import graphs
from rockjit.errors import IRSyntaxError
from rockjit.ir import Builder, DType, Graph, Loc, Op, TensorType
from rockjit.ir.interpreter import run
from rockjit.ir.parser import parse
from rockjit.ir.printer import print_graph
from rockjit.ir.verifier import verify


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip_and_verify(g: Graph) -> None:
    verify(g)
    text = print_graph(g)
    g2 = parse(text)
    assert g2 == g
    assert print_graph(g2) == text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_nodes=8))
def test_random_graphs_run_with_exact_result_types(g: Graph) -> None:
    # Zeros are legal for every input (take indices, select_n selectors); the interpreter
    # checks each reference result against its node's declared type.
    ins = [np.zeros(v.type.shape, v.type.dtype.to_numpy()) for v in g.inputs]
    params = {k: np.zeros(t.shape, t.dtype.to_numpy()) for k, t in g.params().items()}
    outs = run(g, ins, params)
    for v, a in zip(g.outputs, outs):
        assert TensorType.of(a) == v.type


@pytest.mark.parametrize("dtype", list(DType))
def test_constants_round_trip_bit_exactly(dtype: DType) -> None:
    # Every bit pattern class: NaN payloads, -0, inf, subnormals, in both spellings.
    rng = np.random.default_rng(7)
    dt = dtype.to_numpy()
    for n in (0, 1, 5, 16, 17, 300):
        if dtype is DType.BOOL:
            a = rng.integers(0, 2, n).astype(bool)
        else:
            a = np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt.newbyteorder("<")).astype(dt)
        b = Builder()
        c = b.add(Op.CONSTANT, [], attrs={"value": a})
        g = b.finish([c])
        back = parse(print_graph(g)).nodes[0].attrs["value"]
        assert back.dtype == a.dtype and back.tobytes() == a.tobytes()


def test_small_float_constants_print_as_decimals() -> None:
    b = Builder()
    c = b.add(Op.CONSTANT, [], attrs={"value": np.array([0.5, -np.inf, np.nan, -0.0],
                                                        np.float32)})
    text = print_graph(b.finish([c]))
    assert "dense<f32[4]: [0.5, -inf, nan, -0.0]>" in text


SYNTAX_CASES = [
    # (text, line, column, words the message must contain)
    ("func @m(%0: f32[2]) {\n  %1 = neg(%0) f32[2]\n  return %1\n}", 2, 16, ["':'"]),
    ("func @m(%0: f33[2]) {\n  return %0\n}", 1, 13, ["f33", "f32"]),
    ("func @m(%0: f32[2]) {\n  %1 = frob(%0) : f32[2]\n  return %1\n}", 2, 8, ["frob"]),
    ("func @m() {\n  return %4\n}", 2, 10, ["%4", "before it is defined"]),
    ("func @m(%0: f32[2]) {\n  %0 = neg(%0) : f32[2]\n  return %0\n}", 2, 3, ["defined again"]),
    ("func @m() {\n  %1 = constant() {value=dense<i8[2]: [1, 300]>} : i8[2]\n  return %1\n}",
     2, 40, ["300", "i8"]),
    ("func @m(%0: f32[2]) {\n  %1 = neg(%0) : f32[2] @\n  return %1\n}", 2, 25, ["'@'"]),
]


@pytest.mark.parametrize("text,line,col,words", SYNTAX_CASES)
def test_syntax_errors_have_line_and_column(text: str, line: int, col: int,
                                            words: list[str]) -> None:
    with pytest.raises(IRSyntaxError) as e:
        parse(text)
    msg = str(e.value)
    assert msg.startswith(f"line {line}, column {col}:"), msg
    for w in words:
        assert w in msg, msg


def test_truncated_text_reports_end() -> None:
    with pytest.raises(IRSyntaxError, match=r"line 2, column \d+: .*expected"):
        parse("func @m(%0: f32[2]) {\n  return %0")


def test_comments_and_quoted_names() -> None:
    b = Builder("my model/v2")
    x = b.input(TensorType(DType.F32, (2,)))
    y = b.add(Op.NEG, [x], loc=Loc('dir "a"/x.py', 7))
    g = b.finish([y])
    text = print_graph(g)
    assert text.startswith('func @"my model/v2"(')
    assert parse("// header comment\n" + text.replace("\n  return", "  // trailing\n  return")) == g
