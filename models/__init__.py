"""The reference encoders as plain JAX functions over flat dicts of HF tensor names.

    siglip      SigLIP-B/16 vision tower (google/siglip-base-patch16-224), any square image size
    modernbert  ModernBERT-base encoder (answerdotai/ModernBERT-base) with padding masks
    whisper     Whisper encoder (openai/whisper-tiny, -base)

Each module has a frozen config dataclass with the published defaults, `expected_shapes(config)`,
`load_params(path, config)` (safetensors, every name and shape checked), `forward(params, ...)`
and `trace_spec(**overrides)` for `rockjit trace models.<name>:trace_spec [field=value ...]`.
Shared pieces: `layers` (norms, attention, GELU, RoPE), `weights` (the loader and its checks)
and `specs` (config overrides and shape-only weights for tracing).
"""
