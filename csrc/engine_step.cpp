// The engine thread's loop: run commands, then one decode step, until closed.
//
// A step claims nothing by itself: each sequence's FIFO says which task runs on it. It builds one
// batch (generation rows first, then prefill chunks round-robin, then background rows within their
// cap and their share of time), decodes it, and dispatches the results. A failed decode is rolled back and retried without
// background rows, then with half the batch, as llama.cpp's server does; only the task that cannot
// fit fails. The step reports *progress* (a decode, or a task that started or ended), so a queued
// task behind one that ended without decoding is picked up at once.
#include <algorithm>
#include <chrono>

#include "engine.h"
#include "tasks.h"

namespace pkc {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

bool Engine::abort_check(void * engine) { return static_cast<Engine *>(engine)->aborting(); }

void Engine::loop() {
    bool progress = false;
    while (true) {
        bool stopped = false;
        auto cmds = inbox_->take(!progress, stopped);
        for (auto & c : cmds) c();  // packaged tasks: they report their own exceptions
        if (stopped) break;
        progress = step() || !cmds.empty();
    }
    // Closing: end every task so no waiter hangs.
    auto err = std::make_exception_ptr(EngineClosedError("the engine was closed"));
    for (auto & t : tasks_) t->fail(*kv_, err, "the engine was closed");
    tasks_.clear();
    bool stopped = false;
    for (auto & c : inbox_->take(false, stopped)) c();  // commands that raced with the stop
}

bool Engine::step() {
    if (tasks_.empty()) return false;
    bool progress = end_cancelled_queued_tasks();
    int budget = (int) opts_.n_batch;
    bool allow_background = true;
    while (true) {
        int urgent_rows = 0;
        std::vector<Task *> active = build_batch(budget, allow_background, progress, urgent_rows);
        const int rows = kv_->rows();
        if (rows == 0) break;
        const bool mixed = kv_->has_kind(RowKind::Background) && kv_->count_kind(RowKind::Background) < rows;
        EngineCounters & c = kv_->counters();
        auto t0 = std::chrono::steady_clock::now();
        std::string failure;
        int rc = 0;
        // Only background rows: foreground work submitted meanwhile cuts the decode short (its rows
        // are rolled back and decoded again later). Not on recurrent state, which cannot roll back.
        const bool background_only = urgent_rows == 0;
        // Nor while a K shift is pending: llama.cpp applies it in place at the start of this decode, and a
        // shift cut short would be applied again (rotated twice). Nor with rows of work on a deadline.
        const bool abortable = background_only && rows > (int) opts_.background_chunk_busy && !recurrent_state() &&
                               !deadline_rows_in_step_ && !kv_->shift_pending();
        // The callback is installed for such decodes only: ggml calls it after every graph node.
        abortable_.store(abortable);
        if (abortable) llama_set_abort_callback(ctx_, &Engine::abort_check, this);
        t_decoding = this;
        try {
            rc = kv_->decode();
        } catch (const std::exception & ex) {  // never let an exception end the engine thread
            rc = -100;
            failure = ex.what();
        }
        t_decoding = nullptr;
        if (abortable) llama_set_abort_callback(ctx_, nullptr, nullptr);
        abortable_.store(false);
        const double step_ms = ms_since(t0);
        c.decode_ms += step_ms;
        c.decode_calls += 1;
        if (rc == 0) {
            share_.record(step_ms, urgent_rows, rows > urgent_rows);
            if (background_only)
                background_only_rows_ = std::min((int) opts_.background_chunk, background_only_rows_ + (int) opts_.background_chunk_busy);
            for (int k = 0; k < kRowKinds; ++k) c.rows[k] += kv_->count_kind((RowKind) k);
            if (mixed) c.mixed_batches += 1;
            for (Task * t : active) t->job->add_stat(t->step_rows, mixed);
            dispatch(active);
            progress = true;
            break;
        }
        kv_->rollback();
        for (Task * t : active) t->restore_cursor();
        if (rc == 2 && abortable) {  // aborted for foreground work: not a failure, nothing to retry
            c.aborted_decodes += 1;
            c.aborted_ms += step_ms;
            background_only_rows_ = std::max((int) opts_.background_chunk_busy, background_only_rows_ / 2);
            progress = true;
            break;
        }
        c.failed_decodes += 1;
        // Retry without background rows, then with half the batch (rc 1 is "no KV slot for the
        // batch"; other codes are retried the same way so that one task never fails another).
        if (mixed && allow_background) { allow_background = false; continue; }
        if (rows > 1 && active.size() > 1) { budget = std::max(1, rows / 2); continue; }
        if (rc == 1 && rows > 1) { budget = std::max(1, rows / 2); continue; }
        const std::string msg = rc == 1 ? "llama_decode found no free KV slot (n_ctx=" + std::to_string(n_ctx_) +
                                              "); close sequences or use a larger n_ctx"
                                        : "llama_decode failed with code " + std::to_string(rc) +
                                              (failure.empty() ? "" : ": " + failure);
        auto err = rc == 1 ? std::make_exception_ptr(ContextFullError(msg)) : std::make_exception_ptr(EngineError(msg));
        for (Task * t : active) t->fail(*kv_, err, msg);  // with rc 1 this is the one task left
        progress = true;
        break;
    }
    reap_finished();
    return progress;
}

bool Engine::end_cancelled_queued_tasks() {
    bool any = false;
    for (auto & t : tasks_) {
        if (!t->finished && t->job->cancel_requested() && !t->runnable(*kv_)) {
            t->end_cancelled_while_queued(*kv_);
            any = true;
        }
    }
    return any;
}

std::vector<Task *> Engine::build_batch(int budget, bool allow_background, bool & progress, int & urgent_rows) {
    kv_->begin_batch();
    // Urgent work is grouped first; background work after it has added its rows, so that a rebase
    // shadow sees the tokens its main sequence takes in this very step and catches up with them.
    auto group = [&](bool urgent_pass, std::vector<Task *> & single, std::vector<Task *> & multi) {
        for (auto & up : tasks_) {
            Task * t = up.get();
            if (t->finished || t->step_rows > 0 || t->urgent() != urgent_pass) continue;
            if (!t->runnable(*kv_) || !t->has_work(*kv_)) continue;
            (t->single_row() ? single : multi).push_back(t);
        }
        // Prefill chunks take turns at the front, so no long prefill starves another one.
        if (multi.size() > 1) std::rotate(multi.begin(), multi.begin() + (long) (round_robin_ % multi.size()), multi.end());
    };
    round_robin_ += 1;
    deadline_rows_in_step_ = false;
    for (auto & up : tasks_) up->step_rows = 0;
    std::vector<Task *> single_urgent, multi_urgent, single_bg, multi_bg;
    group(true, single_urgent, multi_urgent);
    std::vector<Task *> active;
    // Next to urgent rows, background work that is not on a deadline waits for its share of time.
    bool share_deferred = false;
    auto offer = [&](const std::vector<Task *> & candidates, int & cap) {
        for (Task * t : candidates) {
            if (budget <= 0) break;
            // a background job on a deadline takes its own rows per step beyond the shared chunk
            const int own = t->urgent() ? 0 : t->job->rows_per_step();
            if (const SeqState * lost = kv_->lost_claim(*t)) {
                const std::string msg = lost_state_msg(lost->handle);
                t->fail(*kv_, std::make_exception_ptr(EngineError(msg)), msg);
                progress = true;
                continue;
            }
            const bool waits = !t->urgent() && own == 0 && urgent_rows > 0 && !share_.may_join();
            if (waits) { share_deferred = true; continue; }
            const int allowed = std::max(cap, own);
            if (allowed <= 0) continue;
            t->save_cursor();
            int n = 0;
            try {
                n = t->add_rows(*kv_, std::min(allowed, budget));
            } catch (const std::exception & ex) {
                t->fail(*kv_, std::current_exception(), ex.what());
            }
            if (t->finished) progress = true;
            if (n > 0) { t->step_rows = n; active.push_back(t); cap -= std::min(cap, n); budget -= n; }
            if (n > 0 && own > 0) deadline_rows_in_step_ = true;
        }
    };
    int urgent_cap = budget;
    offer(single_urgent, urgent_cap);
    offer(multi_urgent, urgent_cap);
    urgent_rows = kv_->rows();
    if (allow_background) {
        group(false, single_bg, multi_bg);
        // Next to urgent rows, or while commands wait to run, background work takes a small chunk.
        const bool busy = kv_->rows() > 0 || inbox_->has_pending();
        int bg_cap = busy ? (int) opts_.background_chunk_busy : background_only_rows_;
        offer(single_bg, bg_cap);
        offer(multi_bg, bg_cap);
    }
    if (share_deferred) share_.note_deferred();
    return active;
}

void Engine::dispatch(const std::vector<Task *> & active) {
    for (Task * t : active) {
        if (t->finished) continue;
        try {
            t->after_decode(*kv_);
        } catch (const std::exception & ex) {
            t->fail(*kv_, std::current_exception(), ex.what());
        }
    }
}

void Engine::reap_finished() {
    tasks_.erase(std::remove_if(tasks_.begin(), tasks_.end(), [](const std::unique_ptr<Task> & t) { return t->finished; }),
                 tasks_.end());
}

}  // namespace pkc
