// A Job is the handle a Python caller holds on work the engine thread does for it: a prefill, a
// generation, a probe, a rebase preparation. The engine thread publishes progress (tokens) and the
// outcome; callers wait on it with the GIL released. Everything here is guarded by one mutex.
//
// A caller blocked in wait*() counts as a *waiter*: the engine gives a background job with waiters
// the full batch, since somebody is now waiting for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "command_queue.h"
#include "llama.h"

namespace pkc {

class Job {
public:
    // ---- engine thread
    void push_tokens(const llama_token * t, size_t n) {
        if (n == 0) return;
        { std::lock_guard<std::mutex> lk(mu_); tokens_.insert(tokens_.end(), t, t + n); }
        cv_.notify_all();
    }
    void push_token(llama_token t) { push_tokens(&t, 1); }
    void finish(const std::string & reason) {
        { std::lock_guard<std::mutex> lk(mu_); if (done_) return; done_ = true; ready_ = false; finish_reason_ = reason; }
        cv_.notify_all();
    }
    void fail(std::exception_ptr err, const std::string & message) {
        { std::lock_guard<std::mutex> lk(mu_); if (done_) return; done_ = true; ready_ = false; finish_reason_ = "error";
          error_ = err; error_message_ = message; }
        cv_.notify_all();
    }
    // "Ready" is a level, not an event: a rebase preparation is ready while it is caught up with its
    // sequence, and stops being ready when the sequence grows again.
    void set_ready(bool r) {
        { std::lock_guard<std::mutex> lk(mu_); ready_ = r; }
        cv_.notify_all();
    }
    void set_values(std::vector<float> v, int cols) { std::lock_guard<std::mutex> lk(mu_); values_ = std::move(v); cols_ = cols; }
    void add_stat(int rows, bool mixed) { rows_decoded_ += rows; if (mixed) mixed_steps_ += 1; }
    void set_waker(std::weak_ptr<CommandQueue> q) { waker_ = std::move(q); }
    int waiters() const { return waiters_.load(); }

    // ---- any thread
    void request_cancel() {
        cancel_.store(true);
        if (auto q = waker_.lock()) q->wake();  // an idle engine looks at its tasks again
    }
    bool cancel_requested() const { return cancel_.load(); }
    // Background work on a deadline: rows this background job may take per step even next to urgent
    // rows (0: the engine's small default chunk). The caller sizes it from its deadline.
    void set_rows_per_step(int n) {
        if (n < 0) throw std::invalid_argument("rows_per_step must be >= 0");
        rows_per_step_.store(n);
        if (auto q = waker_.lock()) q->wake();
    }
    int rows_per_step() const { return rows_per_step_.load(); }
    bool done() const { std::lock_guard<std::mutex> lk(mu_); return done_; }
    bool ready() const { std::lock_guard<std::mutex> lk(mu_); return ready_; }

    // Waits up to timeout_s (negative: forever). True if the job is done.
    bool wait(double timeout_s) const {
        return wait_until([&] { return done_; }, timeout_s);
    }
    bool wait_ready(double timeout_s) const {
        wait_until([&] { return ready_ || done_; }, timeout_s);
        std::lock_guard<std::mutex> lk(mu_);
        return ready_;
    }
    // Waits until more than `have` tokens exist or the job is done; returns the current count.
    size_t wait_tokens(size_t have, double timeout_s) const {
        wait_until([&] { return done_ || tokens_.size() > have; }, timeout_s);
        std::lock_guard<std::mutex> lk(mu_);
        return tokens_.size();
    }
    std::vector<llama_token> tokens() const { std::lock_guard<std::mutex> lk(mu_); return tokens_; }
    std::vector<llama_token> tokens_from(size_t start) const {
        std::lock_guard<std::mutex> lk(mu_);
        if (start >= tokens_.size()) return {};
        return std::vector<llama_token>(tokens_.begin() + (long) start, tokens_.end());
    }
    std::string finish_reason() const { std::lock_guard<std::mutex> lk(mu_); return finish_reason_; }
    std::string error_message() const { std::lock_guard<std::mutex> lk(mu_); return error_message_; }
    std::exception_ptr error() const { std::lock_guard<std::mutex> lk(mu_); return error_; }
    std::vector<float> values() const { std::lock_guard<std::mutex> lk(mu_); return values_; }
    int value_cols() const { std::lock_guard<std::mutex> lk(mu_); return cols_; }
    long rows_decoded() const { return rows_decoded_.load(); }
    long mixed_steps() const { return mixed_steps_.load(); }

private:
    template <class Pred> bool wait_until(Pred pred, double timeout_s) const {
        if (std::isnan(timeout_s)) throw std::invalid_argument("timeout must be a number of seconds (negative: forever), got NaN");
        struct Waiting {  // counted while blocked, so the engine knows somebody waits
            std::atomic<int> & n;
            explicit Waiting(std::atomic<int> & c) : n(c) { n += 1; }
            ~Waiting() { n -= 1; }
        } waiting(waiters_);
        std::unique_lock<std::mutex> lk(mu_);
        if (timeout_s < 0 || std::isinf(timeout_s)) { cv_.wait(lk, pred); return true; }
        return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), pred);
    }

    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    mutable std::atomic<int> waiters_{0};
    std::vector<llama_token> tokens_;
    std::vector<float> values_;
    int cols_ = 0;
    bool done_ = false;
    bool ready_ = false;
    std::string finish_reason_;
    std::exception_ptr error_;
    std::string error_message_;
    std::atomic<bool> cancel_{false};
    std::atomic<int> rows_per_step_{0};
    std::atomic<long> rows_decoded_{0};
    std::atomic<long> mixed_steps_{0};
    std::weak_ptr<CommandQueue> waker_;
};

}  // namespace pkc
