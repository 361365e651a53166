"""The versions this build pins: the package's own and the llama-cpp-python its native module was
compiled against.

In the engine layer, the lowest, because a saved sequence state records both (``state.py``) and the loader
checks the second (``loader.py``); the package's face (``pykvcompact/__init__.py``) re-exports them.
"""

VERSION = "0.1.0"                      # pyproject.toml's [project] version: the two say the same
LLAMA_CPP_PYTHON_VERSION = "0.3.36"    # pyproject.toml's build and runtime requirement

__all__ = ["VERSION", "LLAMA_CPP_PYTHON_VERSION"]
