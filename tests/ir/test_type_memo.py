"""infer_type answers remembered per question (ir/type_memo.py) are the rules' own answers:
an illegal question still raises every time, and questions that differ only in how a value
is spelled (1 vs 1.0 vs True, 0.0 vs -0.0) are not confused."""
from __future__ import annotations

import pytest

from rockjit.errors import VerifyError
from rockjit.ir import type_memo
from rockjit.ir.ops import Op
from rockjit.ir.rules import infer_type
from rockjit.ir.types import DType, TensorType


def test_a_repeated_question_gets_the_rules_answer() -> None:
    x = TensorType(DType.F32, (4, 6))
    for _ in range(3):
        assert infer_type(Op.TRANSPOSE, [x], {"permutation": (1, 0)}) == TensorType(DType.F32, (6, 4))
    assert infer_type(Op.TRANSPOSE, [x], {"permutation": (0, 1)}) == x


def test_an_illegal_question_raises_every_time() -> None:
    x = TensorType(DType.F32, (4, 6))
    for _ in range(2):
        with pytest.raises(VerifyError):
            infer_type(Op.TRANSPOSE, [x], {"permutation": (0, 0)})
        with pytest.raises(VerifyError):       # a hint the rule disagrees with
            infer_type(Op.TRANSPOSE, [x], {"permutation": (1, 0)}, x)


def test_spellings_of_equal_values_are_different_questions() -> None:
    keys = {type_memo._question(Op.ADD, [], {"v": v}, None) for v in (1, 1.0, True, 0.0, -0.0)}
    assert len(keys) == 5


def test_an_array_attribute_is_answered_without_the_memo() -> None:
    import numpy as np

    assert type_memo._question(Op.ADD, [], {"v": np.zeros(3)}, None) is None


def test_the_memo_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(type_memo, "_KNOWN_MAX", 4)
    monkeypatch.setattr(type_memo, "_KNOWN", {})
    for n in range(1, 20):
        infer_type(Op.NEG, [TensorType(DType.F32, (n,))], {})
        assert len(type_memo._KNOWN) <= 4
