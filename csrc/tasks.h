// The three kinds of multi-step work the engine thread runs: prefill, generation, rebase preparation.
#pragma once

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "sampler.h"

namespace pkc {

// Appends tokens to a sequence in chunks of at most the step's budget. Logits are kept for the last
// token (and for every row when all_logits is set, e.g. to score a multi-token label).
// With refresh=true it recomputes the next-token logits of the last token (after a truncate).
struct PrefillTask : Task {
    PrefillTask(RowKind kind, uint64_t h, std::vector<llama_token> toks, bool all_logits, bool refresh)
        : Task(kind), handle(h), tokens(std::move(toks)), all_logits(all_logits), refresh(refresh) {}
    uint64_t handle;
    std::vector<llama_token> tokens;
    bool all_logits, refresh;
    size_t offset = 0;
    bool started = false;
    std::vector<float> collected;
    std::vector<int> logit_rows;

    bool has_work(Engine & e) override { return !finished; }
    int add_rows(Engine & e, int budget) override;
    void after_decode(Engine & e) override;
    void abort(Engine & e, std::exception_ptr err, const std::string & msg) override;
    bool touches(uint64_t h) const override { return h == handle; }
    void end(Engine & e);
};

// Samples and decodes one token per step until max_tokens, an end-of-generation token, a stop token or
// stop string, cancellation, or a full context. EOG tokens are neither returned nor decoded.
struct GenerateTask : Task {
    GenerateTask(RowKind kind, uint64_t h, int max_tokens, const llama_vocab * vocab, const SamplingParams & sp,
                 std::vector<llama_token> stop_tokens, std::vector<std::string> stop_strings)
        : Task(kind), handle(h), max_tokens(max_tokens), sampler(vocab, sp),
          stop_tokens(std::move(stop_tokens)), stop_strings(std::move(stop_strings)) {}
    uint64_t handle;
    int max_tokens;
    Sampler sampler;
    std::vector<llama_token> stop_tokens;
    std::vector<std::string> stop_strings;
    std::string text;
    int generated = 0;
    llama_token pending = -1;
    bool redecoding = false;

    bool has_work(Engine & e) override { return !finished; }
    int add_rows(Engine & e, int budget) override;
    void after_decode(Engine & e) override;
    void abort(Engine & e, std::exception_ptr err, const std::string & msg) override;
    bool touches(uint64_t h) const override { return h == handle; }
    void end(Engine & e, const std::string & reason);
};

// Builds, on a shadow sequence, tokens[:keep_prefix] + replacement + tokens[keep_from:] of the main
// sequence, and keeps it caught up as the main sequence grows (exact mode). In splice mode the shadow
// only holds the prefix and the replacement, and the commit moves them into the main sequence.
struct RebaseTask : Task {
    RebaseTask(uint64_t main_h, uint64_t shadow_h, size_t keep_prefix, size_t keep_from,
               std::vector<llama_token> head, bool splice, size_t replacement_len)
        : Task(RowKind::Background), main_handle(main_h), shadow_handle(shadow_h), keep_prefix(keep_prefix),
          keep_from(keep_from), head(std::move(head)), splice(splice), replacement_len(replacement_len),
          main_consumed(keep_from) {}
    uint64_t main_handle, shadow_handle;
    size_t keep_prefix, keep_from;
    std::vector<llama_token> head;  // tokens fed before the main sequence's tail (replacement, and the
                                    // prefix too when cells cannot be shared)
    bool splice;
    size_t replacement_len;
    size_t head_offset = 0;
    size_t main_consumed;           // next index of the main sequence's tokens to feed (exact mode)
    bool ready_flag = false;
    int logits_row = -1;

    bool commit_requested = false;
    std::chrono::steady_clock::time_point commit_started;
    long catch_up_rows = 0;
    std::promise<std::map<std::string, double>> commit_promise;

    size_t pending(Engine & e);
    bool has_work(Engine & e) override;
    int add_rows(Engine & e, int budget) override;
    void after_decode(Engine & e) override;
    void abort(Engine & e, std::exception_ptr err, const std::string & msg) override;
    bool touches(uint64_t h) const override { return h == main_handle || h == shadow_handle; }
    void update_ready(Engine & e);
    // The main sequence was truncated to n tokens.
    void on_main_truncated(Engine & e, size_t n);
};

}  // namespace pkc
