"""pykvcompact: a local inference engine for long-horizon agents.

GGUF models run through llama.cpp (the libllama of the pinned llama-cpp-python); the KV cache is
managed natively so that compaction is decided by a rubric probe, prepared in the background on a
forked sequence, and committed at the limit between two tokens.
"""

from __future__ import annotations

from .engine import LLAMA_CPP_PYTHON_VERSION, Engine, Job, Rebase, Sequence, physical_cores
from .errors import (CancelledError, ContextFullError, EngineClosedError, EngineError, InvalidModelError,
                     ModelNotFoundError, PyKVCompactError, SequenceBusyError, SequenceClosedError,
                     SlotsExhaustedError, UnsupportedOperationError, InvalidStateError, StateMismatchError,
                     RebaseSupersededError, RebaseNotPendingError)
from .models.registry import list_models, resolve_model
from .remote import RemoteEngine, RemoteError

from .engine.versions import VERSION as __version__  # noqa: F401 (re-exported)

__all__ = [
    "Engine", "Sequence", "Job", "Rebase", "physical_cores", "resolve_model", "list_models",
    "PyKVCompactError", "EngineError", "EngineClosedError", "ContextFullError", "SlotsExhaustedError", "SequenceClosedError",
    "SequenceBusyError", "UnsupportedOperationError", "CancelledError", "ModelNotFoundError", "InvalidModelError",
    "InvalidStateError", "StateMismatchError", "RebaseSupersededError", "RebaseNotPendingError",
    "LLAMA_CPP_PYTHON_VERSION", "RemoteEngine", "RemoteError",
]

# The policy layer (sessions, compaction): a failure to import it is a real error, never hidden.
from . import events  # noqa: E402,F401
from .compaction.policy import Policy  # noqa: E402,F401
from .session.session import Session  # noqa: E402,F401
from .session.turn import CHUNK_DONE  # noqa: E402,F401

__all__ += ["Session", "Policy", "events", "CHUNK_DONE"]
