"""Exceptions raised by pykvcompact.

Each class also derives from the closest builtin so callers that catch ``FileNotFoundError`` or
``ValueError`` keep working.
"""

from __future__ import annotations


class PyKVCompactError(Exception):
    """Base class of every error raised by pykvcompact."""


class ModelNotFoundError(PyKVCompactError, FileNotFoundError):
    """A model file or the package that carries it is missing. The message says what to install."""


class InvalidModelError(PyKVCompactError, ValueError):
    """A model file exists but is not usable (not GGUF, wrong size or sha256)."""


class EngineError(PyKVCompactError, RuntimeError):
    """The engine could not do what was asked; the message says why and what to do."""


class ContextFullError(EngineError):
    """The KV cell pool (n_ctx, shared by every sequence) cannot hold the tokens asked for."""


class SlotsExhaustedError(EngineError):
    """Every sequence slot (n_seq_max) is in use; close a sequence or raise n_seq_max."""


class SequenceClosedError(EngineError):
    """The sequence was closed (or its engine was)."""


class EngineClosedError(EngineError):
    """The engine was closed: every call after ``Engine.close()`` raises this."""


class SequenceBusyError(EngineError):
    """Another job (a generation or prefill) is running on this sequence, or a rebase of it is being
    committed; wait for it (``Job.result()``) or cancel it."""


class UnsupportedOperationError(EngineError):
    """The loaded model cannot do this operation (see ``Engine.capabilities``)."""


class CancelledError(EngineError):
    """The job was cancelled."""


class RebaseSupersededError(EngineError):
    """Another rebase of this sequence was committed first: this preparation is stale; prepare it again."""


class RebaseNotPendingError(EngineError):
    """This rebase was already committed, cancelled or failed: there is nothing to commit or measure."""


class InvalidStateError(PyKVCompactError, ValueError):
    """Saved state (a sequence state blob, a session snapshot or log) is corrupt, cut short or not ours."""


class StateMismatchError(PyKVCompactError, ValueError):
    """Saved KV state was made by another model, context size or library version: prefill the tokens
    again instead of loading it (the message names what differs). A sequence state's error also has
    ``differences`` (each in words) and ``tokens`` (the saved tokens, or None when unreadable)."""
