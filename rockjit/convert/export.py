"""Write a converted checkpoint as safetensors: a registry from CTranslate2 spec name to the
function that renames its variables to HF's, and an atomic write (temp file, then rename) so a
reader never sees half a file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from safetensors.numpy import save_file

from . import whisper
from .ctranslate2 import CT2Model, ModelFileError, read_model_bin

# spec name -> (HF-named tensors, HF config kwargs)
CONVERTERS: dict[str, tuple[Callable[[CT2Model], dict[str, np.ndarray]],
                            Callable[[CT2Model], dict]]] = {
    whisper.SPEC_NAME: (whisper.whisper_to_hf, whisper.whisper_config),
}
DTYPES = {"float16": np.float16, "float32": np.float32}


def write_safetensors_atomic(tensors: dict[str, np.ndarray], dst: str | os.PathLike,
                             metadata: dict[str, str] | None = None) -> Path:
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dst


def convert_ctranslate2(src: str | os.PathLike | Sequence[str | os.PathLike],
                        dst: str | os.PathLike, dtype: str | None = None) -> tuple[Path, dict]:
    """Read a CTranslate2 model, rename its tensors to HF's, write them to ``dst``.

    dtype: 'float16' / 'float32' casts the floating tensors; None keeps the stored dtype.
    Returns the path written and the HF config kwargs (also stored in the file's metadata
    under 'hf_config')."""
    model = read_model_bin(src)
    if model.spec not in CONVERTERS:
        raise ModelFileError(f"{model.source}: no converter for spec '{model.spec}' "
                             f"(known: {sorted(CONVERTERS)})")
    to_hf, config_of = CONVERTERS[model.spec]
    tensors = to_hf(model)
    config = config_of(model)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        tensors = {k: v.astype(DTYPES[dtype]) if np.issubdtype(v.dtype, np.floating) else v
                   for k, v in tensors.items()}
    metadata = {"format": "pt", "source": f"ctranslate2 {model.spec} rev {model.revision}",
                "hf_config": json.dumps(config, sort_keys=True)}
    return write_safetensors_atomic(tensors, dst, metadata), config
