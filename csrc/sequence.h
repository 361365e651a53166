// One live KV sequence as the engine thread sees it. Invariant: the sequence's cells in the KV cache
// hold exactly `tokens`, at positions 0..tokens.size()-1, one cell id per token in `cells`.
#pragma once

#include <cstdint>
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
    std::vector<float> logits;    // next-token logits after the last token, when logits_valid
    bool logits_valid = false;
    Task * busy = nullptr;        // the task currently extending this sequence, if any
    bool internal = false;        // a rebase shadow: not visible to Python

    size_t size() const { return tokens.size(); }
};

}  // namespace pkc
