// The share of the engine's time that background rows may take next to foreground (urgent) work.
//
// Time, not rows: on a compute-bound CPU a step with one background row beside one foreground row
// costs ~1.8x a foreground-only step, so no cap on rows per step can give background work less than
// about half of the time. Instead each step that carries foreground rows earns `share` times its
// foreground cost as credit, and a step that also carries background rows spends what it took beyond
// that cost. Background rows join a foreground step only while the credit is positive, so the
// foreground runs at about 1 / (1 + share) of its solo speed whatever the background work is.
//
// Steps without foreground rows are not accounted (nobody waits for a token then). Work on a deadline
// (Job::rows_per_step) joins regardless of the credit but still spends it. A share >= 1 disables the
// accounting: background rows join every step (on a GPU extra rows are nearly free).
#pragma once

#include <algorithm>
#include <map>

namespace pkc {

class BackgroundShare {
public:
    explicit BackgroundShare(double share) : share_(share) {}

    double share() const { return share_; }
    bool unlimited() const { return share_ >= 1.0; }
    // May background rows (not on a deadline) join a step that carries foreground rows?
    bool may_join() const { return unlimited() || credit_ms_ > 0.0; }
    long deferred_steps() const { return deferred_; }
    void note_deferred() { deferred_ += 1; }

    // After a successful decode of `step_ms` milliseconds with `foreground_rows` urgent rows.
    void record(double step_ms, int foreground_rows, bool background) {
        if (foreground_rows <= 0 || unlimited()) return;
        double & solo = solo_ms_[bucket(foreground_rows)];
        if (!background) solo = solo <= 0.0 ? step_ms : (1.0 - kAlpha) * solo + kAlpha * step_ms;
        // A mixed step's foreground part is what a foreground-only step of as many rows costs now (half
        // the step when none was measured yet: the first mixed step then pays for itself at most twice).
        const double fg = !background ? step_ms : solo > 0.0 ? std::min(step_ms, solo) : step_ms * 0.5;
        credit_ms_ += share_ * fg;
        if (background) credit_ms_ -= step_ms - fg;
        // No hoarding: a long foreground-only stretch does not buy a burst of mixed steps later.
        credit_ms_ = std::min(credit_ms_, kMaxCreditSteps * share_ * fg);
    }

private:
    // Foreground-only steps are compared by rows: a decode row costs far less than a prefill chunk.
    static int bucket(int rows) {
        int b = 1;
        while (b < rows && b < (1 << 20)) b *= 2;
        return b;
    }
    static constexpr double kAlpha = 0.2;           // weight of the newest solo step in the running mean
    static constexpr double kMaxCreditSteps = 2.0;  // credit is capped at two steps' earnings
    double share_;
    std::map<int, double> solo_ms_;  // running mean of foreground-only steps, by bucket of rows
    double credit_ms_ = 0.0;
    long deferred_ = 0;       // steps background rows sat out for lack of credit
};

}  // namespace pkc
