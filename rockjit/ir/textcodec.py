"""Spelling of attribute values in the IR text form, shared by the printer and the parser.

Inline arrays are written ``dense<f32[2]: [0.5, -inf]>`` (row-major decimal) when they are
small and the decimal form reads back bit-exactly, else ``dense<f32[4,8]: base64 "...">``
(the little-endian bytes), so every dtype, NaN payload and negative zero round-trips.
"""
from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np

from .types import DType, TensorType

DECIMAL_MAX_ELEMENTS = 16
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def quote(s: str) -> str:
    # ensure_ascii keeps the text 7-bit; json escapes are what the parser decodes.
    return json.dumps(s, ensure_ascii=True)


def unquote(token: str) -> str:
    return json.loads(token)


def name_or_quoted(s: str) -> str:
    return s if _NAME_RE.match(s) else quote(s)


def _item_text(x: Any, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "true" if x else "false"
    if dtype.is_int:
        return str(int(x))
    if dtype is DType.BF16:
        short = str(x)  # ml_dtypes' spelling is short but not always exact; check it
        if short.lstrip("+-").isdigit():
            short += ".0"  # keep floats visibly floats
        if np.float32(float(short)).astype(x.dtype).tobytes() == x.tobytes():
            return short
        x = np.float32(x)  # bf16 is a subset of f32, so f32's shortest spelling is exact
    return str(x)  # numpy prints the shortest string that reads back to the same value


def decode_items(t: TensorType, items: list[str]) -> np.ndarray:
    """Decimal items (row-major) -> array of type ``t``.  Raises ValueError on bad items."""
    if len(items) != t.size:
        raise ValueError(f"{t} needs {t.size} element(s), got {len(items)}")
    dt = t.dtype.to_numpy()
    if t.dtype is DType.BOOL:
        bad = [s for s in items if s not in ("true", "false")]
        if bad:
            raise ValueError(f"bool elements must be true or false, got {bad[0]!r}")
        return np.array([s == "true" for s in items], dtype=dt).reshape(t.shape)
    if t.dtype.is_int:
        vals = [int(s) for s in items]  # ValueError on '1.5' etc.
        info = np.iinfo(dt)
        for v in vals:
            if not info.min <= v <= info.max:
                raise ValueError(f"{v} does not fit in {t.dtype.value}")
        return np.array(vals, dtype=dt).reshape(t.shape)
    floats = np.array([float(s) for s in items], dtype=np.float64)
    if t.dtype is DType.BF16:
        floats = floats.astype(np.float32)
    return floats.astype(dt).reshape(t.shape)


def decode_base64(t: TensorType, text: str) -> np.ndarray:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    dt = t.dtype.to_numpy()
    if len(raw) != t.size * dt.itemsize:
        raise ValueError(f"{t} needs {t.size * dt.itemsize} bytes, base64 holds {len(raw)}")
    return np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt).reshape(t.shape)


def encode_array(a: np.ndarray) -> str:
    t = TensorType.of(a)
    if a.size <= DECIMAL_MAX_ELEMENTS:
        items = [_item_text(x, t.dtype) for x in a.reshape(-1)]
        try:
            ok = decode_items(t, items).tobytes() == np.ascontiguousarray(a).tobytes()
        except ValueError:
            ok = False
        if ok:
            return f"dense<{t}: [{', '.join(items)}]>"
    raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
    return f'dense<{t}: base64 "{base64.b64encode(raw).decode("ascii")}">'


def encode_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(encode_value(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return encode_array(v)
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no IR spelling; "
                    "use int, float, str, bool, lists of those, or a numpy array")
