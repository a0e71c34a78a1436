"""The verifier and the shape rules reject each kind of broken graph with a useful message."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.errors import VerifyError
from rockjit.ir import Builder, DType, Graph, Loc, Node, Op, TensorType, Value
from rockjit.ir.rules import SHAPE_RULES, infer_type
from rockjit.ir.verifier import verify

F32 = DType.F32


def T(*shape: int, dt: DType = F32) -> TensorType:
    return TensorType(dt, shape)


def _ok_graph() -> tuple[Graph, Value]:
    b = Builder("g")
    x = b.input(T(2, 3))
    y = b.add(Op.EXP, [x], loc=Loc("m.py", 4))
    return b.finish([y]), x


def test_valid_graph_passes() -> None:
    g, _ = _ok_graph()
    verify(g)


def test_use_before_def() -> None:
    x = Value(0, T(2))
    ghost = Value(5, T(2))
    g = Graph("g", (x,), [Node(Op.ADD, (x, ghost), (Value(1, T(2)),), {}, Loc("m.py", 9))],
              (Value(1, T(2)),))
    with pytest.raises(VerifyError, match=r"node %1 = add at m.py:9: operand %5 is used before"):
        verify(g)


def test_use_with_wrong_type() -> None:
    x = Value(0, T(2))
    g = Graph("g", (x,), [Node(Op.NEG, (Value(0, T(3)),), (Value(1, T(3)),))],
              (Value(1, T(3)),))
    with pytest.raises(VerifyError, match=r"%0 is used as f32\[3\] but defined as f32\[2\]"):
        verify(g)


def test_redefinition() -> None:
    x = Value(0, T(2))
    g = Graph("g", (x,), [Node(Op.NEG, (x,), (Value(0, T(2)),), {}, Loc("m.py", 2))], (x,))
    with pytest.raises(VerifyError, match=r"node %0 = neg at m.py:2: %0 is defined again"):
        verify(g)


def test_duplicate_input() -> None:
    x = Value(0, T(2))
    with pytest.raises(VerifyError, match="declared twice"):
        verify(Graph("g", (x, x), [], (x,)))


def test_param_name_with_two_types() -> None:
    # Found by hypothesis: two params named "w" of different types cannot both be bound.
    b = Builder("g")
    b.add(Op.PARAM, [], T(2), {"name": "w"}, Loc("m.py", 1))
    b.add(Op.PARAM, [], T(2), {"name": "w"}, Loc("m.py", 2))   # same type: one weight, fine
    verify(b.finish([]))
    b.add(Op.PARAM, [], T(2, dt=DType.F16), {"name": "w"}, Loc("m.py", 3))
    with pytest.raises(VerifyError, match=r"node %2 = param at m.py:3: param 'w' is declared as "
                                          r"f16\[2\] here but as f32\[2\] by node %0 = param "
                                          r"at m.py:1"):
        verify(b.finish([]))


def test_undefined_output() -> None:
    g, _ = _ok_graph()
    g.outputs = (Value(9, T(2, 3)),)
    with pytest.raises(VerifyError, match=r"output 0 \(%9\) is never defined"):
        verify(g)


def test_output_type_mismatch() -> None:
    g, _ = _ok_graph()
    g.outputs = (Value(1, T(3, 2)),)
    with pytest.raises(VerifyError, match=r"output 0 \(%1\) is returned as f32\[3,2\]"):
        verify(g)


def test_missing_attr() -> None:
    x = Value(0, T(2, 3))
    g = Graph("g", (x,), [Node(Op.REDUCE_SUM, (x,), (Value(1, T(2)),), {}, Loc("m.py", 3))],
              (Value(1, T(2)),))
    with pytest.raises(VerifyError, match=r"reduce_sum at m.py:3: .*missing attribute\(s\) "
                                          r"\['axes'\]"):
        verify(g)


def test_extra_attr() -> None:
    x = Value(0, T(2))
    g = Graph("g", (x,), [Node(Op.NEG, (x,), (Value(1, T(2)),), {"alpha": 1})],
              (Value(1, T(2)),))
    with pytest.raises(VerifyError, match=r"unknown attribute\(s\) \['alpha'\]"):
        verify(g)


def test_node_type_disagrees_with_rule() -> None:
    x = Value(0, T(2, 3))
    w = Value(1, T(3, 4))
    bad = Value(2, T(2, 5))
    mm = {"lhs_contract": (1,), "rhs_contract": (0,), "lhs_batch": (), "rhs_batch": ()}
    g = Graph("g", (x, w), [Node(Op.DOT_GENERAL, (x, w), (bad,), mm, Loc("model.py", 12))],
              (bad,))
    with pytest.raises(VerifyError) as e:
        verify(g)
    msg = str(e.value)
    assert "node %2 = dot_general at model.py:12" in msg
    assert "f32[2,4]" in msg and "f32[2,5]" in msg


def test_multi_result_node_rejected() -> None:
    x = Value(0, T(2))
    g = Graph("g", (x,), [Node(Op.NEG, (x,), (Value(1, T(2)), Value(2, T(2))))],
              (Value(1, T(2)),))
    with pytest.raises(VerifyError, match="exactly one result"):
        verify(g)


# Each shape rule's checks, one illegal case per line: (op, operand types, attrs, hint, words)
_MM = {"lhs_contract": [1], "rhs_contract": [0], "lhs_batch": [], "rhs_batch": []}
_CONV = {"window_strides": [1], "padding": [[0, 0]], "lhs_dilation": [1], "rhs_dilation": [1],
         "feature_group_count": 1}
RULE_ERRORS = [
    (Op.PARAM, [], {"name": "w"}, None, "pass out_type"),
    (Op.PARAM, [], {"name": ""}, T(2), "non-empty"),
    (Op.CONSTANT, [], {"value": 3.0}, None, "numpy array"),
    (Op.IOTA, [], {"dimension": 2}, T(2, 2, dt=DType.I32), "out of range"),
    (Op.EXP, [T(2, dt=DType.I32)], {}, None, "floating-point"),
    (Op.NEG, [T(2, dt=DType.BOOL)], {}, None, "numeric"),
    (Op.INTEGER_POW, [T(2, dt=DType.I32)], {"y": -1}, None, "negative exponent"),
    (Op.ADD, [T(2), T(3)], {}, None, "one type"),
    (Op.ADD, [T(2), T(2, dt=DType.F16)], {}, None, "one type"),
    (Op.ADD, [T(2, dt=DType.BOOL)] * 2, {}, None, "numeric"),
    (Op.POW, [T(2, dt=DType.I32)] * 2, {}, None, "floating-point"),
    (Op.LT, [T(2), T(3)], {}, None, "one type"),
    (Op.SELECT_N, [T(2, dt=DType.F32), T(2), T(2)], {}, None, "bool or i32"),
    (Op.SELECT_N, [T(2, dt=DType.BOOL), T(2), T(2), T(2)], {}, None, "at most 2"),
    (Op.SELECT_N, [T(3, dt=DType.BOOL), T(2), T(2)], {}, None, "scalar or match"),
    (Op.SELECT_N, [T(2, dt=DType.BOOL), T(2), T(3)], {}, None, "one type"),
    (Op.REDUCE_SUM, [T(2, 3)], {"axes": [2]}, None, "out of range"),
    (Op.REDUCE_SUM, [T(2, 3)], {"axes": [1, 1]}, None, "repeats"),
    (Op.REDUCE_SUM, [T(2, 3)], {"axes": 1}, None, "list of integers"),
    (Op.REDUCE_WINDOW_MAX, [T(2, 3)], {"window_dimensions": [1], "window_strides": [1, 1],
                                       "padding": [(0, 0)] * 2}, None, "2 entries"),
    (Op.REDUCE_WINDOW_SUM, [T(2, 3)], {"window_dimensions": [1, 2], "window_strides": [1, 1],
                                       "padding": [0, 0]}, None, "(lo, hi)"),
    (Op.REDUCE_WINDOW_MAX, [T(2, 3)], {"window_dimensions": [1, 0], "window_strides": [1, 1],
                                       "padding": [(0, 0)] * 2}, None, ">= 1"),
    (Op.BROADCAST_IN_DIM, [T(3)], {"broadcast_dimensions": [0]}, T(2, 3), "cannot broadcast"),
    (Op.BROADCAST_IN_DIM, [T(3, 1)], {"broadcast_dimensions": [1, 0]}, T(3, 3),
     "strictly increasing"),
    (Op.BROADCAST_IN_DIM, [T(3)], {"broadcast_dimensions": []}, T(3), "1 entries"),
    (Op.BROADCAST_IN_DIM, [T(3)], {"broadcast_dimensions": [0]}, None, "pass out_type"),
    (Op.RESHAPE, [T(2, 3)], {}, T(5), "6 elements"),
    (Op.RESHAPE, [T(2, 3)], {}, T(6, dt=DType.F16), "dtype"),
    (Op.TRANSPOSE, [T(2, 3)], {"permutation": [0, 0]}, None, "not a permutation"),
    (Op.SLICE, [T(4)], {"start": [3], "limit": [2], "strides": [1]}, None, "start"),
    (Op.SLICE, [T(4)], {"start": [0], "limit": [4], "strides": [0]}, None, "stride"),
    (Op.CONCATENATE, [T(2, 3), T(2, 4)], {"dimension": 0}, None, "does not match"),
    (Op.CONCATENATE, [T(2, 3)], {"dimension": 2}, None, "out of range"),
    (Op.PAD, [T(3), T(1)], {"low": [0], "high": [0], "interior": [0]}, None, "scalar"),
    (Op.PAD, [T(3), T()], {"low": [-5], "high": [0], "interior": [0]}, None, "negative padding"),
    (Op.PAD, [T(3), T()], {"low": [0], "high": [0], "interior": [-1]}, None, "interior"),
    (Op.CONVERT, [T(3)], {}, T(4, dt=DType.I32), "only the dtype"),
    (Op.CONVERT, [T(3)], {}, None, "pass out_type"),
    (Op.DOT_GENERAL, [T(2, 3), T(4, 5)], _MM, None, "contracting"),
    (Op.DOT_GENERAL, [T(2, 3), T(3, 5, dt=DType.F16)], _MM, None, "one dtype"),
    (Op.DOT_GENERAL, [T(2, 3), T(3, 5)], {**_MM, "lhs_batch": [1], "rhs_batch": [0]}, None,
     "both batch and contracting"),
    (Op.DOT_GENERAL, [T(2, 3), T(3, 5)], _MM, T(2, 5, dt=DType.I32), "same kind"),
    (Op.CONV, [T(1, 4, 5), T(2, 3, 3)], _CONV, None, "input features"),
    (Op.CONV, [T(1, 4, 5), T(3, 2, 3)], {**_CONV, "feature_group_count": 2}, None,
     "not divisible"),
    (Op.CONV, [T(1, 4, 5), T(2, 4, 3)], {**_CONV, "padding": [0, 0]}, None, "(lo, hi)"),
    (Op.CONV, [T(4, 5), T(2, 4)], _CONV, None, "rank >= 3"),
    (Op.TAKE, [T(3, 4), T(2)], {"axis": 0}, None, "integers"),
    (Op.TAKE, [T(3, 4), T(2, dt=DType.I32)], {"axis": 2}, None, "out of range"),
    (Op.EXP, [T(2)], {}, T(3), "declared as f32[3]"),
    (Op.SOFTMAX, [T(2, 3, dt=DType.I32)], {"axes": [1]}, None, "floating-point"),
    (Op.SOFTMAX, [T(2, 3)], {"axes": []}, None, "at least one axis"),
    (Op.LAYER_NORM, [T(2, 3)], {"axes": [1], "eps": -1.0}, None, "eps must be a float >= 0"),
    (Op.ACTIVATION, [T(2)], {"kind": "swish"}, None, "unknown activation kind"),
]


@pytest.mark.parametrize("op,ins,attrs,hint,words", RULE_ERRORS,
                         ids=[f"{r[0].text}-{i}" for i, r in enumerate(RULE_ERRORS)])
def test_rule_rejects(op: Op, ins: list[TensorType], attrs: dict, hint: TensorType | None,
                      words: str) -> None:
    with pytest.raises(VerifyError) as e:
        infer_type(op, ins, attrs, hint)
    assert words in str(e.value)
    assert str(e.value).startswith(op.text)


def test_every_op_has_a_rule_exercised_by_rule_errors() -> None:
    assert set(SHAPE_RULES) == set(Op)
    covered = {r[0] for r in RULE_ERRORS}
    # Unary/binary/compare/reduce rules are shared per group; one member of each is enough.
    groups = {op.group for op in covered}
    assert groups == {op.group for op in Op}


def test_builder_error_names_value_and_location() -> None:
    b = Builder()
    x = b.input(T(2, 3))
    with pytest.raises(VerifyError, match=r"building %1 at model.py:7: reshape\(f32\[2,3\]\)"):
        b.add(Op.RESHAPE, [x], T(7), loc=Loc("model.py", 7))


def test_inferred_types() -> None:
    # Spot checks of result shapes against hand-derived jax.lax shapes.
    assert infer_type(Op.DOT_GENERAL, [T(2, 3, 4, 5), T(2, 6, 5, 4)],
                      {"lhs_contract": [3], "rhs_contract": [2], "lhs_batch": [0, 2],
                       "rhs_batch": [0, 3]}) == T(2, 4, 3, 6)
    assert infer_type(Op.CONV, [T(1, 3, 224, 224), T(768, 3, 16, 16)],
                      {"window_strides": [16, 16], "padding": [[0, 0], [0, 0]],
                       "lhs_dilation": [1, 1], "rhs_dilation": [1, 1],
                       "feature_group_count": 1}) == T(1, 768, 14, 14)
    assert infer_type(Op.CONV, [T(1, 80, 3000), T(384, 80, 3)],
                      {"window_strides": [2], "padding": [[1, 1]], "lhs_dilation": [1],
                       "rhs_dilation": [1], "feature_group_count": 1}) == T(1, 384, 1500)
    assert infer_type(Op.TAKE, [T(50, 8), T(2, 7, dt=DType.I32)], {"axis": 0}) == T(2, 7, 8)
    assert infer_type(Op.PAD, [T(3), T()], {"low": [1], "high": [-1], "interior": [2]}) == T(7)
    assert infer_type(Op.SLICE, [T(10)], {"start": [1], "limit": [8], "strides": [3]}) == T(3)
    assert infer_type(Op.LT, [T(4), T(4)], {}) == T(4, dt=DType.BOOL)
    assert infer_type(Op.CONSTANT, [], {"value": np.zeros((2, 1), np.int8)}) == T(2, 1,
                                                                                  dt=DType.I8)
