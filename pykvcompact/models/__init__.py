"""The model registry (GGUF models shipped as PyPI packages), the probe's calibration per model, and the
progress bars of joining and hashing model files."""
