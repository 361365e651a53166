#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "tasks.h"

namespace pkc {

namespace {

bool g_verbose = false;

void log_callback(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ================================================================ lifecycle

Engine::Engine(const EngineOptions & opts) : opts_(opts) {
    if (opts.n_seq_max < 1 || opts.n_seq_max > 256)
        throw std::invalid_argument("n_seq_max must be between 1 and 256, got " + std::to_string(opts.n_seq_max));
    if (opts.n_ctx < 16) throw std::invalid_argument("n_ctx must be at least 16, got " + std::to_string(opts.n_ctx));
    if (opts.n_batch < 1) throw std::invalid_argument("n_batch must be >= 1");
    if (opts.background_chunk < 1 || opts.background_chunk_busy < 1)
        throw std::invalid_argument("background_chunk and background_chunk_busy must be >= 1");
    g_verbose = opts.verbose;
    llama_log_set(log_callback, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = opts.use_extra_bufts;
    mp.n_gpu_layers = opts.n_gpu_layers;
    model_ = llama_model_load_from_file(opts.model_path.c_str(), mp);
    if (!model_) throw std::invalid_argument("llama.cpp could not load the model file '" + opts.model_path +
                                             "' (not a valid GGUF model, or an unsupported architecture)");
    vocab_ = llama_model_get_vocab(model_);
    n_vocab_ = llama_vocab_n_tokens(vocab_);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = opts.n_ctx;
    cp.n_batch = opts.n_batch;
    cp.n_ubatch = opts.n_batch;
    cp.n_seq_max = opts.n_seq_max;
    cp.n_threads = opts.n_threads > 0 ? opts.n_threads : 1;
    cp.n_threads_batch = cp.n_threads;
    cp.kv_unified = true;  // fork = metadata only; partial seq_cp is safe (DESIGN.md)
    cp.swa_full = true;    // otherwise sliding-window models purge old positions silently
    cp.no_perf = true;
    cp.flash_attn_type = opts.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                       : opts.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) {
        llama_model_free(model_);
        model_ = nullptr;
        throw EngineError("llama.cpp could not create a context (n_ctx=" + std::to_string(opts.n_ctx) +
                          ", n_seq_max=" + std::to_string(opts.n_seq_max) + "); try a smaller n_ctx");
    }
    mem_ = llama_get_memory(ctx_);
    n_ctx_ = llama_n_ctx(ctx_);
    // llama.cpp may lower n_batch (it never exceeds n_ctx); a bigger batch would trip a GGML_ASSERT.
    opts_.n_batch = std::min(opts_.n_batch, (uint32_t) llama_n_batch(ctx_));
    opts_.n_batch = std::min(opts_.n_batch, (uint32_t) llama_n_ubatch(ctx_));
    can_shift_ = llama_memory_can_shift(mem_);
    recurrent_ = llama_model_is_recurrent(model_);
    hybrid_ = llama_model_is_hybrid(model_);
    n_swa_ = llama_model_n_swa(model_);
    slot_used_.assign(opts.n_seq_max, false);
    batch_ = llama_batch_init((int32_t) opts.n_batch, 0, 1);
    row_kind_.resize(opts.n_batch);
    thread_ = std::thread([this] { loop(); });
    engine_thread_id_ = thread_.get_id();
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
    {
        std::lock_guard<std::mutex> lk(q_mu_);
        if (stopping_ && !thread_.joinable()) return;
        stopping_ = true;
    }
    q_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (batch_.token) { llama_batch_free(batch_); batch_ = llama_batch{}; }
    if (ctx_) { llama_free(ctx_); ctx_ = nullptr; }
    if (model_) { llama_model_free(model_); model_ = nullptr; }
}

// ================================================================ the engine thread

template <class F>
auto Engine::call(F && f) -> decltype(f()) {
    using R = decltype(f());
    if (std::this_thread::get_id() == engine_thread_id_) return f();
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    {
        std::lock_guard<std::mutex> lk(q_mu_);
        if (stopping_) throw EngineError("the engine is closed");
        commands_.push_back([task] { (*task)(); });
    }
    q_cv_.notify_one();
    return fut.get();
}

void Engine::loop() {
    bool idle = true;
    while (true) {
        std::vector<std::function<void()>> cmds;
        {
            std::unique_lock<std::mutex> lk(q_mu_);
            if (idle) q_cv_.wait(lk, [&] { return !commands_.empty() || stopping_; });
            cmds.swap(commands_);
            if (stopping_) {
                lk.unlock();
                for (auto & c : cmds) c();  // packaged tasks: run them so no caller waits forever
                break;
            }
        }
        for (auto & c : cmds) c();
        idle = !step();
    }
    // Shutting down: end every task so no waiter hangs.
    auto err = std::make_exception_ptr(EngineError("the engine was closed"));
    for (auto & t : tasks_) t->abort(*this, err, "the engine was closed");
    tasks_.clear();
    {
        // Commands that raced with shutdown are refused by call(); drain any leftovers.
        std::lock_guard<std::mutex> lk(q_mu_);
        commands_.clear();
    }
}

void Engine::submit_task(std::unique_ptr<Task> t) { tasks_.push_back(std::move(t)); }

bool Engine::has_queued(uint64_t h) const {
    for (auto & t : tasks_) if (!t->finished && t->waiting_on == h) return true;
    return false;
}

void Engine::claim_or_queue(SeqState & s, Task & t) {
    const bool queue_nonempty = has_queued(s.handle);
    if (!s.busy && !queue_nonempty) { s.busy = &t; return; }
    const bool bg_behind_bg = t.kind == RowKind::Background && (!s.busy || s.busy->kind == RowKind::Background);
    if (!bg_behind_bg) {
        throw SequenceBusyError("sequence " + std::to_string(s.handle) +
                                " is busy with another job; wait for it or cancel it (background jobs queue behind "
                                "background jobs; foreground calls do not)");
    }
    t.waiting_on = s.handle;
}

// One decode: foreground rows first, then a bounded chunk of background rows.
bool Engine::step() {
    if (tasks_.empty()) return false;
    for (auto & t : tasks_) {  // queued background tasks start, in order, when their sequence is free
        if (t->finished || !t->waiting_on) continue;
        SeqState * s = find_seq(t->waiting_on);
        if (!s) { t->abort(*this, std::make_exception_ptr(SequenceClosedError("sequence was closed")), "sequence was closed"); continue; }
        if (!s->busy) { s->busy = t.get(); t->waiting_on = 0; }
    }
    batch_.n_tokens = 0;
    step_len_before_.clear();
    std::vector<Task *> active;
    int budget = (int) opts_.n_batch;
    bool any_fg = false, any_bg = false;
    // Mixed-ness is known only after we know who contributes; tasks read it for their job stats, so
    // compute it up front from has_work.
    for (auto & t : tasks_) {
        if (t->finished || t->waiting_on || !t->has_work(*this)) continue;
        (t->kind == RowKind::Background ? any_bg : any_fg) = true;
    }
    step_mixed_ = any_fg && any_bg;
    for (int pass = 0; pass < 2; ++pass) {
        const bool want_bg = pass == 1;
        const bool fg_rows = batch_.n_tokens > 0;
        const int bg_cap = (int) (fg_rows ? opts_.background_chunk_busy : opts_.background_chunk);
        int pass_budget = want_bg ? std::min(budget, bg_cap) : budget;
        for (size_t i = 0; i < tasks_.size() && pass_budget > 0; ++i) {
            Task * t = tasks_[i].get();
            if (t->finished || t->waiting_on || (t->kind == RowKind::Background) != want_bg || !t->has_work(*this)) continue;
            int n = 0;
            try {
                n = t->add_rows(*this, pass_budget);
            } catch (const std::exception & ex) {
                t->abort(*this, std::current_exception(), ex.what());
            }
            if (n > 0) { active.push_back(t); pass_budget -= n; budget -= n; }
        }
    }
    const int n_rows = batch_.n_tokens;
    bool decoded = false;
    if (n_rows > 0) {
        auto t0 = std::chrono::steady_clock::now();
        const int32_t rc = llama_decode(ctx_, batch_);
        stat_decode_ms_ += ms_since(t0);
        stat_decode_calls_ += 1;
        if (rc == 0) {
            decoded = true;
            for (int r = 0; r < n_rows; ++r) stat_rows_[(int) row_kind_[(size_t) r]] += 1;
            bool fg = false, bg = false;
            for (int r = 0; r < n_rows; ++r) (row_kind_[(size_t) r] == RowKind::Background ? bg : fg) = true;
            if (fg && bg) stat_mixed_batches_ += 1;
            for (Task * t : active) {
                try {
                    t->after_decode(*this);
                } catch (const std::exception & ex) {
                    t->abort(*this, std::current_exception(), ex.what());
                }
            }
        } else {
            stat_failed_decodes_ += 1;
            // llama.cpp restores the memory for rc 1 and -1; for other codes the processed ubatches
            // remain, so remove everything this step added, then restore our own bookkeeping.
            for (auto & [h, len] : step_len_before_) {
                SeqState * s = find_seq(h);
                if (!s) continue;
                llama_memory_seq_rm(mem_, s->sid, (llama_pos) len, -1);
                ledger_.release_range(s->cells, len, s->cells.size());
                s->tokens.resize(len);
                s->cells.resize(len);
                s->logits_valid = false;
            }
            std::string msg = rc == 1 ? "llama_decode found no free KV slot for the batch (n_ctx=" + std::to_string(n_ctx_) +
                                            "); close sequences or use a larger n_ctx"
                                      : "llama_decode failed with code " + std::to_string(rc);
            auto err = rc == 1 ? std::make_exception_ptr(ContextFullError(msg)) : std::make_exception_ptr(EngineError(msg));
            for (Task * t : active) t->abort(*this, err, msg);
        }
    }
    tasks_.erase(std::remove_if(tasks_.begin(), tasks_.end(), [](const std::unique_ptr<Task> & t) { return t->finished; }),
                 tasks_.end());
    return decoded;
}

int Engine::add_row(SeqState & s, llama_token t, bool want_logits, RowKind kind) {
    const int i = batch_.n_tokens;
    if (!step_len_before_.count(s.handle)) step_len_before_[s.handle] = s.size();
    batch_.token[i] = t;
    batch_.pos[i] = (llama_pos) s.size();
    batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = s.sid;
    batch_.logits[i] = want_logits;
    row_kind_[(size_t) i] = kind;
    batch_.n_tokens += 1;
    s.tokens.push_back(t);
    s.cells.push_back(ledger_.create());
    return i;
}

const float * Engine::row_logits(int row) const {
    const float * l = llama_get_logits_ith(ctx_, row);
    if (!l) throw EngineError("llama.cpp returned no logits for batch row " + std::to_string(row));
    return l;
}

void Engine::store_logits(SeqState & s, int row) {
    const float * l = row_logits(row);
    s.logits.assign(l, l + n_vocab_);
    s.logits_valid = true;
}

// ================================================================ sequence bookkeeping (engine thread)

SeqState * Engine::find_seq(uint64_t h) {
    auto it = seqs_.find(h);
    return it == seqs_.end() ? nullptr : &it->second;
}

SeqState & Engine::seq(uint64_t h) {
    SeqState * s = find_seq(h);
    if (!s || s->internal) throw SequenceClosedError("sequence " + std::to_string(h) + " is closed (or never existed)");
    return *s;
}

llama_seq_id Engine::alloc_slot() {
    for (size_t i = 0; i < slot_used_.size(); ++i) {
        if (!slot_used_[i]) { slot_used_[i] = true; return (llama_seq_id) i; }
    }
    throw SlotsExhaustedError("all " + std::to_string(slot_used_.size()) +
                              " sequence slots are in use (probes, forks and rebase preparations each take one "
                              "while they live); close a sequence or create the Engine with a larger n_seq_max");
}

void Engine::truncate_kv(SeqState & s, size_t n) {
    if (n >= s.size()) return;
    if (!llama_memory_seq_rm(mem_, s.sid, (llama_pos) n, -1)) {
        throw UnsupportedOperationError("this model's memory cannot remove the tail of a sequence (recurrent or hybrid "
                                        "model); use fork + probe, or an exact rebase, instead of truncate");
    }
    ledger_.release_range(s.cells, n, s.cells.size());
    s.tokens.resize(n);
    s.cells.resize(n);
    s.logits_valid = false;
}

void Engine::release_sequence(SeqState & s) {
    llama_memory_seq_rm(mem_, s.sid, -1, -1);
    ledger_.release_range(s.cells, 0, s.cells.size());
    if (s.sid >= 0 && (size_t) s.sid < slot_used_.size()) slot_used_[(size_t) s.sid] = false;
    seqs_.erase(s.handle);
}

void Engine::end_tasks_touching(uint64_t h, const std::string & why) {
    auto err = std::make_exception_ptr(SequenceClosedError(why));
    for (auto & t : tasks_) if (!t->finished && t->touches(h)) t->abort(*this, err, why);
}

RebaseTask * Engine::find_rebase(uint64_t id) {
    for (auto & t : tasks_) {
        auto * r = dynamic_cast<RebaseTask *>(t.get());
        if (r && r->shadow_handle == id && !r->finished) return r;
    }
    return nullptr;
}

void Engine::validate_tokens(const std::vector<llama_token> & tokens) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab_) {
            throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                        " is out of range: this model's vocabulary has ids 0.." + std::to_string(n_vocab_ - 1));
        }
    }
}

// ================================================================ text

std::vector<llama_token> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    std::lock_guard<std::mutex> lk(tok_mu_);
    std::vector<llama_token> out(text.size() + 8);
    int n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special, parse_special);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special, parse_special);
    }
    if (n < 0) throw EngineError("tokenization failed");
    out.resize((size_t) n);
    return out;
}

std::string Engine::token_to_piece(llama_token t, bool special) const {
    if (t < 0 || t >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(t) + " is out of range 0.." + std::to_string(n_vocab_ - 1));
    char buf[256];
    int n = llama_token_to_piece(vocab_, t, buf, sizeof(buf), 0, special);
    if (n >= 0) return std::string(buf, (size_t) n);
    std::string big((size_t) -n, '\0');
    n = llama_token_to_piece(vocab_, t, big.data(), (int32_t) big.size(), 0, special);
    big.resize(n > 0 ? (size_t) n : 0);
    return big;
}

std::string Engine::detokenize(const std::vector<llama_token> & tokens, bool special) const {
    validate_tokens(tokens);
    std::lock_guard<std::mutex> lk(tok_mu_);
    std::string out(tokens.size() * 8 + 16, '\0');
    int n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), false, special);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), false, special);
    }
    out.resize(n > 0 ? (size_t) n : 0);
    return out;
}

std::map<std::string, std::string> Engine::capabilities_strings() const {
    std::map<std::string, std::string> m;
    char buf[512];
    if (llama_model_desc(model_, buf, sizeof(buf)) > 0) m["description"] = buf;
    if (llama_model_meta_val_str(model_, "general.architecture", buf, sizeof(buf)) > 0) m["architecture"] = buf;
    return m;
}

// ================================================================ commands

uint64_t Engine::seq_create() {
    return call([&] {
        llama_seq_id sid = alloc_slot();
        uint64_t h = new_handle();
        SeqState & s = seqs_[h];
        s.handle = h;
        s.sid = sid;
        llama_memory_seq_rm(mem_, sid, -1, -1);  // a freed slot is empty, but make it certain
        return h;
    });
}

std::shared_ptr<Job> Engine::seq_append(uint64_t h, const std::vector<llama_token> & tokens, RowKind kind, bool all_logits) {
    validate_tokens(tokens);
    return call([&] {
        SeqState & s = seq(h);
        if (s.size() + tokens.size() > n_ctx_) {
            throw ContextFullError("cannot append " + std::to_string(tokens.size()) + " tokens to a sequence of " +
                                   std::to_string(s.size()) + ": the total would exceed n_ctx=" + std::to_string(n_ctx_) +
                                   "; shorten the prompt, compact the history, or use a larger n_ctx");
        }
        if (tokens.size() > free_cells()) {
            throw ContextFullError("cannot append " + std::to_string(tokens.size()) + " tokens: only " + std::to_string(free_cells()) +
                                   " KV cells are free of n_ctx=" + std::to_string(n_ctx_) +
                                   " (one pool shared by all sequences); close sequences or use a larger n_ctx");
        }
        auto t = std::make_unique<PrefillTask>(kind, h, tokens, all_logits, false);
        auto job = t->job;
        claim_or_queue(s, *t);
        if (tokens.empty() && !t->waiting_on) { s.busy = nullptr; job->finish("done"); return job; }
        submit_task(std::move(t));
        return job;
    });
}

std::vector<float> Engine::seq_logits(uint64_t h) {
    auto job = call([&]() -> std::shared_ptr<Job> {
        SeqState & s = seq(h);
        if (s.size() == 0) throw std::invalid_argument("the sequence is empty: there are no logits before the first token");
        if (s.logits_valid) return nullptr;
        if (s.busy) throw SequenceBusyError("sequence " + std::to_string(h) + " is busy with another job; wait for it or cancel it");
        auto t = std::make_unique<PrefillTask>(RowKind::Foreground, h, std::vector<llama_token>{}, false, true);
        auto j = t->job;
        s.busy = t.get();
        submit_task(std::move(t));
        return j;
    });
    if (job) {
        job->wait(-1);
        if (auto err = job->error()) std::rethrow_exception(err);
    }
    return call([&] {
        SeqState & s = seq(h);
        if (!s.logits_valid) throw EngineError("logits are not available (the sequence changed meanwhile); call again");
        return s.logits;
    });
}

std::vector<llama_token> Engine::seq_tokens(uint64_t h) { return call([&] { return seq(h).tokens; }); }
size_t Engine::seq_len(uint64_t h) { return call([&] { return seq(h).size(); }); }
int Engine::seq_slot(uint64_t h) { return call([&] { return (int) seq(h).sid; }); }

std::pair<int, int> Engine::seq_pos_range(uint64_t h) {
    return call([&] {
        SeqState & s = seq(h);
        return std::make_pair((int) llama_memory_seq_pos_min(mem_, s.sid), (int) llama_memory_seq_pos_max(mem_, s.sid));
    });
}

uint64_t Engine::seq_fork(uint64_t h) {
    return call([&] {
        SeqState & src = seq(h);
        if (src.busy) throw SequenceBusyError("sequence " + std::to_string(h) + " is busy with another job; fork it when the job is done");
        llama_seq_id sid = alloc_slot();
        uint64_t nh = new_handle();
        SeqState & src2 = seqs_.at(h);  // the map may have rebalanced; references stay valid in std::map
        SeqState & dst = seqs_[nh];
        dst.handle = nh;
        dst.sid = sid;
        llama_memory_seq_rm(mem_, sid, -1, -1);
        llama_memory_seq_cp(mem_, src2.sid, sid, -1, -1);
        dst.tokens = src2.tokens;
        dst.cells = src2.cells;
        ledger_.hold_all(dst.cells);
        dst.logits = src2.logits;
        dst.logits_valid = src2.logits_valid;
        stat_forks_ += 1;
        return nh;
    });
}

void Engine::seq_truncate(uint64_t h, size_t n) {
    call([&] {
        SeqState & s = seq(h);
        if (s.busy) throw SequenceBusyError("sequence " + std::to_string(h) + " is busy with another job; wait for it or cancel it");
        if (n > s.size()) {
            throw std::out_of_range("cannot truncate to " + std::to_string(n) + " tokens: the sequence has only " +
                                    std::to_string(s.size()));
        }
        if (n == s.size()) return;
        truncate_kv(s, n);
        for (auto & t : tasks_) {
            auto * r = dynamic_cast<RebaseTask *>(t.get());
            if (r && r->main_handle == h) r->on_main_truncated(*this, n);
        }
    });
}

void Engine::seq_close(uint64_t h) {
    call([&] {
        SeqState * s = find_seq(h);
        if (!s || s->internal) return;  // closing twice is harmless
        end_tasks_touching(h, "sequence " + std::to_string(h) + " was closed");
        s = find_seq(h);
        if (s) release_sequence(*s);
    });
}

std::shared_ptr<Job> Engine::seq_generate(uint64_t h, int max_tokens, const SamplingParams & sp,
                                          const std::vector<llama_token> & stop_tokens,
                                          const std::vector<std::string> & stop_strings, RowKind kind) {
    if (max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0, got " + std::to_string(max_tokens));
    validate_tokens(stop_tokens);
    return call([&] {
        SeqState & s = seq(h);
        const bool queued = s.busy || has_queued(h);
        if (s.size() == 0 && !queued) throw std::invalid_argument("cannot generate on an empty sequence: append a prompt first");
        SamplingParams p = sp;
        if (p.seed == 0xFFFFFFFFu) p.seed = opts_.seed + 7919u * (++job_counter_);
        auto t = std::make_unique<GenerateTask>(kind, h, max_tokens, vocab_, p, stop_tokens, stop_strings);
        auto job = t->job;
        claim_or_queue(s, *t);
        submit_task(std::move(t));
        return job;
    });
}

std::pair<uint64_t, std::shared_ptr<Job>> Engine::prepare_rebase(uint64_t h, size_t keep_prefix,
                                                               const std::vector<llama_token> & replacement,
                                                               size_t keep_from, bool splice) {
    validate_tokens(replacement);
    return call([&] {
        SeqState & m = seq(h);
        if (keep_prefix > keep_from || keep_from > m.size()) {
            throw std::invalid_argument("rebase needs 0 <= keep_prefix <= keep_from <= len(sequence); got keep_prefix=" +
                                        std::to_string(keep_prefix) + ", keep_from=" + std::to_string(keep_from) +
                                        ", len=" + std::to_string(m.size()));
        }
        if (splice && !(can_shift_ && !recurrent_ && !hybrid_)) {
            throw UnsupportedOperationError("mode='splice' shifts KV positions, which this model's memory cannot do "
                                            "(M-RoPE, recurrent or hybrid model); use mode='exact'");
        }
        const size_t target = keep_prefix + replacement.size() + (m.size() - keep_from);
        if (target > n_ctx_) {
            throw ContextFullError("the rebased sequence would have " + std::to_string(target) + " tokens, more than n_ctx=" +
                                   std::to_string(n_ctx_) + "; keep fewer tokens or use a shorter replacement");
        }
        const bool share_prefix = !(recurrent_ || hybrid_);
        std::vector<llama_token> head;
        if (!share_prefix) head.assign(m.tokens.begin(), m.tokens.begin() + (long) keep_prefix);
        head.insert(head.end(), replacement.begin(), replacement.end());
        llama_seq_id sid = alloc_slot();
        uint64_t sh = new_handle();
        SeqState & m2 = seqs_.at(h);
        SeqState & s = seqs_[sh];
        s.handle = sh;
        s.sid = sid;
        s.internal = true;
        llama_memory_seq_rm(mem_, sid, -1, -1);
        if (share_prefix && keep_prefix > 0) {
            llama_memory_seq_cp(mem_, m2.sid, sid, 0, (llama_pos) keep_prefix);
            s.tokens.assign(m2.tokens.begin(), m2.tokens.begin() + (long) keep_prefix);
            s.cells.assign(m2.cells.begin(), m2.cells.begin() + (long) keep_prefix);
            ledger_.hold_all(s.cells);
        }
        auto t = std::make_unique<RebaseTask>(h, sh, keep_prefix, keep_from, std::move(head), splice, replacement.size());
        if (splice) t->main_consumed = m2.size();
        auto job = t->job;
        s.busy = t.get();
        submit_task(std::move(t));
        return std::make_pair(sh, job);
    });
}

size_t Engine::rebase_target_len(uint64_t id) {
    return call([&]() -> size_t {
        RebaseTask * r = find_rebase(id);
        if (!r) throw EngineError("this rebase is no longer pending (committed, cancelled or failed)");
        SeqState & m = seq(r->main_handle);
        return r->keep_prefix + r->replacement_len + (m.size() - r->keep_from);
    });
}

void Engine::cancel_rebase(uint64_t id) {
    call([&] {
        RebaseTask * r = find_rebase(id);
        if (!r) return;
        r->abort(*this, std::make_exception_ptr(CancelledError("rebase preparation was cancelled")),
                 "rebase preparation was cancelled");
    });
}

std::map<std::string, double> Engine::commit_rebase(uint64_t h, uint64_t id) {
    std::future<std::map<std::string, double>> fut = call([&] {
        RebaseTask * r = find_rebase(id);
        if (!r) throw EngineError("this rebase is no longer pending (committed, cancelled or failed); prepare it again");
        if (r->main_handle != h) throw std::invalid_argument("this rebase was prepared for another sequence");
        SeqState & m = seq(h);
        if (m.busy) throw SequenceBusyError("cannot commit a rebase while a job is running on the sequence; wait for it or cancel it");
        if (r->commit_requested) throw EngineError("a commit of this rebase is already in progress");
        if (r->splice) {
            for (size_t i = r->keep_from; i < m.size(); ++i) {
                if (ledger_.holders(m.cells[i]) > 1) {
                    throw UnsupportedOperationError("mode='splice' would shift KV cells that another live sequence (a fork) "
                                                    "shares with this one; close the forks first or use mode='exact'");
                }
            }
        }
        r->commit_requested = true;
        r->commit_started = std::chrono::steady_clock::now();
        r->kind = RowKind::Foreground;  // the caller is waiting now: catch up at full speed
        auto f = r->commit_promise.get_future();
        if (r->pending(*this) == 0) finish_rebase(*r);
        return f;
    });
    return fut.get();
}

void Engine::finish_rebase(RebaseTask & r) {
    SeqState & m = seq(r.main_handle);
    SeqState & sh = *find_seq(r.shadow_handle);
    std::map<std::string, double> info;
    info["tokens_before"] = (double) m.size();
    info["splice"] = r.splice ? 1.0 : 0.0;
    if (!r.splice) {
        // Exact: the shadow already holds the whole rebased sequence. Swap ids; free the old cells.
        llama_memory_seq_rm(mem_, m.sid, -1, -1);
        ledger_.release_range(m.cells, 0, m.cells.size());
        slot_used_[(size_t) m.sid] = false;
        m.sid = sh.sid;
        m.tokens = std::move(sh.tokens);
        m.cells = std::move(sh.cells);
        m.logits = std::move(sh.logits);
        m.logits_valid = sh.logits_valid;
        seqs_.erase(r.shadow_handle);
    } else {
        // Splice: drop [keep_prefix, keep_from), shift the tail, then move the replacement's cells in.
        const size_t kp = r.keep_prefix, kf = r.keep_from, R = r.replacement_len;
        const llama_pos delta = (llama_pos) (kp + R) - (llama_pos) kf;
        if (!llama_memory_seq_rm(mem_, m.sid, (llama_pos) kp, (llama_pos) kf))
            throw UnsupportedOperationError("this model's memory cannot remove a range of a sequence; use mode='exact'");
        if (delta != 0) llama_memory_seq_add(mem_, m.sid, (llama_pos) kf, -1, delta);
        if (R > 0) llama_memory_seq_cp(mem_, sh.sid, m.sid, (llama_pos) kp, (llama_pos) (kp + R));
        std::vector<llama_token> toks(m.tokens.begin(), m.tokens.begin() + (long) kp);
        std::vector<CellId> cells(m.cells.begin(), m.cells.begin() + (long) kp);
        toks.insert(toks.end(), sh.tokens.begin() + (long) kp, sh.tokens.end());
        cells.insert(cells.end(), sh.cells.begin() + (long) kp, sh.cells.end());
        for (size_t i = kp; i < sh.cells.size(); ++i) ledger_.hold(sh.cells[i]);
        ledger_.release_range(m.cells, kp, kf);
        toks.insert(toks.end(), m.tokens.begin() + (long) kf, m.tokens.end());
        cells.insert(cells.end(), m.cells.begin() + (long) kf, m.cells.end());
        m.tokens = std::move(toks);
        m.cells = std::move(cells);
        m.logits_valid = false;  // recomputed on demand against the spliced cache
        release_sequence(sh);
    }
    info["tokens_after"] = (double) m.size();
    info["catch_up_tokens"] = (double) r.catch_up_rows;
    info["stall_ms"] = ms_since(r.commit_started);
    stat_rebases_ += 1;
    stat_catch_up_rows_ += r.catch_up_rows;
    r.finished = true;
    r.job->set_ready(false);
    r.job->finish("committed");
    r.commit_promise.set_value(info);
    // Other preparations on this sequence were built from tokens it no longer has.
    for (auto & t : tasks_) {
        auto * o = dynamic_cast<RebaseTask *>(t.get());
        if (o && o != &r && !o->finished && o->main_handle == r.main_handle) {
            o->abort(*this, std::make_exception_ptr(EngineError("superseded: another rebase of this sequence was committed")),
                     "superseded: another rebase of this sequence was committed");
        }
    }
}

size_t Engine::used_cells() { return call([&] { return ledger_.used(); }); }

std::map<std::string, long> Engine::tokens_per_sequence() {
    return call([&] {
        std::map<std::string, long> m;
        for (auto & [h, s] : seqs_) if (!s.internal) m[std::to_string(h)] = (long) s.size();
        return m;
    });
}

std::map<std::string, double> Engine::stats() {
    return call([&] {
        std::map<std::string, double> m;
        m["decode_calls"] = (double) stat_decode_calls_;
        m["failed_decodes"] = (double) stat_failed_decodes_;
        m["mixed_batches"] = (double) stat_mixed_batches_;
        m["rows_foreground"] = (double) stat_rows_[0];
        m["rows_background"] = (double) stat_rows_[1];
        m["rows_probe"] = (double) stat_rows_[2];
        m["decode_ms"] = stat_decode_ms_;
        m["rebases"] = (double) stat_rebases_;
        m["catch_up_rows"] = (double) stat_catch_up_rows_;
        m["forks"] = (double) stat_forks_;
        m["used_cells"] = (double) ledger_.used();
        m["n_ctx"] = (double) n_ctx_;
        m["live_sequences"] = 0;
        for (auto & [h, s] : seqs_) if (!s.internal) m["live_sequences"] += 1;
        m["pending_tasks"] = (double) tasks_.size();
        return m;
    });
}

}  // namespace pkc
