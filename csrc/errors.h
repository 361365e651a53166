// Exception types the engine throws; module.cpp maps each to a Python exception class.
#pragma once
#include <stdexcept>
#include <string>

namespace pkc {

struct EngineError : std::runtime_error { using std::runtime_error::runtime_error; };
// The KV cell pool (n_ctx, shared by every sequence) cannot hold the requested tokens.
struct ContextFullError : EngineError { using EngineError::EngineError; };
// Every sequence slot (n_seq_max) is taken.
struct SlotsExhaustedError : EngineError { using EngineError::EngineError; };
struct SequenceClosedError : EngineError { using EngineError::EngineError; };
// The engine was closed: every call after Engine.close() raises this.
struct EngineClosedError : EngineError { using EngineError::EngineError; };
// The loaded model cannot do this (e.g. shifting positions on an M-RoPE or recurrent model).
struct UnsupportedOperationError : EngineError { using EngineError::EngineError; };
// The sequence already has a running job (generation or prefill) on it.
struct SequenceBusyError : EngineError { using EngineError::EngineError; };
struct CancelledError : EngineError { using EngineError::EngineError; };
// A prepared rebase can no longer be committed: another rebase of its sequence was committed first
// (superseded), or it was committed, cancelled or failed already (not pending).
struct RebaseSupersededError : EngineError { using EngineError::EngineError; };
struct RebaseNotPendingError : EngineError { using EngineError::EngineError; };

}  // namespace pkc
