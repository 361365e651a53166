"""The remote backend: the session's engine protocol over an OpenAI-compatible HTTP server with prefix
caching (vLLM, SGLang, llama-server, llama-cpp-python's server).  See :mod:`.engine`."""
from __future__ import annotations

from .engine import RemoteEngine
from .errors import (RemoteConnectionError, RemoteDisconnectedError, RemoteError, RemoteHTTPError,
                     RemoteProtocolError, RemoteTimeoutError)
from .jobs import RemoteJob, RemoteRebase
from .local_tokenizer import LocalTokenizer
from .sequence import RemoteSequence

__all__ = ["RemoteEngine", "RemoteSequence", "RemoteJob", "RemoteRebase", "LocalTokenizer", "RemoteError",
           "RemoteConnectionError", "RemoteDisconnectedError", "RemoteHTTPError", "RemoteTimeoutError", "RemoteProtocolError"]
