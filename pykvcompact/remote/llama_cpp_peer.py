"""llama-cpp-python models started with the same ggml settings as our ``Engine``.

On CPUs that advertise AMX, ggml's extra buffer types (AMX weight repacking) crash quantized models on
their first decode (SIGSEGV/SIGILL), so ``Engine`` turns them off by default (``use_extra_bufts=False``).
``llama_cpp.Llama`` has no argument for that setting: it builds its model parameters from
``llama_cpp.llama_cpp.llama_model_default_params()`` inside its constructor.  Every llama-cpp-python
model we start — a peer in a benchmark, the server a test or a user drives through ``RemoteEngine`` —
goes through this module, which patches that function, so that the comparison is like for like and
nothing crashes on such a CPU.

    python -m pykvcompact.remote.llama_cpp_peer --model MODEL.gguf --port 8000 --n_ctx 4096

starts llama-cpp-python's OpenAI-compatible server (same arguments as ``python -m llama_cpp.server``)
with extra buffer types off; ``PYKVCOMPACT_EXTRA_BUFTS=1`` leaves them on (machines where they work).
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, List, Optional

ENV_EXTRA_BUFTS = "PYKVCOMPACT_EXTRA_BUFTS"


def extra_bufts_requested() -> bool:
    """``PYKVCOMPACT_EXTRA_BUFTS=1`` (or true/yes/on) asks for ggml's extra buffer types."""
    return os.environ.get(ENV_EXTRA_BUFTS, "").strip().lower() in ("1", "true", "yes", "on")


def setting_line(use_extra_bufts: bool) -> str:
    """What a benchmark prints about the peer's setting (like for like with ``Engine``)."""
    state = "on" if use_extra_bufts else "off"
    return (f"llama-cpp-python peer: ggml extra buffer types (AMX repacking) {state}, as in our Engine "
            f"(use_extra_bufts={use_extra_bufts})")


@contextlib.contextmanager
def default_params(use_extra_bufts: bool = False) -> Iterator[None]:
    """Within the block, llama-cpp-python's default model parameters carry ``use_extra_bufts``."""
    import llama_cpp

    mod = llama_cpp.llama_cpp
    original = mod.llama_model_default_params

    def patched():  # type: ignore[no-untyped-def]
        params = original()
        params.use_extra_bufts = bool(use_extra_bufts)
        return params

    mod.llama_model_default_params = patched
    try:
        yield
    finally:
        mod.llama_model_default_params = original


def load_llama(model_path: Any, *, use_extra_bufts: bool = False, **kwargs: Any):
    """``llama_cpp.Llama(model_path, **kwargs)`` with ggml's extra buffer types as asked (off by default)."""
    import llama_cpp

    with default_params(use_extra_bufts):
        llm = llama_cpp.Llama(model_path=os.fspath(model_path), **kwargs)
    if bool(llm.model_params.use_extra_bufts) != bool(use_extra_bufts):
        raise RuntimeError("llama-cpp-python ignored use_extra_bufts: its Llama no longer builds its model "
                           "parameters from llama_model_default_params(); update pykvcompact.remote.llama_cpp_peer")
    return llm


def server_command(argv: List[str], python: Optional[str] = None) -> List[str]:
    """The command that starts llama-cpp-python's server with ``argv`` through this launcher."""
    return [python or sys.executable, "-m", "pykvcompact.remote.llama_cpp_peer", *argv]


def serve(argv: Optional[List[str]] = None) -> None:
    """Run llama-cpp-python's server (``python -m llama_cpp.server`` arguments) with the patch in force for
    the whole process (the server loads its models after parsing its arguments)."""
    try:
        from llama_cpp.server.__main__ import main as server_main
    except ImportError as e:
        raise SystemExit(f"llama-cpp-python's server is not installed ({e}): pip install 'llama-cpp-python[server]'"
                         " or pip install '.[test]'") from None
    use = extra_bufts_requested()
    print(setting_line(use) + (f" ({ENV_EXTRA_BUFTS}=1)" if use else f" (set {ENV_EXTRA_BUFTS}=1 to turn them on)"),
          file=sys.stderr, flush=True)
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    with default_params(use), _reporting_loads():
        server_main()


@contextlib.contextmanager
def _reporting_loads() -> Iterator[None]:
    """Each model the server loads says the setting it got (``LOADED_LINE``): what a test or a user checks in
    the server's log, on any CPU (only some crash without it)."""
    import llama_cpp

    original = llama_cpp.Llama.__init__

    def init(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        print(LOADED_LINE.format(path=getattr(self, "model_path", "?"), value=bool(self.model_params.use_extra_bufts)),
              file=sys.stderr, flush=True)

    llama_cpp.Llama.__init__ = init
    try:
        yield
    finally:
        llama_cpp.Llama.__init__ = original


LOADED_LINE = "pykvcompact.remote.llama_cpp_peer: loaded {path} with use_extra_bufts={value}"


if __name__ == "__main__":
    serve()
