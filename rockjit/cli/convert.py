"""``rockjit convert ctranslate2 SRC [SRC ...] -o model.safetensors [--dtype float32]``

Reads a CTranslate2 model (a ``model.bin``, a directory holding one, or the parts of a split
``model.bin.part1 model.bin.part2 ...`` in order) and writes its tensors under transformers'
names as safetensors, with the HF config kwargs in the file's metadata (``hf_config``):

    rockjit convert ctranslate2 faster-whisper-base/ -o whisper_base.safetensors

Supported specs: WhisperSpec (-> WhisperForConditionalGeneration).  A truncated or corrupt
file is refused with its path and the byte offset of the problem.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from pathlib import Path

from .common import EXIT_COMPILE_ERROR, EXIT_OK, UsageError, add_verb

_DESCRIPTION = ("Read a CTranslate2 model (model.bin, a directory holding it, or the parts of a "
                "split model.bin.part1 model.bin.part2 ... in order) and write its tensors "
                "under transformers' names as safetensors; the HF config kwargs go in the "
                "file's metadata ('hf_config'). Supported: WhisperSpec -> "
                "WhisperForConditionalGeneration.")


def _run(args: argparse.Namespace) -> int:
    from ..convert import ModelFileError, convert_ctranslate2

    for src in args.src:
        if not Path(src).exists():
            raise UsageError(f"no such file or directory: {src}")
    try:
        path, config = convert_ctranslate2(args.src, args.output, dtype=args.dtype)
    except ModelFileError as e:
        print(f"rockjit convert: {e}", file=sys.stderr)
        return EXIT_COMPILE_ERROR
    shape = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
    print(f"wrote {path} ({shape})")
    return EXIT_OK


def register(sub: Any) -> None:
    c = add_verb(sub, "convert", "convert a checkpoint from another format to safetensors "
                 "with HF tensor names")
    formats = c.add_subparsers(dest="format", required=True, metavar="FORMAT")
    ct2 = add_verb(formats, "ctranslate2", "a CTranslate2 model.bin (e.g. faster-whisper) "
                   "-> safetensors with transformers' names",
                   description=_DESCRIPTION)
    ct2.add_argument("src", nargs="+", help="model.bin, a directory holding model.bin (or "
                     "model.bin.part1..N), or the parts of a split model.bin in order")
    ct2.add_argument("-o", "--output", required=True, help="safetensors file to write "
                     "(written to a temp name, then renamed)")
    ct2.add_argument("--dtype", choices=("float16", "float32"),
                     help="cast floating tensors (default: keep the stored dtype)")
    ct2.set_defaults(run=_run)
