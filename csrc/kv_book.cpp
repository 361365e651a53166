#include "kv_book.h"
#include "tasks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pkc {

KvBook::KvBook(llama_context * ctx, const llama_vocab * vocab, uint32_t n_ctx, uint32_t n_seq_max, uint32_t n_batch,
               bool can_redecode)
    : ctx_(ctx), mem_(llama_get_memory(ctx)), vocab_(vocab), n_vocab_(llama_vocab_n_tokens(vocab)), n_ctx_(n_ctx),
      n_batch_(n_batch), slot_used_(n_seq_max, false), row_kind_(n_batch), can_redecode_(can_redecode) {
    batch_ = llama_batch_init((int32_t) n_batch, 0, 1);
}

KvBook::~KvBook() {
    if (batch_.token) llama_batch_free(batch_);
}

void KvBook::assert_thread() const {
    if (std::this_thread::get_id() != owner_) throw std::logic_error("KvBook used outside the engine thread");
}

// ---------------------------------------------------------------- sequences

SeqState * KvBook::find(uint64_t h) {
    auto it = seqs_.find(h);
    return it == seqs_.end() ? nullptr : &it->second;
}

SeqState & KvBook::get(uint64_t h) {
    assert_thread();
    SeqState * s = find(h);
    if (!s || s->internal) throw SequenceClosedError("sequence " + std::to_string(h) + " is closed (or never existed)");
    return *s;
}

SeqState & KvBook::usable(uint64_t h) {
    SeqState & s = get(h);
    if (s.state_lost) throw EngineError(lost_state_msg(h));
    return s;
}

llama_seq_id KvBook::alloc_slot() {
    for (size_t i = 0; i < slot_used_.size(); ++i) {
        if (!slot_used_[i]) { slot_used_[i] = true; return (llama_seq_id) i; }
    }
    throw SlotsExhaustedError("all " + std::to_string(slot_used_.size()) +
                              " sequence slots are in use (probes, forks and rebase preparations each take one "
                              "while they live); close a sequence or create the Engine with a larger n_seq_max");
}

SeqState & KvBook::create(bool internal) {
    assert_thread();
    const llama_seq_id sid = alloc_slot();
    const uint64_t h = next_handle_++;
    SeqState & s = seqs_[h];
    s.handle = h;
    s.sid = sid;
    s.internal = internal;
    llama_memory_seq_rm(mem_, sid, -1, -1);  // a freed slot is empty; make it certain
    return s;
}

SeqState & KvBook::fork(uint64_t src_h, bool internal, size_t n) {
    assert_thread();
    SeqState & dst = create(internal);
    SeqState & src = seqs_.at(src_h);  // std::map: references survive the insertion above
    // Tokens past the evaluated ones (a last token whose decode failed) are copied as pending too.
    const size_t n_tok = std::min(n, src.size());
    const size_t n_cells = std::min(n_tok, src.evaluated());
    if (n_cells > 0) llama_memory_seq_cp(mem_, src.sid, dst.sid, 0, (llama_pos) n_cells);
    dst.tokens.assign(src.tokens.begin(), src.tokens.begin() + (long) n_tok);
    dst.cells.assign(src.cells.begin(), src.cells.begin() + (long) n_cells);
    for (CellId c : dst.cells) ledger_.hold(c);
    dst.shift_pending = n_cells > 0 && src.shift_pending;  // it may share the moved cells
    dst.exact_upto = src.exact_upto < n_cells ? src.exact_upto : SeqState::kAllExact;  // (new cells: after exact ones)
    if (n_tok == src.size() && src.logits_valid) {
        dst.logits = logits_copy(src);
        dst.logits_valid = true;
    }
    return dst;
}

void KvBook::release(SeqState & s) {
    assert_thread();
    llama_memory_seq_rm(mem_, s.sid, -1, -1);
    ledger_.release_range(s.cells, 0, s.cells.size());
    if (s.sid >= 0 && (size_t) s.sid < slot_used_.size()) slot_used_[(size_t) s.sid] = false;
    rollback_.erase(s.handle);
    seqs_.erase(s.handle);
}

void KvBook::take_over(SeqState & m, uint64_t shadow_h) {
    assert_thread();
    SeqState & sh = seqs_.at(shadow_h);
    llama_memory_seq_rm(mem_, m.sid, -1, -1);
    ledger_.release_range(m.cells, 0, m.cells.size());
    slot_used_[(size_t) m.sid] = false;
    m.sid = sh.sid;
    m.tokens = std::move(sh.tokens);
    m.cells = std::move(sh.cells);
    m.logits = std::move(sh.logits);
    m.logits_valid = sh.logits_valid;
    m.logits_row = sh.logits_row;
    m.shift_pending = sh.shift_pending;
    m.exact_upto = sh.exact_upto;
    rollback_.erase(shadow_h);
    seqs_.erase(shadow_h);
}

// ---------------------------------------------------------------- cells

void KvBook::drop_tail(SeqState & s, size_t n) {
    assert_thread();
    if (n >= s.size()) return;
    if (n < s.evaluated() && !llama_memory_seq_rm(mem_, s.sid, (llama_pos) n, -1)) {
        throw UnsupportedOperationError("this model's memory cannot remove the tail of a sequence (recurrent or hybrid "
                                        "model); use fork + probe, or an exact rebase, instead of truncate");
    }
    if (n < s.evaluated()) {
        ledger_.release_range(s.cells, n, s.cells.size());
        s.cells.resize(n);
    }
    s.tokens.resize(n);
    if (n <= s.exact_upto) s.exact_upto = SeqState::kAllExact;   // what is left was computed in place
    s.logits_valid = false;
    s.logits_row = -1;
}

void KvBook::unevaluate_last(SeqState & s) {
    assert_thread();
    if (s.size() == 0 || !s.fully_evaluated()) return;
    touch(s);
    const size_t last = s.size() - 1;
    if (!llama_memory_seq_rm(mem_, s.sid, (llama_pos) last, -1)) {
        throw UnsupportedOperationError("this model's memory cannot re-decode the last token of a sequence (recurrent or "
                                        "hybrid model); its logits are only available right after it is decoded");
    }
    ledger_.release(s.cells.back());
    s.cells.pop_back();
    auto & rb = rollback_[s.handle];
    rb.cells = std::min(rb.cells, s.cells.size());
    s.logits_valid = false;
    s.logits_row = -1;
}

void KvBook::adopt_cells(SeqState & s, size_t n) {
    assert_thread();
    if (!s.cells.empty() || n > s.size()) throw std::logic_error("adopt_cells on a sequence that has cells");
    for (size_t i = 0; i < n; ++i) s.cells.push_back(ledger_.create());
}

// ---------------------------------------------------------------- queues

const SeqState * KvBook::lost_claim(const Task & t) {
    if (lost_sequences_ == 0) return nullptr;   // (the step loop asks for every task: almost always this)
    for (uint64_t h : t.claims) {
        const SeqState * s = find(h);
        if (s && s->state_lost) return s;
    }
    return nullptr;
}

void KvBook::enqueue(SeqState & s, Task & t, bool queue_allowed) {
    assert_thread();
    if (s.state_lost) throw EngineError(lost_state_msg(s.handle));
    if (s.busy() && !queue_allowed) {
        throw SequenceBusyError("sequence " + std::to_string(s.handle) +
                                " is busy with another job (or a commit in progress); wait for it or cancel it "
                                "(background jobs queue behind background jobs; foreground calls do not)");
    }
    s.queue.push_back(&t);
}

void KvBook::dequeue(Task & t, uint64_t h) {
    SeqState * s = find(h);
    if (!s) return;
    auto it = std::find(s->queue.begin(), s->queue.end(), &t);
    if (it != s->queue.end()) s->queue.erase(it);
}

// ---------------------------------------------------------------- batch

void KvBook::begin_batch() {
    assert_thread();
    batch_.n_tokens = 0;
    rollback_.clear();
}

void KvBook::touch(SeqState & s) {
    if (rollback_.count(s.handle)) return;
    RollbackPoint p{s.size(), s.evaluated(), {}, s.logits_valid};
    // (one vocabulary-sized copy per sequence and step: ~0.1 ms for 150k entries, next to a decode)
    if (s.logits_valid) p.logits = logits_copy(s);
    rollback_.emplace(s.handle, std::move(p));
}

int KvBook::add_row(SeqState & s, llama_token t, bool want_logits, RowKind kind) {
    assert_thread();
    if (!s.fully_evaluated()) throw std::logic_error("add_row on a sequence whose last token is not evaluated");
    if (batch_.n_tokens >= (int32_t) n_batch_) throw std::logic_error("batch overflow");
    touch(s);
    s.tokens.push_back(t);
    return add_pending_row(s, want_logits, kind);
}

int KvBook::add_pending_row(SeqState & s, bool want_logits, RowKind kind) {
    assert_thread();
    if (s.fully_evaluated()) throw std::logic_error("add_pending_row with nothing pending");
    if (batch_.n_tokens >= (int32_t) n_batch_) throw std::logic_error("batch overflow");
    touch(s);
    const int i = batch_.n_tokens;
    const size_t pos = s.evaluated();
    batch_.token[i] = s.tokens[pos];
    batch_.pos[i] = (llama_pos) pos;
    batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = s.sid;
    batch_.logits[i] = want_logits;
    row_kind_[(size_t) i] = kind;
    batch_.n_tokens += 1;
    s.cells.push_back(ledger_.create());
    s.logits_valid = false;
    s.logits_row = -1;
    return i;
}

bool KvBook::has_kind(RowKind k) const { return count_kind(k) > 0; }

int KvBook::count_kind(RowKind k) const {
    int n = 0;
    for (int i = 0; i < batch_.n_tokens; ++i) n += row_kind_[(size_t) i] == k;
    return n;
}

int KvBook::decode() {
    assert_thread();
    // The decode overwrites llama.cpp's output buffer: keep the logits other sequences still need.
    for (auto & [h, s] : seqs_) {
        if (s.logits_valid && s.logits_row >= 0) {
            const float * l = llama_get_logits_ith(ctx_, s.logits_row);
            if (l) s.logits.assign(l, l + n_vocab_);
            else { s.logits_valid = false; s.logits.clear(); }
            s.logits_row = -1;
        }
    }
    if (inject_count_ > 0 && batch_.n_tokens >= inject_min_rows_) {  // fault injection for tests
        inject_count_ -= 1;
        if (inject_after_) llama_decode(ctx_, batch_);   // a failure after the compute had run
        return inject_rc_;
    }
    const int rc = llama_decode(ctx_, batch_);
    if (rc == 0) {  // the decode applied every pending K shift first (llama.cpp's memory update)
        for (auto & [h, s] : seqs_) s.shift_pending = false;
    }
    return rc;
}

void KvBook::rollback() {
    assert_thread();
    // llama.cpp restores its memory for rc 1 and -1; for other codes the processed ubatches remain,
    // so remove everything the batch added, then restore our own bookkeeping.
    for (auto & [h, before] : rollback_) {
        SeqState * s = find(h);
        if (!s) continue;
        if (s->cells.size() > before.cells) {
            if (!llama_memory_seq_rm(mem_, s->sid, (llama_pos) before.cells, -1)) {
                // a recurrent (or hybrid) state that advanced with the batch: it cannot be cut back
                llama_memory_seq_rm(mem_, s->sid, -1, -1);
                ledger_.release_range(s->cells, 0, s->cells.size());
                s->cells.clear();
                s->tokens.resize(before.tokens);
                s->logits.clear();
                s->logits_valid = false;
                s->logits_row = -1;
                s->state_lost = true;
                lost_sequences_ += 1;
                continue;
            }
            ledger_.release_range(s->cells, before.cells, s->cells.size());
            s->cells.resize(before.cells);
        }
        s->tokens.resize(before.tokens);
        s->logits_row = -1;
        s->logits_valid = before.had_logits && !before.logits.empty() && s->fully_evaluated();
        if (s->logits_valid) s->logits = std::move(before.logits);
    }
    rollback_.clear();
    batch_.n_tokens = 0;
}

// ---------------------------------------------------------------- logits

const float * KvBook::row_logits(int row) const {
    const float * l = llama_get_logits_ith(ctx_, row);
    if (!l) throw EngineError("llama.cpp returned no logits for batch row " + std::to_string(row));
    return l;
}

void KvBook::set_logits_row(SeqState & s, int row) {
    s.logits_row = row;
    s.logits_valid = true;
}

const float * KvBook::logits(SeqState & s) const {
    if (!s.logits_valid) return nullptr;
    if (s.logits_row >= 0) return llama_get_logits_ith(ctx_, s.logits_row);
    return s.logits.size() == (size_t) n_vocab_ ? s.logits.data() : nullptr;
}

std::vector<float> KvBook::logits_copy(SeqState & s) const {
    const float * l = logits(s);
    if (!l) return {};
    return std::vector<float>(l, l + n_vocab_);
}

}  // namespace pkc
