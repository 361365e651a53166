"""The model registry (GGUF models shipped as PyPI packages), the probe's calibration per model, and the
progress bars of joining and hashing model files.

``pykvcompact.models`` keeps the names the module of that name had (the registry's)."""

from .registry import DEFAULT_MODEL, REGISTRY, ModelSpec, get_spec, resolve_model, list_models, cache_dir

__all__ = ["DEFAULT_MODEL", "REGISTRY", "ModelSpec", "get_spec", "resolve_model", "list_models", "cache_dir"]
