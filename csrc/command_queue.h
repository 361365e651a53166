// The engine thread's inbox: commands to run between two decode steps, and wake-ups. Jobs hold a
// weak reference to it so that Job.cancel() can wake an idle engine, even after the engine is gone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

namespace pkc {

class CommandQueue {
public:
    using Command = std::function<void()>;

    // False (and the command is dropped) once the queue is stopped. `urgent`: the command brings
    // foreground work, which may cut short a background-only decode in progress (Engine::step).
    bool push(Command c, bool urgent = false) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stopped_) return false;
            cmds_.push_back(std::move(c));
            pending_.store((int) cmds_.size());
            if (urgent) urgent_.store(true);
        }
        cv_.notify_one();
        return true;
    }
    void wake() {
        { std::lock_guard<std::mutex> lk(mu_); woken_ = true; }
        cv_.notify_one();
    }
    void stop() {
        { std::lock_guard<std::mutex> lk(mu_); stopped_ = true; }
        cv_.notify_all();
    }
    // Takes every queued command; with block=true waits until there is one, a wake-up or a stop.
    std::vector<Command> take(bool block, bool & stopped) {
        std::unique_lock<std::mutex> lk(mu_);
        if (block) cv_.wait(lk, [&] { return !cmds_.empty() || woken_ || stopped_; });
        woken_ = false;
        stopped = stopped_;
        std::vector<Command> out;
        out.swap(cmds_);
        pending_.store(0);
        urgent_.store(false);
        return out;
    }
    bool has_pending() const { return pending_.load() > 0; }
    bool has_urgent() const { return urgent_.load(); }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Command> cmds_;
    std::atomic<int> pending_{0};
    std::atomic<bool> urgent_{false};
    bool woken_ = false;
    bool stopped_ = false;
};

}  // namespace pkc
