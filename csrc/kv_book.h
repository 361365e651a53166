// KvBook: what the engine thread owns about the KV cache and the batch being built. Sequences and
// their task queues, sequence slots, the cell ledger, the llama_batch of the current step, the
// rollback points of that step, and the next-token logits of each sequence.
//
// Tasks see the engine through this narrower interface. Every method asserts that it runs on the
// engine thread: a llama_context is not thread-safe (docs/architecture.md, "Threading model").
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "cell_ledger.h"
#include "errors.h"
#include "llama.h"
#include "sequence.h"

#include <string>

namespace pkc {

// Why a task on a sequence whose state was lost (SeqState::state_lost) fails.
inline std::string lost_state_msg(uint64_t h) {
    return "the state of sequence " + std::to_string(h) + " was lost: a decode failed after llama.cpp had "
           "advanced its recurrent state, which cannot be rolled back, so its memory was cleared; close it "
           "and append its tokens (Sequence.tokens) to a new sequence";
}


enum class RowKind : int { Foreground = 0, Background = 1, Probe = 2 };
constexpr int kRowKinds = 3;

struct EngineCounters {
    long decode_calls = 0, failed_decodes = 0, mixed_batches = 0;
    long aborted_decodes = 0;  // background-only decodes cut short for foreground work
    double aborted_ms = 0;     // the time they had run
    long rows[kRowKinds] = {0, 0, 0};
    double decode_ms = 0;
    long rebases = 0, catch_up_rows = 0, forks = 0;
    long rebase_reused_rows = 0;  // replacement tokens equal to the ones they replaced: shared, not fed
};

class KvBook {
public:
    // can_redecode: the memory can remove a sequence's last token (not recurrent or hybrid).
    KvBook(llama_context * ctx, const llama_vocab * vocab, uint32_t n_ctx, uint32_t n_seq_max, uint32_t n_batch,
           bool can_redecode);
    ~KvBook();
    KvBook(const KvBook &) = delete;
    KvBook & operator=(const KvBook &) = delete;
    void bind_thread(std::thread::id id) { owner_ = id; }

    // ---- model facts
    int n_vocab() const { return n_vocab_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_batch() const { return n_batch_; }
    const llama_vocab * vocab() const { return vocab_; }
    llama_memory_t memory() const { return mem_; }
    EngineCounters & counters() { return counters_; }
    // A K shift (splice) waits for the next decode, which applies it in place first.
    bool shift_pending() const {
        for (auto & [h, s] : seqs_) if (s.shift_pending) return true;
        return false;
    }

    // ---- sequences
    SeqState * find(uint64_t h);
    SeqState & get(uint64_t h);
    SeqState & usable(uint64_t h);   // get(), refusing a sequence whose state was lost (SeqState::state_lost)  // a visible sequence, or SequenceClosedError
    SeqState & create(bool internal);
    // A new sequence holding src's first n tokens (all when n >= len): their cells are shared.
    SeqState & fork(uint64_t src, bool internal, size_t n = SIZE_MAX);
    void release(SeqState & s);  // frees its cells (those no fork shares) and its slot
    std::map<uint64_t, SeqState> & sequences() { return seqs_; }
    // Exact rebase: `main` takes over `shadow`'s slot, tokens and cells; the shadow disappears.
    void take_over(SeqState & main, uint64_t shadow);

    // ---- cells
    size_t free_cells() const { return n_ctx_ - ledger_.used(); }
    // Cells promised to foreground appends and replies still running: background work never takes them, so an
    // append accepted when submitted cannot run out of cells half-way (a partial prompt), nor a reply end early.
    void reserve(size_t n) { reserved_ += n; }
    void unreserve(size_t n) { reserved_ -= std::min(reserved_, n); }
    size_t reserved_cells() const { return reserved_; }
    // Free cells a task may take, less those promised to others (`own`: those promised to it).
    size_t free_for(size_t own) const {
        const size_t others = reserved_ - std::min(reserved_, own), f = free_cells();
        return f > others ? f - others : 0;
    }
    size_t used_cells() const { return ledger_.used(); }
    int holders(CellId c) const { return ledger_.holders(c); }
    void hold(CellId c) { ledger_.hold(c); }
    void release_cells(const std::vector<CellId> & cells, size_t from, size_t to) { ledger_.release_range(cells, from, to); }
    // Keeps the first n tokens (tokens and KV). Throws UnsupportedOperationError where llama.cpp
    // cannot remove a tail (recurrent and hybrid memories).
    void drop_tail(SeqState & s, size_t n);
    // Removes the last token's KV but keeps the token: it will be decoded again, with logits.
    void unevaluate_last(SeqState & s);
    // The sequence's first n tokens got their KV from outside a batch (a restored state): one new
    // ledger cell each. The sequence must have no cells yet.
    void adopt_cells(SeqState & s, size_t n);

    // ---- task queues (front = the running task)
    // Background tasks queue behind background tasks; anything else on a busy sequence raises.
    void enqueue(SeqState & s, Task & t, bool queue_allowed);
    void dequeue(Task & t, uint64_t h);

    // ---- the batch of the current step
    void begin_batch();
    int add_row(SeqState & s, llama_token t, bool want_logits, RowKind kind);
    // Decodes the unevaluated last token (see sequence.h); returns its row.
    int add_pending_row(SeqState & s, bool want_logits, RowKind kind);
    int rows() const { return batch_.n_tokens; }
    bool has_kind(RowKind k) const;
    int count_kind(RowKind k) const;
    int decode();      // llama_decode of the batch (0 on success)
    void rollback();   // undo every row of the batch: tokens, cells, KV
    // Tests: the next `count` decodes of at least `min_rows` rows return rc without decoding.
    // `after`: the batch is decoded for real first (the memory advanced), then the step reports `rc`.
    void inject_failures(int count, int rc, int min_rows, bool after) {
        inject_count_ = count; inject_rc_ = rc; inject_min_rows_ = min_rows; inject_after_ = after;
    }
    // The first sequence `t` holds whose state was lost (SeqState::state_lost); null when none.
    const SeqState * lost_claim(const Task & t);

    // ---- logits
    const float * row_logits(int row) const;        // a row of the latest decode
    void set_logits_row(SeqState & s, int row);   // the sequence's next-token logits are that row
    const float * logits(SeqState & s) const;      // nullptr when not valid
    std::vector<float> logits_copy(SeqState & s) const;

private:
    void assert_thread() const;
    llama_seq_id alloc_slot();
    void touch(SeqState & s);

    llama_context * ctx_;
    llama_memory_t mem_;
    const llama_vocab * vocab_;
    int n_vocab_;
    uint32_t n_ctx_, n_batch_;
    std::thread::id owner_;
    std::map<uint64_t, SeqState> seqs_;
    std::vector<bool> slot_used_;
    uint64_t next_handle_ = 1;
    CellLedger ledger_;
    llama_batch batch_{};
    std::vector<RowKind> row_kind_;
    // Per sequence touched by this batch, its state before the batch, next-token logits included: a
    // rollback restores them (else a step whose first try always fails would only ever re-decode them:
    // a livelock; recurrent and hybrid memories could not re-decode them at all).
    struct RollbackPoint {
        size_t tokens, cells;
        std::vector<float> logits;
        bool had_logits = false;
    };
    std::map<uint64_t, RollbackPoint> rollback_;
    bool can_redecode_;
    int inject_count_ = 0, inject_rc_ = 0, inject_min_rows_ = 1;
    bool inject_after_ = false;
    size_t lost_sequences_ = 0;   // sequences ever marked state_lost (lost_claim looks only when some were)
    size_t reserved_ = 0;   // cells promised to running foreground appends and replies (reserve)
    EngineCounters counters_;
};

// The cells promised to one foreground append or reply (KvBook::reserve): those its rows take are released
// from the promise once decoded (settle), the rest when the task ends (drop).
struct CellPromise {
    size_t cells = 0;   // still promised
    size_t step = 0;    // cells this step's rows take
    void make(KvBook & kv, size_t n) { cells = n; kv.reserve(n); }
    size_t free_in(const KvBook & kv) const { return kv.free_for(cells); }   // free cells this task may take
    void settle(KvBook & kv) {
        const size_t used = std::min(cells, step);
        kv.unreserve(used);
        cells -= used;
        step = 0;
    }
    void drop(KvBook & kv) { kv.unreserve(cells); cells = 0; step = 0; }
};

}  // namespace pkc
