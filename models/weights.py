"""Loading HF safetensors checkpoints into flat dicts keyed by the HF tensor names.

A model module describes the tensors it needs as `expected_shapes(config) -> {name: shape}`;
this module reads exactly those tensors from a file and checks every name and shape before the
model ever runs, so a wrong checkpoint fails here with the name of the tensor at fault rather
than deep inside a traced matmul.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping

import numpy as np
from safetensors import safe_open

from rockjit.errors import WeightError

Shapes = Mapping[str, tuple[int, ...]]

# safetensors dtype tags of floating-point tensors; encoder weights are all floats, so an int8
# (a quantized checkpoint) or bool tensor under an expected name is the wrong file, not a cast.
FLOAT_TAGS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _closest(name: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def missing_message(key: str, shape: tuple[int, ...], where: str, unused: Iterable[str]) -> str:
    msg = f"{where}: missing tensor '{key}' (expected shape {tuple(shape)})"
    near = _closest(key, unused)
    if near is not None:
        msg += (f"; the closest name present is '{near}' - if that tensor is '{key}' under "
                f"another name, rename it in the checkpoint")
    else:
        msg += "; is this a checkpoint for this model and config?"
    return msg


def shape_message(key: str, expected: tuple[int, ...], got: tuple[int, ...], where: str) -> str:
    return (f"{where}: tensor '{key}' has shape {tuple(got)} but the config expects "
            f"{tuple(expected)}; check that the config (sizes, image size, layer count) "
            f"matches the checkpoint")


def check_params(params: Mapping[str, object], expected: Shapes, where: str = "params") -> None:
    """Raise WeightError unless `params` holds every expected key with the expected shape.

    Extra keys are allowed (a full checkpoint may carry heads this encoder does not use).
    """
    unused = [k for k in params if k not in expected]
    for key, shape in expected.items():
        if key not in params:
            raise WeightError(missing_message(key, shape, where, unused))
        got = tuple(np.shape(params[key]))
        if got != tuple(shape):
            raise WeightError(shape_message(key, tuple(shape), got, where))
        dt = getattr(params[key], "dtype", None)
        if dt is not None and not _is_float(np.dtype(dt)):
            raise WeightError(dtype_message(key, np.dtype(dt).name, where))


def dtype_message(key: str, got: str, where: str) -> str:
    return (f"{where}: tensor '{key}' is stored as {got}, but the model expects floating-point "
            f"weights (f32, f16 or bf16); a quantized (int8) or mask checkpoint must be "
            f"dequantized to floats before loading")


def _is_float(dt: np.dtype) -> bool:
    # ml_dtypes' bfloat16 / float8 types are not np.floating subclasses.
    return np.issubdtype(dt, np.floating) or dt.name.startswith(("bfloat", "float8"))


def detect_prefix(file_keys: Iterable[str], anchor: str) -> str:
    """The module path under which a checkpoint stores the encoder ('' for a bare encoder).

    Full-model checkpoints nest the encoder (e.g. 'vision_model.', 'model.', 'model.encoder.');
    we find it from one tensor name that only this encoder has. Ambiguity is an error, not a guess.
    """
    keys = set(file_keys)
    if anchor in keys:
        return ""
    found = sorted(k[: -len(anchor)] for k in keys
                   if k.endswith("." + anchor))
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise WeightError(f"tensor '{anchor}' appears under several prefixes {found}; "
                          f"pass prefix= to choose the encoder to load")
    return ""  # nothing matches: the per-key check below reports the missing tensors


def load_safetensors(path: str | os.PathLike, expected: Shapes, *, prefix: str | None = None,
                     dtype: np.dtype | type | None = np.float32) -> dict[str, np.ndarray]:
    """Read the `expected` tensors from a safetensors file, checking names and shapes.

    prefix: module path of the encoder inside the file; None detects it from the first expected
    name. dtype: floating tensors are converted to it (None keeps the stored dtype, e.g. bf16).
    The returned dict is keyed by the names without the prefix, i.e. exactly `expected`'s keys.
    """
    path = os.fspath(path)
    _check_path(path)
    where = f"weights file '{path}'"
    try:
        return _load(path, where, expected, prefix, dtype)
    except (WeightError, MemoryError):
        raise
    except Exception as e:  # safetensors' own errors carry no path and no advice
        raise WeightError(f"{where} ({_size(path)}) is not a readable safetensors file: "
                          f"{type(e).__name__}: {e}. It may be truncated, empty or another "
                          f"format (a PyTorch .bin/.pt); re-download it, or convert it with "
                          f"safetensors.numpy.save_file") from None


def _size(path: str) -> str:
    try:
        return f"{os.path.getsize(path)} bytes"
    except OSError:
        return "size unknown"


def _check_path(path: str) -> None:
    if os.path.isdir(path):
        inside = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))[:5]
        hint = (f"; it holds {', '.join(inside)}" if inside
                else "; it holds no .safetensors file")
        raise WeightError(f"weights path '{path}' is a directory, not a safetensors file; pass "
                          f"the .safetensors file itself{hint}")
    if not os.path.exists(path):
        raise WeightError(f"weights file '{path}' does not exist; check the path (relative "
                          f"paths start at {os.getcwd()})")
    if not os.path.isfile(path):
        raise WeightError(f"weights path '{path}' is not a regular file; pass a .safetensors file")
    if os.path.getsize(path) == 0:
        raise WeightError(f"weights file '{path}' is empty (0 bytes); the download or save "
                          f"was interrupted: fetch or write it again")


def _load(path: str, where: str, expected: Shapes, prefix: str | None,
          dtype: np.dtype | type | None) -> dict[str, np.ndarray]:
    params: dict[str, np.ndarray] = {}
    with safe_open(path, framework="numpy") as f:
        file_keys = list(f.keys())
        if prefix is None:
            prefix = detect_prefix(file_keys, next(iter(expected)))
        if prefix:
            where += f" (under prefix '{prefix}')"
        present = set(file_keys)
        wanted = {prefix + k for k in expected}
        unused = [k[len(prefix):] for k in file_keys
                  if k not in wanted and k.startswith(prefix)]
        # Check every name and shape before reading any data: a bad file fails fast.
        for key, shape in expected.items():
            full = prefix + key
            if full not in present:
                raise WeightError(missing_message(key, shape, where, unused))
            sl = f.get_slice(full)
            got = tuple(sl.get_shape())
            if got != tuple(shape):
                raise WeightError(shape_message(key, tuple(shape), got, where))
            tag = sl.get_dtype()
            if tag not in FLOAT_TAGS:
                raise WeightError(dtype_message(key, tag, where))
        for key in expected:
            arr = f.get_tensor(prefix + key)
            if dtype is not None and _is_float(arr.dtype):
                arr = arr.astype(dtype)
            params[key] = arr
    return params


def seeded_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator,
                  dtype: np.dtype | type = np.float32) -> np.ndarray:
    """One tensor of the repo's default (seeded) model, at a trained checkpoint's scale so that
    activations keep unit size layer after layer: norm scales (HF names ending in
    ``norm.weight``) 1 + N(0, 0.05^2), every other tensor N(0, 1/fan_in) with fan_in the
    product of all but the first dimension (a vector's own length)."""
    shape = tuple(shape)
    if name.endswith("norm.weight"):
        return (1.0 + 0.05 * rng.standard_normal(shape)).astype(dtype)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(shape[0] if shape else 1, 1)
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)


def seeded_weights(shapes: Shapes, seed: int = 0) -> dict[str, np.ndarray]:
    """``seeded_tensor`` for every name of ``shapes`` (in its order), from one generator."""
    rng = np.random.default_rng(seed)
    return {key: seeded_tensor(key, shape, rng) for key, shape in shapes.items()}
