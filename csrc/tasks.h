// Work that spans decode steps, run by the engine thread: prefill, probe, generation, rebase
// preparation. A task holds the sequences it works on (it is in their FIFO queues) and runs while it
// is at the front of every one of them.
#pragma once

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "job.h"
#include "kv_book.h"
#include "sampler.h"

namespace pkc {

struct Task {
    explicit Task(RowKind k) : kind(k), job(std::make_shared<Job>()) {}
    virtual ~Task() = default;

    RowKind kind;
    std::shared_ptr<Job> job;
    bool finished = false;
    std::vector<uint64_t> claims;  // sequences whose queues hold this task
    int step_rows = 0;             // rows added in the current step

    // At the front of every queue it is in (a closed sequence does not block: the task fails on it).
    bool runnable(KvBook & kv) const;
    // Somebody waits for it now: foreground work, or a background job with a caller blocked on it.
    bool urgent() const { return kind != RowKind::Background || job->waiters() > 0; }
    virtual bool single_row() const { return false; }
    virtual bool touches(uint64_t h) const;

    virtual bool has_work(KvBook & kv) = 0;
    // Adds at most `budget` rows to the batch; may end the task without adding any.
    virtual int add_rows(KvBook & kv, int budget) = 0;
    virtual void after_decode(KvBook & kv) = 0;
    // A failed decode is retried: the engine rolls the sequences back, the task rewinds its cursor.
    virtual void save_cursor() {}
    virtual void restore_cursor() {}

    void complete(KvBook & kv, const std::string & reason);
    // A cancelled task still waiting behind another one ends at once, without running.
    virtual void end_cancelled_while_queued(KvBook & kv) { complete(kv, "cancelled"); }
    void fail(KvBook & kv, std::exception_ptr err, const std::string & msg);

protected:
    virtual void on_complete(KvBook & kv) {}  // publish results, before the job says done
    virtual void on_fail(KvBook & kv, std::exception_ptr err) {}
    virtual void release(KvBook & kv) {}      // free what the task owns (a shadow, a probe fork)

private:
    void leave_queues(KvBook & kv);
};

// Appends tokens in chunks of at most the step's budget. Logits are kept for the last token (and
// for every row with all_logits, to score a multi-token label). With no tokens it makes the
// sequence's next-token logits available (re-decoding the last token after a truncate or a splice).
// Cancelled, it stops at the next step: the sequence keeps exactly the tokens decoded so far.
struct PrefillTask : Task {
    PrefillTask(RowKind kind, uint64_t h, std::vector<llama_token> toks, bool all_logits)
        : Task(kind), handle(h), tokens(std::move(toks)), all_logits(all_logits) { claims = {h}; }
    uint64_t handle;
    std::vector<llama_token> tokens;
    bool all_logits;
    // Recurrent and hybrid memories cannot re-decode a token later: keep each chunk's last logits
    // there, so a cancelled or interrupted prefill leaves a sequence that can still generate.
    bool logits_every_chunk = false;
    CellPromise promise;   // foreground only: cells no background work may take from this append
    size_t offset = 0, offset_at_step = 0;
    std::vector<float> collected;
    std::vector<int> logit_rows;
    int last_row = -1;

    bool has_work(KvBook & kv) override { return !finished; }
    int add_rows(KvBook & kv, int budget) override;
    void after_decode(KvBook & kv) override;
    void save_cursor() override { offset_at_step = offset; promise.step = 0; logit_rows.clear(); last_row = -1; }
    void restore_cursor() override { offset = offset_at_step; promise.step = 0; logit_rows.clear(); last_row = -1; }

protected:
    void on_complete(KvBook & kv) override;
    void release(KvBook & kv) override { promise.drop(kv); }
};

// A probe: prefill tokens on a private fork, read the log-probabilities of the labels' first
// tokens after them, drop the fork. The probed sequence is never touched.
struct ProbeTask : PrefillTask {
    ProbeTask(uint64_t fork_h, std::vector<llama_token> toks, std::vector<llama_token> labels)
        : PrefillTask(RowKind::Probe, fork_h, std::move(toks), false), label_tokens(std::move(labels)) {}
    std::vector<llama_token> label_tokens;

protected:
    void on_complete(KvBook & kv) override;
    void release(KvBook & kv) override;
};

// Samples and decodes one token per step until max_tokens, an end-of-generation token, a stop token or
// stop string, cancellation, or a full context. EOG tokens are neither returned nor decoded.
struct GenerateTask : Task {
    GenerateTask(RowKind kind, uint64_t h, int max_tokens, const llama_vocab * vocab, const SamplingParams & sp,
                 std::vector<llama_token> stop_tokens, std::vector<std::string> stop_strings)
        : Task(kind), handle(h), max_tokens(max_tokens), sampler(vocab, sp),
          stop_tokens(std::move(stop_tokens)), stop_strings(std::move(stop_strings)) { claims = {h}; }
    uint64_t handle;
    int max_tokens;
    Sampler sampler;
    std::vector<llama_token> stop_tokens;
    std::vector<std::string> stop_strings;
    std::string text;
    int generated = 0;
    llama_token sampled_token = -1;  // the token in this step's batch (-1: re-decoding the last one)
    // The token sampled for a step that was rolled back (a failed or aborted decode): sampled again,
    // a seeded sampler would draw from a state that has moved on, so the same seed gave other tokens.
    llama_token retry_token = -1;
    int row = -1;
    CellPromise promise;     // foreground only: the cells this reply may write, kept from background work

    bool single_row() const override { return true; }
    bool has_work(KvBook & kv) override { return !finished; }
    int add_rows(KvBook & kv, int budget) override;
    void after_decode(KvBook & kv) override;
    void save_cursor() override { promise.step = 0; }
    void restore_cursor() override {
        if (sampled_token >= 0) retry_token = sampled_token;
        sampled_token = -1;
        row = -1;
        promise.step = 0;
    }
    void release(KvBook & kv) override { promise.drop(kv); }

private:
    bool hit_stop_string(KvBook & kv, llama_token t);
    bool fits_promised(KvBook & kv, const SeqState & s, size_t n) const;   // within the free cells and this reply's
};

// Builds, on a shadow sequence, tokens[:keep_prefix] + replacement + tokens[keep_from:] of the main
// sequence, and keeps it caught up as the main sequence grows (exact mode). In splice mode the shadow
// only holds the prefix and the replacement, and the commit moves them into the main sequence.
// From the commit request to the swap the task also holds the main sequence, so nothing else runs
// on it (foreground calls raise SequenceBusyError; background jobs queue behind the swap).
struct RebaseTask : Task {
    RebaseTask(uint64_t main_h, uint64_t shadow_h, size_t keep_prefix, size_t keep_from,
               std::vector<llama_token> fed_first, bool splice, size_t replacement_len, uint64_t main_epoch)
        : Task(RowKind::Background), main_handle(main_h), shadow_handle(shadow_h), keep_prefix(keep_prefix),
          keep_from(keep_from), fed_first(std::move(fed_first)), splice(splice), replacement_len(replacement_len),
          main_epoch(main_epoch), main_fed(keep_from) { claims = {shadow_h}; }
    uint64_t main_handle, shadow_handle;
    size_t keep_prefix, keep_from;
    // Tokens fed before the main sequence's tail: the replacement (and the prefix too when its
    // cells cannot be shared, on recurrent memories).
    std::vector<llama_token> fed_first;
    bool splice;
    size_t replacement_len;
    uint64_t main_epoch;              // the main sequence's rebase count when this was prepared
    size_t fed_first_done = 0, fed_first_at_step = 0;
    size_t main_fed, main_fed_at_step = 0;  // next index of the main sequence's tokens to feed
    bool ready = false;
    int logits_row = -1;
    // Recurrent and hybrid memories cannot re-decode a token later: keep the logits of every
    // catch-up chunk there. Elsewhere only the chunk a commit waits for asks for them.
    bool logits_every_chunk = false;

    bool committing = false;
    std::chrono::steady_clock::time_point commit_started;
    long catch_up_rows = 0;
    size_t reused = 0;   // replacement tokens found already in place and shared (Engine::prepare_rebase)
    std::promise<std::map<std::string, double>> commit_promise;

    size_t rows_to_catch_up(KvBook & kv);
    bool touches(uint64_t h) const override { return h == main_handle || h == shadow_handle; }
    bool has_work(KvBook & kv) override;
    int add_rows(KvBook & kv, int budget) override;
    void after_decode(KvBook & kv) override;
    void save_cursor() override { fed_first_at_step = fed_first_done; main_fed_at_step = main_fed; logits_row = -1; }
    void restore_cursor() override { fed_first_done = fed_first_at_step; main_fed = main_fed_at_step; logits_row = -1; }
    // Starts holding the main sequence; swaps at once when caught up. Throws if it cannot commit.
    void request_commit(KvBook & kv);
    // The main sequence was truncated to n tokens.
    void on_main_truncated(KvBook & kv, size_t n);
    bool superseded(KvBook & kv);
    void end_cancelled_while_queued(KvBook & kv) override {
        fail(kv, std::make_exception_ptr(CancelledError("rebase preparation was cancelled")), "rebase preparation was cancelled");
    }

protected:
    void on_fail(KvBook & kv, std::exception_ptr err) override;
    void release(KvBook & kv) override;

private:
    void update_ready(KvBook & kv);
    void swap(KvBook & kv);   // the O(1) exchange (exact) or the shift (splice)
    void splice_into(KvBook & kv, SeqState & m, SeqState & sh);
    void check_splice_allowed(KvBook & kv, SeqState & m) const;
};

}  // namespace pkc
