"""The one op enum of the rockjit IR, grouped by kind.

Each op's meaning is defined by two registries keyed on this enum: its shape/dtype rule
(``rockjit.ir.rules``) and its numpy reference (``rockjit.ir.reference``).  Attribute names
listed here are the complete, required attribute set of each op; the verifier enforces them.
"""
from __future__ import annotations

import enum


class Group(enum.Enum):
    SOURCE = "source"          # values that come from outside the dataflow
    UNARY = "unary"            # element-wise, one operand
    BINARY = "binary"          # element-wise, two operands of one type
    COMPARE = "compare"        # element-wise, two operands -> bool
    SELECT = "select"
    REDUCE = "reduce"
    WINDOW = "window"          # sliding-window reductions (pooling), like lax.reduce_window
    SHAPE = "shape"            # data movement without arithmetic
    CONVERT = "convert"
    CONTRACT = "contract"      # dot_general, conv
    INDEX = "index"            # gather-like
    COMPOSITE = "composite"    # found by fusion, expanded again before lowering (composites.py)


class Op(enum.Enum):
    # value = (text name, group, attribute names)
    CONSTANT = ("constant", Group.SOURCE, ("value",))      # inline literal (numpy array)
    PARAM = ("param", Group.SOURCE, ("name",))             # resident named constant
    IOTA = ("iota", Group.SOURCE, ("dimension",))

    NEG = ("neg", Group.UNARY, ())
    ABS = ("abs", Group.UNARY, ())
    EXP = ("exp", Group.UNARY, ())
    LOG = ("log", Group.UNARY, ())
    TANH = ("tanh", Group.UNARY, ())
    LOGISTIC = ("logistic", Group.UNARY, ())
    ERF = ("erf", Group.UNARY, ())
    SQRT = ("sqrt", Group.UNARY, ())
    RSQRT = ("rsqrt", Group.UNARY, ())
    SIN = ("sin", Group.UNARY, ())
    COS = ("cos", Group.UNARY, ())
    INTEGER_POW = ("integer_pow", Group.UNARY, ("y",))
    # a composite element-wise function found by fusion (ir/passes/fuse.py); ``kind`` names
    # its record in ir/activations.py (gelu, gelu_tanh, silu, mish, softplus)
    ACTIVATION = ("activation", Group.UNARY, ("kind",))

    ADD = ("add", Group.BINARY, ())
    SUB = ("sub", Group.BINARY, ())
    MUL = ("mul", Group.BINARY, ())
    DIV = ("div", Group.BINARY, ())
    MAX = ("max", Group.BINARY, ())
    MIN = ("min", Group.BINARY, ())
    POW = ("pow", Group.BINARY, ())

    EQ = ("eq", Group.COMPARE, ())
    NE = ("ne", Group.COMPARE, ())
    LT = ("lt", Group.COMPARE, ())
    LE = ("le", Group.COMPARE, ())
    GT = ("gt", Group.COMPARE, ())
    GE = ("ge", Group.COMPARE, ())

    SELECT_N = ("select_n", Group.SELECT, ())              # (which, *cases), like lax.select_n

    REDUCE_SUM = ("reduce_sum", Group.REDUCE, ("axes",))
    REDUCE_MAX = ("reduce_max", Group.REDUCE, ("axes",))

    # One window per axis (dilation 1); padding is ((lo, hi), ...) per axis. Padded positions
    # count as -inf for the max and 0 for the sum, as in lax.reduce_window_{max,sum}.
    REDUCE_WINDOW_MAX = ("reduce_window_max", Group.WINDOW,
                         ("window_dimensions", "window_strides", "padding"))
    REDUCE_WINDOW_SUM = ("reduce_window_sum", Group.WINDOW,
                         ("window_dimensions", "window_strides", "padding"))

    BROADCAST_IN_DIM = ("broadcast_in_dim", Group.SHAPE, ("broadcast_dimensions",))
    RESHAPE = ("reshape", Group.SHAPE, ())
    TRANSPOSE = ("transpose", Group.SHAPE, ("permutation",))
    SLICE = ("slice", Group.SHAPE, ("start", "limit", "strides"))
    CONCATENATE = ("concatenate", Group.SHAPE, ("dimension",))
    PAD = ("pad", Group.SHAPE, ("low", "high", "interior"))  # (operand, scalar padding value)

    CONVERT = ("convert", Group.CONVERT, ())

    DOT_GENERAL = ("dot_general", Group.CONTRACT,
                   ("lhs_contract", "rhs_contract", "lhs_batch", "rhs_batch"))
    CONV = ("conv", Group.CONTRACT,
            ("window_strides", "padding", "lhs_dilation", "rhs_dilation",
             "feature_group_count"))  # operands NCHW-style: lhs [N,C,*S], rhs [O,I,*K]

    TAKE = ("take", Group.INDEX, ("axis",))               # operand[..., indices, ...] on axis

    SOFTMAX = ("softmax", Group.COMPOSITE, ("axes",))     # exp(x - max) / sum over axes
    # (x - mean) * rsqrt(mean((x - mean)^2) + eps) over axes (the gain and shift stay outside)
    LAYER_NORM = ("layer_norm", Group.COMPOSITE, ("axes", "eps"))
    # act(dot_general(lhs, rhs) * scale[N] + bias[N] + residual): a matmul with what its own
    # DPU can apply on the way out (issue 9). The dimension attributes are dot_general's (the
    # output's last axis is the rhs's one free axis, N); bias / scale / residual (bools) say
    # which operands follow lhs, rhs, in that order; act is "none" or an activation kind.
    # The order is the DPU's (BS/BN, then EW, then LUT).
    MATMUL_EPILOGUE = ("matmul_epilogue", Group.COMPOSITE,
                       ("lhs_contract", "rhs_contract", "lhs_batch", "rhs_batch", "bias",
                        "scale", "residual", "act"))

    def __init__(self, text: str, group: Group, attrs: tuple[str, ...]) -> None:
        self.text = text
        self.group = group
        self.attr_names = attrs

    # Members are singletons that compare by identity, so they may hash by identity (Enum's
    # __hash__ hashes the name in Python): every pass keys dicts and memos on the op.
    __hash__ = object.__hash__

    @staticmethod
    def from_text(text: str) -> "Op":
        try:
            return _BY_TEXT[text]
        except KeyError:
            raise KeyError(f"unknown IR op {text!r}") from None


_BY_TEXT = {op.text: op for op in Op}
