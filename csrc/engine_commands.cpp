// The sequence commands: each runs on the engine thread between two decode steps.
#include <algorithm>
#include <chrono>

#include "engine.h"
#include "tasks.h"

namespace pkc {

namespace {
void check_kind(RowKind kind) {
    const int k = (int) kind;
    if (k < 0 || k >= kRowKinds) throw std::invalid_argument("row kind must be 0 (foreground), 1 (background) or 2 (probe), got " + std::to_string(k));
}

std::string busy_msg(uint64_t h) {
    return "sequence " + std::to_string(h) + " is busy with another job (or a commit in progress); wait for it or cancel it";
}
}  // namespace

uint64_t Engine::seq_create() {
    return run_on_engine_thread([&] { return kv_->create(false).handle; });
}

std::shared_ptr<Job> Engine::seq_append(uint64_t h, const std::vector<llama_token> & tokens, RowKind kind, bool all_logits) {
    check_kind(kind);
    validate_tokens(tokens);
    return run_on_engine_thread([&] {
        SeqState & s = kv_->usable(h);
        if (s.size() + tokens.size() > n_ctx_) {
            throw ContextFullError("cannot append " + std::to_string(tokens.size()) + " tokens to a sequence of " +
                                   std::to_string(s.size()) + ": the total would exceed n_ctx=" + std::to_string(n_ctx_) +
                                   "; shorten the prompt, compact the history, or use a larger n_ctx");
        }
        // (a last token without its cell, after a load or a failed re-decode, takes one more)
        const size_t need = tokens.size() + (s.size() - s.evaluated());
        if (need > kv_->free_for(0)) {
            throw ContextFullError("cannot append " + std::to_string(tokens.size()) + " tokens: " +
                                   std::to_string(need) + " KV cells needed, " + std::to_string(kv_->free_for(0)) +
                                   " free of n_ctx=" + std::to_string(n_ctx_) + " (one pool shared by all sequences" +
                                   (kv_->reserved_cells() ? ", less " + std::to_string(kv_->reserved_cells()) +
                                    " promised to appends and replies still running: wait for them" : std::string()) +
                                   "); close sequences or use a larger n_ctx");
        }
        auto t = std::make_unique<PrefillTask>(kind, h, tokens, all_logits);
        t->logits_every_chunk = recurrent_state();
        auto job = t->job;
        if (tokens.empty() && !s.busy()) { job->finish("done"); return job; }
        kv_->enqueue(s, *t, kind == RowKind::Background);   // (SequenceBusyError: nothing promised yet)
        if (kind == RowKind::Foreground) {   // all or nothing: background work cannot take its cells meanwhile
            t->promise.make(*kv_, need);
        }
        submit(std::move(t));
        return job;
    }, kind != RowKind::Background);
}

std::shared_ptr<Job> Engine::seq_probe(uint64_t h, const std::vector<llama_token> & tokens,
                                       const std::vector<llama_token> & label_tokens) {
    validate_tokens(tokens);
    validate_tokens(label_tokens);
    if (label_tokens.empty()) throw std::invalid_argument("a probe needs at least one label token");
    return run_on_engine_thread([&] {
        SeqState & s = kv_->usable(h);
        if (s.busy()) throw SequenceBusyError(busy_msg(h));
        if (s.size() == 0 && tokens.empty()) throw std::invalid_argument("cannot probe an empty sequence with no probe tokens");
        if (tokens.size() + 1 > kv_->free_for(0) || s.size() + tokens.size() > n_ctx_) {
            throw ContextFullError("cannot probe with " + std::to_string(tokens.size()) + " tokens: " +
                                   std::to_string(tokens.size() + 1) + " KV cells needed, " +
                                   std::to_string(kv_->free_for(0)) + " free of n_ctx=" + std::to_string(n_ctx_) +
                                   (kv_->reserved_cells() ? " (less those promised to appends and replies still running)" : ""));
        }
        SeqState & fork = kv_->fork(h, true);
        kv_->counters().forks += 1;
        auto t = std::make_unique<ProbeTask>(fork.handle, tokens, label_tokens);
        auto job = t->job;
        kv_->enqueue(fork, *t, false);
        submit(std::move(t));
        return job;
    }, true);
}

std::vector<float> Engine::seq_logits(uint64_t h) {
    for (int attempt = 0; attempt < 3; ++attempt) {
        std::shared_ptr<Job> job;
        std::vector<float> out = run_on_engine_thread([&] {
            SeqState & s = kv_->usable(h);
            if (s.size() == 0) throw std::invalid_argument("the sequence is empty: there are no logits before the first token");
            if (s.logits_valid) {
                std::vector<float> v = kv_->logits_copy(s);
                if (!v.empty()) return v;
                s.logits_valid = false;  // not readable after all: compute them again
            }
            if (s.busy()) throw SequenceBusyError(busy_msg(h));
            auto t = std::make_unique<PrefillTask>(RowKind::Foreground, h, std::vector<llama_token>{}, false);
            job = t->job;
            kv_->enqueue(s, *t, false);
            submit(std::move(t));
            return std::vector<float>{};
        }, true);  // may re-decode: foreground work
        if (!job) return out;
        job->wait(-1);
        if (auto err = job->error()) std::rethrow_exception(err);
    }
    throw EngineError("logits are not available (the sequence keeps changing); call again");
}

std::vector<llama_token> Engine::seq_tokens(uint64_t h) { return run_on_engine_thread([&] { return kv_->get(h).tokens; }); }
size_t Engine::seq_len(uint64_t h) { return run_on_engine_thread([&] { return kv_->get(h).size(); }); }
int Engine::seq_slot(uint64_t h) { return run_on_engine_thread([&] { return (int) kv_->get(h).sid; }); }
bool Engine::seq_spliced(uint64_t h) { return run_on_engine_thread([&] { return kv_->get(h).spliced(); }); }

std::pair<int, int> Engine::seq_pos_range(uint64_t h) {
    return run_on_engine_thread([&] {
        SeqState & s = kv_->get(h);
        llama_memory_t mem = kv_->memory();
        return std::make_pair((int) llama_memory_seq_pos_min(mem, s.sid), (int) llama_memory_seq_pos_max(mem, s.sid));
    });
}

uint64_t Engine::seq_fork(uint64_t h, int64_t n_tokens) {
    return run_on_engine_thread([&] {
        SeqState & src = kv_->usable(h);
        if (src.busy()) throw SequenceBusyError(busy_msg(h) + "; fork it when the job is done");
        const size_t n = n_tokens < 0 ? src.size() : (size_t) n_tokens;
        if (n > src.size()) {
            throw std::out_of_range("cannot fork the first " + std::to_string(n) + " tokens: the sequence has only " +
                                    std::to_string(src.size()));
        }
        if (n < src.size() && recurrent_state()) {
            throw UnsupportedOperationError("this model's memory (recurrent or hybrid) cannot fork a prefix; fork the "
                                            "whole sequence instead");
        }
        SeqState & dst = kv_->fork(h, false, n);
        kv_->counters().forks += 1;
        return dst.handle;
    });
}

void Engine::seq_truncate(uint64_t h, size_t n) {
    run_on_engine_thread([&] {
        SeqState & s = kv_->usable(h);
        if (s.busy()) throw SequenceBusyError(busy_msg(h));
        if (n > s.size()) {
            throw std::out_of_range("cannot truncate to " + std::to_string(n) + " tokens: the sequence has only " +
                                    std::to_string(s.size()));
        }
        if (n == s.size()) return;
        kv_->drop_tail(s, n);
        for (auto & t : tasks_) {
            auto * r = dynamic_cast<RebaseTask *>(t.get());
            if (r && r->main_handle == h) r->on_main_truncated(*kv_, n);
        }
    });
}

void Engine::end_tasks_touching(uint64_t h, const std::string & why) {
    auto err = std::make_exception_ptr(SequenceClosedError(why));
    for (auto & t : tasks_) if (!t->finished && t->touches(h)) t->fail(*kv_, err, why);
}

void Engine::seq_close(uint64_t h) {
    run_on_engine_thread([&] { close_now(h); });
}

void Engine::seq_close_later(uint64_t h) {
    // queued for the engine thread's next pause between steps; a stopped engine drops it (its pool is gone)
    inbox_->push([this, h] {
        try {
            close_now(h);
        } catch (...) {  // a finalizer has no one to tell
        }
    });
}

void Engine::close_now(uint64_t h) {
    SeqState * s = kv_->find(h);
    if (!s || s->internal) return;  // closing twice is harmless
    end_tasks_touching(h, "sequence " + std::to_string(h) + " was closed");
    if ((s = kv_->find(h))) kv_->release(*s);
}

std::shared_ptr<Job> Engine::seq_generate(uint64_t h, int max_tokens, const SamplingParams & sp,
                                          const std::vector<llama_token> & stop_tokens,
                                          const std::vector<std::string> & stop_strings, RowKind kind) {
    check_kind(kind);
    if (max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0, got " + std::to_string(max_tokens));
    validate_tokens(stop_tokens);
    return run_on_engine_thread([&] {
        SeqState & s = kv_->usable(h);
        if (s.size() == 0 && !s.busy()) throw std::invalid_argument("cannot generate on an empty sequence: append a prompt first");
        SamplingParams p = sp;
        if (p.seed == 0xFFFFFFFFu) p.seed = opts_.seed + 7919u * (++job_counter_);
        auto t = std::make_unique<GenerateTask>(kind, h, max_tokens, vocab_, p, stop_tokens, stop_strings);
        auto job = t->job;
        kv_->enqueue(s, *t, kind == RowKind::Background);
        if (kind != RowKind::Background) {
            // a reply keeps the cells it may write (as many as are free now, up to max_tokens and n_ctx):
            // background work started later never makes it end early with context_full
            const size_t room = (size_t) n_ctx_ - std::min((size_t) n_ctx_, s.size());
            const size_t promise = std::min({(size_t) std::max(0, max_tokens) + (s.fully_evaluated() ? 0 : 1),
                                             kv_->free_for(0), room});
            t->promise.make(*kv_, promise);
        }
        submit(std::move(t));
        return job;
    }, kind != RowKind::Background);
}

std::pair<uint64_t, std::shared_ptr<Job>> Engine::prepare_rebase(uint64_t h, size_t keep_prefix,
                                                               const std::vector<llama_token> & replacement,
                                                               size_t keep_from, bool splice) {
    validate_tokens(replacement);
    return run_on_engine_thread([&] {
        SeqState & m = kv_->usable(h);
        if (keep_prefix > keep_from || keep_from > m.size()) {
            throw std::invalid_argument("rebase needs 0 <= keep_prefix <= keep_from <= len(sequence); got keep_prefix=" +
                                        std::to_string(keep_prefix) + ", keep_from=" + std::to_string(keep_from) +
                                        ", len=" + std::to_string(m.size()));
        }
        // (M-RoPE positions are not one number: a shift would abort the process even if can_shift said yes)
        if (splice && !(can_shift_ && !recurrent_state() && !mrope_)) {
            throw UnsupportedOperationError("mode='splice' shifts KV positions, which this model's memory cannot do "
                                            "(M-RoPE, recurrent or hybrid model); use mode='exact'");
        }
        const size_t target = keep_prefix + replacement.size() + (m.size() - keep_from);
        if (target > n_ctx_) {
            throw ContextFullError("the rebased sequence would have " + std::to_string(target) + " tokens, more than n_ctx=" +
                                   std::to_string(n_ctx_) + "; keep fewer tokens or use a shorter replacement");
        }
        // The prefix's cells are shared where the memory allows it and it is exact: not a recurrent state, and
        // not on a sliding-window model, where a shadow built on shared cells was measured inexact (tiny
        // gemma2, n_swa=32: 4e-2 off a fresh sequence when it fed from past about len - 110 with a tail;
        // not understood; fed whole it is exact).  Otherwise they are fed again.
        const bool shares = !recurrent_state() && n_swa_ == 0;
        // Where cells are shared, a replacement that begins with the tokens it replaces (a summary that starts
        // as the one before it did) keeps them as prefix: the same tokens at the same positions after the same
        // prefix have the same KV.  The result is the same sequence.  Not past the sequence's exact cells (a
        // splice's moved tail, computed after another span); a summary before it is reused.
        size_t same = 0;
        if (shares) {
            const size_t reach = std::min({keep_from, m.evaluated(), m.exact_upto});
            while (same < replacement.size() && keep_prefix + same < reach &&
                   m.tokens[keep_prefix + same] == replacement[same]) {
                ++same;
            }
        }
        keep_prefix += same;
        const size_t shared = shares ? std::min(keep_prefix, m.evaluated()) : 0;
        std::vector<llama_token> fed_first(m.tokens.begin() + (long) shared, m.tokens.begin() + (long) keep_prefix);
        fed_first.insert(fed_first.end(), replacement.begin() + (long) same, replacement.end());
        SeqState & shadow = kv_->fork(h, true, shared);
        kv_->counters().rebase_reused_rows += (long) same;
        auto t = std::make_unique<RebaseTask>(h, shadow.handle, keep_prefix, keep_from, std::move(fed_first), splice,
                                              replacement.size() - same, m.epoch);
        if (splice) t->main_fed = m.size();
        t->reused = same;
        t->logits_every_chunk = recurrent_state();
        auto job = t->job;
        kv_->enqueue(shadow, *t, false);
        const uint64_t id = shadow.handle;
        submit(std::move(t));
        return std::make_pair(id, job);
    });
}

RebaseTask * Engine::find_rebase(uint64_t id) {
    for (auto & t : tasks_) {
        auto * r = dynamic_cast<RebaseTask *>(t.get());
        if (r && r->shadow_handle == id && !r->finished) return r;
    }
    return nullptr;
}

size_t Engine::rebase_target_len(uint64_t id) {
    return run_on_engine_thread([&]() -> size_t {
        RebaseTask * r = find_rebase(id);
        if (!r) throw RebaseNotPendingError("this rebase is no longer pending (committed, cancelled or failed)");
        SeqState & m = kv_->get(r->main_handle);
        return r->keep_prefix + r->replacement_len + (m.size() - r->keep_from);
    });
}

void Engine::cancel_rebase_later(uint64_t id) {
    // a finalizer's cancel: queued like seq_close_later, never waited for (a rebase being committed is left to
    // finish: its commit owns it then)
    inbox_->push([this, id] {
        RebaseTask * r = find_rebase(id);
        if (!r || r->committing) return;
        try {
            r->fail(*kv_, std::make_exception_ptr(CancelledError("rebase preparation was cancelled")),
                    "rebase preparation was cancelled");
        } catch (...) {  // a finalizer has no one to tell
        }
    });
}

void Engine::cancel_rebase(uint64_t id) {
    run_on_engine_thread([&] {
        RebaseTask * r = find_rebase(id);
        if (!r) return;
        if (r->committing) throw SequenceBusyError("the rebase is being committed; it can no longer be cancelled");
        r->fail(*kv_, std::make_exception_ptr(CancelledError("rebase preparation was cancelled")),
                "rebase preparation was cancelled");
    });
}

std::map<std::string, double> Engine::commit_rebase(uint64_t h, uint64_t id) {
    std::future<std::map<std::string, double>> fut = run_on_engine_thread([&] {
        RebaseTask * r = find_rebase(id);
        if (!r) throw RebaseNotPendingError("this rebase is no longer pending (committed, cancelled or failed); prepare it again");
        if (r->main_handle != h) throw std::invalid_argument("this rebase was prepared for another sequence");
        r->request_commit(*kv_);  // throws, leaving the rebase committable later, if it cannot start now
        return r->commit_promise.get_future();
    }, true);
    return fut.get();
}

size_t Engine::used_cells() { return run_on_engine_thread([&] { return kv_->used_cells(); }); }
size_t Engine::free_cells() { return run_on_engine_thread([&] { return kv_->free_for(0); }); }

void Engine::inject_decode_failures(int count, int rc, int min_rows, bool after) {
    run_on_engine_thread([&] { kv_->inject_failures(count, rc, min_rows, after); });
}

std::map<std::string, long> Engine::tokens_per_sequence() {
    return run_on_engine_thread([&] {
        std::map<std::string, long> m;
        for (auto & [h, s] : kv_->sequences()) if (!s.internal) m[std::to_string(h)] = (long) s.size();
        return m;
    });
}

std::map<std::string, double> Engine::stats() {
    return run_on_engine_thread([&] {
        const EngineCounters & c = kv_->counters();
        std::map<std::string, double> m;
        m["decode_calls"] = (double) c.decode_calls;
        m["failed_decodes"] = (double) c.failed_decodes;
        m["mixed_batches"] = (double) c.mixed_batches;
        m["rows_foreground"] = (double) c.rows[0];
        m["rows_background"] = (double) c.rows[1];
        m["rows_probe"] = (double) c.rows[2];
        m["decode_ms"] = c.decode_ms;
        m["rebases"] = (double) c.rebases;
        m["catch_up_rows"] = (double) c.catch_up_rows;
        m["rebase_reused_rows"] = (double) c.rebase_reused_rows;
        m["forks"] = (double) c.forks;
        m["background_share"] = share_.share();
        m["background_deferred_steps"] = (double) share_.deferred_steps();
        m["aborted_decodes"] = (double) c.aborted_decodes;
        m["aborted_ms"] = c.aborted_ms;
        m["used_cells"] = (double) kv_->used_cells();
        m["reserved_cells"] = (double) kv_->reserved_cells();
        m["n_ctx"] = (double) n_ctx_;
        m["live_sequences"] = 0;
        m["internal_sequences"] = 0;
        for (auto & [h, s] : kv_->sequences()) m[s.internal ? "internal_sequences" : "live_sequences"] += 1;
        m["pending_tasks"] = (double) tasks_.size();
        m["committing"] = 0;
        for (auto & t : tasks_) {
            auto * r = dynamic_cast<RebaseTask *>(t.get());
            if (r && r->committing && !r->finished) m["committing"] += 1;
        }
        return m;
    });
}

}  // namespace pkc
