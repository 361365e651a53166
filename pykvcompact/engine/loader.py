"""Loads the native engine after llama_cpp, so that one libllama is mapped in the process.

glibc reuses an already loaded library by SONAME: importing ``llama_cpp`` first maps its
``libllama.so.0``; our module's NEEDED entry then resolves to that same copy.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

from .versions import LLAMA_CPP_PYTHON_VERSION


@functools.lru_cache(maxsize=None)
def native():
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ImportError(
            f"pykvcompact needs llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}: "
            f"pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
        ) from exc
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        raise ImportError(
            f"pykvcompact was built against llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} but "
            f"{llama_cpp.__version__} is installed; reinstall it: "
            f"pip install --force-reinstall llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} && pip install --force-reinstall ."
        )
    alternative = os.environ.get("PYKVCOMPACT_NATIVE_MODULE")
    if alternative:  # another build of the same module, e.g. the sanitizer build of .ci/sanitize
        return _load_from(alternative)
    try:
        import pykvcompact._native as _native   # the compiled module itself (it imports nothing of ours)
    except ImportError as exc:
        raise ImportError(
            "pykvcompact's native module is not built or cannot load libllama; install the package with "
            "'pip install .' from the repository root (it compiles csrc/ against llama-cpp-python)"
        ) from exc
    return _native


def _load_from(path: str):
    if not os.path.isfile(path):
        raise ImportError(f"PYKVCOMPACT_NATIVE_MODULE={path!r} is not a file; unset it to use the installed module")
    spec = importlib.util.spec_from_file_location("pykvcompact._native", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pykvcompact._native"] = module
    spec.loader.exec_module(module)
    return module
