// A Job is the handle a Python caller holds on work the engine thread does for it: a prefill, a
// generation, a rebase preparation. The engine thread publishes progress (tokens) and the outcome;
// callers wait on it with the GIL released. Everything here is guarded by one mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "llama.h"

namespace pkc {

class Job {
public:
    // Called by the engine thread.
    void push_token(llama_token t) {
        { std::lock_guard<std::mutex> lk(mu_); tokens_.push_back(t); }
        cv_.notify_all();
    }
    void finish(const std::string & reason) {
        { std::lock_guard<std::mutex> lk(mu_); if (done_) return; done_ = true; finish_reason_ = reason; }
        cv_.notify_all();
    }
    void fail(std::exception_ptr err, const std::string & message) {
        { std::lock_guard<std::mutex> lk(mu_); if (done_) return; done_ = true; finish_reason_ = "error";
          error_ = err; error_message_ = message; }
        cv_.notify_all();
    }
    // "Ready" is a level, not an event: a rebase preparation is ready while it is caught up with its
    // sequence, and stops being ready when the sequence grows again.
    void set_ready(bool r) {
        { std::lock_guard<std::mutex> lk(mu_); ready_ = r; }
        cv_.notify_all();
    }
    bool ready() const { std::lock_guard<std::mutex> lk(mu_); return ready_; }
    bool wait_ready(double timeout_s) const {
        std::unique_lock<std::mutex> lk(mu_);
        auto ok = [&] { return ready_ || done_; };
        if (timeout_s < 0) { cv_.wait(lk, ok); return ready_; }
        cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ok);
        return ready_;
    }
    void set_rows(std::vector<float> rows) { std::lock_guard<std::mutex> lk(mu_); rows_ = std::move(rows); }
    void add_stat(int rows, bool mixed) { rows_decoded_ += rows; if (mixed) mixed_steps_ += 1; }

    // Called by any thread.
    void request_cancel() { cancel_.store(true); }
    bool cancel_requested() const { return cancel_.load(); }

    bool done() const { std::lock_guard<std::mutex> lk(mu_); return done_; }
    // Waits up to timeout_s (negative: forever). Returns true if the job is done.
    bool wait(double timeout_s) const {
        std::unique_lock<std::mutex> lk(mu_);
        if (timeout_s < 0) { cv_.wait(lk, [&] { return done_; }); return true; }
        return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_; });
    }
    // Waits until more than `have` tokens exist or the job is done; returns the current count.
    size_t wait_tokens(size_t have, double timeout_s) const {
        std::unique_lock<std::mutex> lk(mu_);
        auto ready = [&] { return done_ || tokens_.size() > have; };
        if (timeout_s < 0) cv_.wait(lk, ready);
        else cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready);
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
    std::vector<float> rows() const { std::lock_guard<std::mutex> lk(mu_); return rows_; }
    long rows_decoded() const { return rows_decoded_.load(); }
    long mixed_steps() const { return mixed_steps_.load(); }

private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::vector<llama_token> tokens_;
    std::vector<float> rows_;
    bool done_ = false;
    bool ready_ = false;
    std::string finish_reason_;
    std::exception_ptr error_;
    std::string error_message_;
    std::atomic<bool> cancel_{false};
    std::atomic<long> rows_decoded_{0};
    std::atomic<long> mixed_steps_{0};
};

}  // namespace pkc
