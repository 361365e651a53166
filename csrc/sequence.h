// One live KV sequence as the engine thread sees it.
//
// Invariant: the first cells.size() tokens have KV cells in llama.cpp's cache at positions
// 0..cells.size()-1. Normally cells.size() == tokens.size(); the last token may be *unevaluated*
// (no cell yet) after a re-decode failed: the next task on the sequence evaluates it first.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cell_ledger.h"
#include "llama.h"

namespace pkc {

struct Task;

struct SeqState {
    uint64_t handle = 0;          // stable id the Python Sequence holds; survives a rebase
    llama_seq_id sid = -1;        // llama.cpp sequence id (slot); changes at an exact rebase
    std::vector<llama_token> tokens;
    std::vector<CellId> cells;
    // Next-token logits after the last token, when logits_valid: either still in llama.cpp's output
    // buffer (row `logits_row` of the latest decode) or copied into `logits` before the next decode.
    std::vector<float> logits;
    bool logits_valid = false;
    int logits_row = -1;
    // Tasks on this sequence, in order: the front one runs, the others wait for it (FIFO).
    std::deque<Task *> queue;
    uint64_t epoch = 0;           // rebases committed on this sequence (a preparation older than it is stale)
    bool internal = false;        // a rebase shadow or a probe fork: not visible to Python
    // A splice moved some of this sequence's cells (llama_memory_seq_add): llama.cpp rotates their K
    // at the next llama_decode, so until then the cache holds un-rotated K for them. Cleared by the
    // next successful decode (of any batch: the update runs over the whole cache).
    bool shift_pending = false;
    // Cells from this position on were computed after other tokens than the ones they now follow (a splice
    // moved them, or they attend to such cells): approximate, so a rebase never takes them as already in
    // place (Engine::prepare_rebase); the cells before it are exact. kAllExact: all are. Forks and shadows
    // inherit it where they share the cells; a truncate at or below it makes the rest exact again.
    static constexpr size_t kAllExact = (size_t) -1;
    size_t exact_upto = kAllExact;
    bool spliced() const { return exact_upto != kAllExact; }
    // A decode failed after llama.cpp had advanced this sequence's recurrent state, which cannot be rolled
    // back in part: its memory was cleared whole and every later task on it fails (re-applying the batch
    // to the advanced state would corrupt it silently). Its tokens stay readable.
    bool state_lost = false;

    size_t size() const { return tokens.size(); }
    size_t evaluated() const { return cells.size(); }
    bool fully_evaluated() const { return cells.size() == tokens.size(); }
    bool busy() const { return !queue.empty(); }
    Task * active() const { return queue.empty() ? nullptr : queue.front(); }
};

}  // namespace pkc
