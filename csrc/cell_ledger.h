// The CellLedger mirrors llama.cpp's unified KV cache at the level that matters to us: which cells
// exist and how many sequences hold each one. A token decoded on a sequence occupies one new cell; a
// fork (seq_cp) makes the target hold the same cells; removing a token from a sequence drops its hold;
// a cell is free when nobody holds it. This lets the engine refuse work that cannot fit *before* it
// reaches llama_decode, and tell whether shifting positions would move cells another sequence uses.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pkc {

using CellId = uint64_t;

class CellLedger {
public:
    CellId create() { CellId id = next_++; refs_[id] = 1; return id; }
    void hold(CellId id) { refs_[id] += 1; }
    void release(CellId id) {
        auto it = refs_.find(id);
        if (it != refs_.end() && --it->second == 0) refs_.erase(it);
    }
    void hold_all(const std::vector<CellId> & ids) { for (CellId c : ids) hold(c); }
    void release_range(const std::vector<CellId> & ids, size_t from, size_t to) {
        for (size_t i = from; i < to && i < ids.size(); ++i) release(ids[i]);
    }
    int holders(CellId id) const { auto it = refs_.find(id); return it == refs_.end() ? 0 : it->second; }
    size_t used() const { return refs_.size(); }

private:
    CellId next_ = 1;
    std::unordered_map<CellId, int> refs_;
};

}  // namespace pkc
