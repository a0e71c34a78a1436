"""Interpreter argument checking and memory release."""
from __future__ import annotations

import weakref

import numpy as np
import pytest

import rockjit.ir.reference as reference
from rockjit.errors import TraceError, WeightError
from rockjit.ir import Builder, DType, Loc, Op, TensorType
from rockjit.ir.interpreter import run

F32 = DType.F32


def _graph():
    b = Builder("g")
    x = b.input(TensorType(F32, (2, 3)))
    w = b.add(Op.PARAM, [], TensorType(F32, (2, 3)), {"name": "blk.w"}, Loc("m.py", 5))
    return b.finish([b.add(Op.ADD, [x, w])])


def test_runs_and_matches_numpy() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run(_graph(), [x], {"blk.w": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, x + 1)


def test_wrong_input_count() -> None:
    with pytest.raises(TraceError, match="takes 1 input"):
        run(_graph(), [], {})


def test_wrong_input_type_names_input_and_types() -> None:
    with pytest.raises(TraceError, match=r"input 0 .*expected f32\[2,3\], got f16\[2,3\]"):
        run(_graph(), [np.zeros((2, 3), np.float16)], {"blk.w": np.zeros((2, 3), np.float32)})
    with pytest.raises(TraceError, match=r"expected f32\[2,3\], got f32\[3,2\]"):
        run(_graph(), [np.zeros((3, 2), np.float32)], {"blk.w": np.zeros((2, 3), np.float32)})


def test_missing_and_mistyped_params() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(WeightError, match=r"'blk.w' \(declared f32\[2,3\] at m.py:5\) is not bound"):
        run(_graph(), [x], {})
    with pytest.raises(WeightError, match=r"'blk.w': expected f32\[2,3\], got f64\[2,3\]|"
                                          r"'blk.w': expected f32\[2,3\], got float64"):
        run(_graph(), [x], {"blk.w": np.zeros((2, 3))})


def test_op_errors_name_the_node() -> None:
    b = Builder()
    x = b.input(TensorType(F32, (4,)))
    i = b.input(TensorType(DType.I32, (1,)))
    g = b.finish([b.add(Op.TAKE, [x, i], attrs={"axis": 0}, loc=Loc("emb.py", 3))])
    with pytest.raises(IndexError, match="out of range") as e:
        run(g, [np.zeros(4, np.float32), np.array([4], np.int32)])
    assert any("emb.py:3" in n for n in e.value.__notes__)


def test_values_are_released_after_last_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # A chain of 30 element-wise ops: at most a handful of intermediates may be alive at once.
    b = Builder()
    x = b.input(TensorType(F32, (256, 256)))
    y = x
    for _ in range(30):
        y = b.add(Op.NEG, [y])
    g = b.finish([y])
    live: list[weakref.ref] = []
    peak = 0
    orig = reference.REFERENCE[Op.NEG]

    def tracking(ins, attrs, t):
        nonlocal peak
        out = orig(ins, attrs, t)
        live.append(weakref.ref(out))
        peak = max(peak, sum(r() is not None for r in live))
        return out

    monkeypatch.setitem(reference.REFERENCE, Op.NEG, tracking)
    (out,) = run(g, [np.ones((256, 256), np.float32)])
    np.testing.assert_array_equal(out, np.ones((256, 256), np.float32))
    assert peak <= 3, peak
