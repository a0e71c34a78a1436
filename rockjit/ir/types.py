"""Element types and tensor types of the rockjit IR."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class DType(enum.Enum):
    """Element types. The value is the spelling used in the IR text form."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U32 = "u32"
    U8 = "u8"
    BOOL = "bool"

    # Members are singletons that compare by identity, so they may hash by identity: Enum's
    # own __hash__ hashes the member's name in Python, paid by every dict keyed on a type.
    __hash__ = object.__hash__

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I64, DType.I32, DType.I16, DType.I8, DType.U32, DType.U8)

    def to_numpy(self) -> np.dtype:
        dt = _NUMPY_OF.get(self)     # asked per value by the lowering: made once per type
        if dt is None:
            if self is DType.BF16:
                import ml_dtypes  # shipped with jax

                dt = np.dtype(ml_dtypes.bfloat16)
            else:
                dt = np.dtype(_TO_NUMPY[self])
            _NUMPY_OF[self] = dt
        return dt

    @staticmethod
    def from_numpy(dt: np.dtype | type | str) -> "DType":
        dt = np.dtype(dt)
        hit = _FROM_NUMPY.get(dt)     # asked per node and per form: a dict, not the search
        if hit is not None:
            return hit
        if dt.name == "bfloat16":
            return DType.BF16
        for k, v in _TO_NUMPY.items():
            if np.dtype(v) == dt:
                _FROM_NUMPY[dt] = k
                return k
        raise TypeError(f"rockjit IR has no element type for numpy dtype {dt}")


_TO_NUMPY = {
    DType.F32: "float32", DType.F16: "float16", DType.I64: "int64", DType.I32: "int32",
    DType.I16: "int16", DType.I8: "int8", DType.U32: "uint32", DType.U8: "uint8",
    DType.BOOL: "bool",
}
_FROM_NUMPY: dict[np.dtype, DType] = {}     # DType.from_numpy's answers (equal dtypes hash equal)
_NUMPY_OF: dict[DType, np.dtype] = {}       # DType.to_numpy's answers


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        # Types key the shape-rule memo, CSE and every pass's maps, often inside Value and
        # Node keys: the hash of an immutable type is computed once.
        object.__setattr__(self, "_hash", hash((self.dtype, shape)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # a copy or unpickled type is built anew: its cached hash is this process's
        return (TensorType, (self.dtype, self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        # exact (np.prod costs ~us per call); asked per value by the lowering: once per type
        n = self.__dict__.get("_size")
        if n is None:
            n = math.prod(self.shape)
            object.__setattr__(self, "_size", n)
        return n

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        return TensorType(DType.from_numpy(array.dtype), tuple(array.shape))
