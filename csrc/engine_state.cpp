// Persistence of one sequence: export its tokens, next-token logits and llama.cpp state; import them
// into a new sequence (slot) of an engine running the same model. The Python layer (state.py) wraps
// the snapshot in a self-describing, checksummed blob and checks it before anything reaches here.
#include "engine.h"
#include "tasks.h"

namespace pkc {

namespace {
std::string busy_msg(uint64_t h) {
    return "sequence " + std::to_string(h) + " is busy with another job (or a commit in progress); save it when the job is done";
}
}  // namespace

SeqSnapshot Engine::seq_export(uint64_t h) {
    // A splice's K rotation is applied lazily by the next decode: apply it first (by computing the
    // sequence's logits, which needs that decode anyway), so the saved K is the rotated one.
    for (int attempt = 0; attempt < 3; ++attempt) {
        std::shared_ptr<Job> job;
        SeqSnapshot out = run_on_engine_thread([&] {
            SeqState & s = kv_->usable(h);
            if (s.busy()) throw SequenceBusyError(busy_msg(h));
            SeqSnapshot snap;
            if (s.shift_pending) {
                // A sequence holding moved cells has had no decode since, so its logits are not valid;
                // make sure the prefill below decodes (it re-decodes the last token).
                s.logits_valid = false;
                s.logits_row = -1;
                auto t = std::make_unique<PrefillTask>(RowKind::Foreground, h, std::vector<llama_token>{}, false);
                job = t->job;
                kv_->enqueue(s, *t, false);
                submit(std::move(t));
                return snap;
            }
            snap.tokens = s.tokens;
            snap.evaluated = s.evaluated();
            snap.exact_upto = s.exact_upto;
            if (s.fully_evaluated()) snap.logits = kv_->logits_copy(s);  // empty when not valid
            const size_t size = llama_state_seq_get_size(ctx_, s.sid);
            snap.state.resize(size);
            const size_t written = size ? llama_state_seq_get_data(ctx_, snap.state.data(), size, s.sid) : 0;
            if (written != size) {
                throw EngineError("llama.cpp wrote " + std::to_string(written) + " bytes of sequence state, " +
                                  std::to_string(size) + " expected; the state was not saved");
            }
            return snap;
        });
        if (!job) return out;
        job->wait(-1);
        if (auto err = job->error()) std::rethrow_exception(err);
    }
    throw UnsupportedOperationError("the sequence's KV positions were shifted (splice rebase) and the shift could not be "
                                    "applied; call logits() on it, then save it again");
}

uint64_t Engine::seq_import(const std::vector<llama_token> & tokens, size_t evaluated, const std::vector<float> & logits,
                            const uint8_t * state, size_t state_size, size_t exact_upto) {
    validate_tokens(tokens);
    if (evaluated > tokens.size() || tokens.size() - evaluated > 1) {
        throw std::invalid_argument("a saved sequence has all its tokens evaluated, or all but the last; got " +
                                    std::to_string(evaluated) + " evaluated of " + std::to_string(tokens.size()));
    }
    if (!logits.empty() && (logits.size() != (size_t) n_vocab_ || evaluated != tokens.size())) {
        throw std::invalid_argument("saved logits must have n_vocab=" + std::to_string(n_vocab_) +
                                    " values and follow an evaluated last token");
    }
    if (tokens.size() > n_ctx_) {
        throw ContextFullError("the saved sequence has " + std::to_string(tokens.size()) + " tokens, more than n_ctx=" +
                               std::to_string(n_ctx_));
    }
    const bool needs_redecode = logits.empty() && evaluated > 0 && evaluated == tokens.size();
    if (needs_redecode && recurrent_state()) {
        throw UnsupportedOperationError("this model's memory (recurrent or hybrid) cannot recompute the last token's logits "
                                        "of a restored sequence, and none were saved; save the sequence right after a "
                                        "decode (its logits valid), or prefill the tokens again");
    }
    return run_on_engine_thread([&] {
        if (evaluated > kv_->free_for(0)) {
            throw ContextFullError("cannot load a sequence of " + std::to_string(evaluated) + " evaluated tokens: only " +
                                   std::to_string(kv_->free_for(0)) + " KV cells are free of n_ctx=" + std::to_string(n_ctx_) +
                                   " (one pool shared by all sequences); close sequences or use a larger n_ctx");
        }
        SeqState & s = kv_->create(false);  // SlotsExhaustedError: nothing to undo
        const uint64_t h = s.handle;
        try {
            const size_t read = llama_state_seq_set_data(ctx_, state, state_size, s.sid);
            if (read == 0 || read != state_size) {
                throw EngineError("llama.cpp rejected the saved sequence state (it read " + std::to_string(read) + " of " +
                                  std::to_string(state_size) + " bytes): it needs " + std::to_string(evaluated) +
                                  " contiguous free KV cells (" + std::to_string(kv_->free_cells()) +
                                  " are free, maybe fragmented), and data written by this model with the same KV "
                                  "layout (flash attention on or off alike); prefill the tokens again instead");
            }
            llama_memory_t mem = kv_->memory();
            const llama_pos lo = llama_memory_seq_pos_min(mem, s.sid), hi = llama_memory_seq_pos_max(mem, s.sid);
            const llama_pos want_hi = (llama_pos) evaluated - 1;
            // Attention memories hold every position; recurrent and hybrid ones report the last one as the minimum too.
            const bool ok = evaluated == 0 ? (lo == -1 && hi == -1)
                                           : hi == want_hi && (lo == 0 || (recurrent_state() && lo == want_hi));
            if (!ok) {
                throw EngineError("the restored state holds positions " + std::to_string(lo) + ".." + std::to_string(hi) +
                                  ", not 0.." + std::to_string(want_hi) + " as saved; it was not loaded");
            }
            s.tokens = tokens;
            kv_->adopt_cells(s, evaluated);
            // (cells a splice moved stay approximate after a reload: a rebase must not reuse them)
            s.exact_upto = exact_upto < evaluated ? exact_upto : SeqState::kAllExact;
            if (!logits.empty()) {
                s.logits = logits;
                s.logits_valid = true;
                s.logits_row = -1;
            } else if (needs_redecode) {
                kv_->unevaluate_last(s);  // the next task on it decodes the last token again, with logits
            }
        } catch (...) {
            if (SeqState * gone = kv_->find(h)) kv_->release(*gone);  // the slot, its KV and ledger cells
            throw;
        }
        return h;
    });
}

}  // namespace pkc
