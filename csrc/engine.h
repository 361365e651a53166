// The engine: one llama_context, one thread that owns it, several KV sequences.
//
// Every llama call on the context happens on the engine thread. Callers submit commands (run between
// two decodes, "between two tokens") and tasks (work that spans decode steps: prefill, generation,
// rebase preparation). Each step is one llama_decode whose batch holds foreground rows first, then a
// bounded chunk of background rows: at most `background_chunk_busy` while foreground work is in the
// batch (on a CPU every extra row costs, so a foreground token is delayed by only a few rows), and
// up to `background_chunk` when the foreground is idle.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cell_ledger.h"
#include "errors.h"
#include "job.h"
#include "llama.h"
#include "sampler.h"
#include "sequence.h"

namespace pkc {

enum class RowKind : int { Foreground = 0, Background = 1, Probe = 2 };

struct EngineOptions {
    std::string model_path;
    uint32_t n_ctx = 4096;
    uint32_t n_seq_max = 8;
    int n_threads = 0;           // 0: caller decides (Python passes the physical core count)
    uint32_t n_batch = 512;
    uint32_t background_chunk = 64;
    uint32_t background_chunk_busy = 8;
    uint32_t seed = 0;
    bool use_extra_bufts = false;  // ggml AMX repacking: SIGILL on some CPUs, see DESIGN.md
    int n_gpu_layers = 0;
    int flash_attn = -1;           // -1 auto, 0 off, 1 on
    bool verbose = false;
};

class Engine;

// Work that spans decode steps. Lives on the engine thread only.
struct Task {
    explicit Task(RowKind k) : kind(k), job(std::make_shared<Job>()) {}
    virtual ~Task() = default;
    RowKind kind;
    std::shared_ptr<Job> job;
    bool finished = false;
    uint64_t waiting_on = 0;  // a queued background task: the sequence it waits to have to itself
    std::vector<int> rows;  // batch rows this task added in the current step

    virtual bool has_work(Engine & e) = 0;
    // Adds at most `budget` rows to the batch; may finish the task without adding any.
    virtual int add_rows(Engine & e, int budget) = 0;
    virtual void after_decode(Engine & e) = 0;
    // Ends the task with an error; releases whatever it holds. The sequences it touched in the
    // failed step were already rolled back by the engine.
    virtual void abort(Engine & e, std::exception_ptr err, const std::string & msg) = 0;
    // True if the task reads or writes this sequence handle (closing it must end the task).
    virtual bool touches(uint64_t handle) const = 0;
};

struct RebaseTask;

class Engine {
public:
    explicit Engine(const EngineOptions & opts);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;
    void shutdown();

    // ---- thread-safe, callable from any thread (they run commands on the engine thread) ----
    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<llama_token> & tokens, bool special) const;
    std::string token_to_piece(llama_token t, bool special) const;
    int n_vocab() const { return n_vocab_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_seq_max() const { return opts_.n_seq_max; }
    const llama_vocab * vocab() const { return vocab_; }
    const llama_model * model() const { return model_; }
    bool can_shift() const { return can_shift_; }
    bool recurrent_state() const { return recurrent_ || hybrid_; }
    std::map<std::string, std::string> capabilities_strings() const;
    void validate_tokens(const std::vector<llama_token> & tokens) const;

    uint64_t seq_create();
    std::shared_ptr<Job> seq_append(uint64_t h, const std::vector<llama_token> & tokens, RowKind kind, bool all_logits);
    std::vector<float> seq_logits(uint64_t h);
    std::vector<llama_token> seq_tokens(uint64_t h);
    size_t seq_len(uint64_t h);
    std::pair<int, int> seq_pos_range(uint64_t h);  // llama_memory_seq_pos_min/max
    int seq_slot(uint64_t h);
    uint64_t seq_fork(uint64_t h);
    void seq_truncate(uint64_t h, size_t n);
    void seq_close(uint64_t h);
    std::shared_ptr<Job> seq_generate(uint64_t h, int max_tokens, const SamplingParams & sp,
                                      const std::vector<llama_token> & stop_tokens,
                                      const std::vector<std::string> & stop_strings, RowKind kind);
    std::pair<uint64_t, std::shared_ptr<Job>> prepare_rebase(uint64_t h, size_t keep_prefix,
                                                           const std::vector<llama_token> & replacement,
                                                           size_t keep_from, bool splice);
    std::map<std::string, double> commit_rebase(uint64_t h, uint64_t rebase_id);
    void cancel_rebase(uint64_t rebase_id);
    size_t rebase_target_len(uint64_t rebase_id);
    std::map<std::string, double> stats();
    std::map<std::string, long> tokens_per_sequence();
    size_t used_cells();

    // ---- engine thread only (used by tasks) ----
    SeqState & seq(uint64_t h);
    SeqState * find_seq(uint64_t h);
    size_t free_cells() const { return n_ctx_ - ledger_.used(); }
    // Adds one token of `s` at position s.size() to the batch; returns its batch row.
    int add_row(SeqState & s, llama_token t, bool want_logits, RowKind kind);
    const float * row_logits(int row) const;
    void store_logits(SeqState & s, int row);
    void truncate_kv(SeqState & s, size_t n);  // throws UnsupportedOperationError if llama refuses
    void release_sequence(SeqState & s);       // frees cells and slot, forgets the handle
    llama_seq_id alloc_slot();
    uint64_t new_handle() { return next_handle_++; }
    std::map<uint64_t, SeqState> & sequences() { return seqs_; }
    void finish_rebase(RebaseTask & rt);      // the O(1) swap
    void note_catch_up(long rows) { stat_catch_up_rows_ += rows; }
    bool in_mixed_step() const { return step_mixed_; }

private:
    template <class F> auto call(F && f) -> decltype(f());
    void submit_task(std::unique_ptr<Task> t);
    // Claims the sequence for a new task, or queues a background task behind the background job that
    // holds it (a summary's prompt prefill then its generation); anything else on a busy sequence
    // raises SequenceBusyError.
    void claim_or_queue(SeqState & s, Task & t);
    bool has_queued(uint64_t h) const;
    void loop();
    bool step();
    void end_tasks_touching(uint64_t handle, const std::string & why);
    RebaseTask * find_rebase(uint64_t id);

    EngineOptions opts_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    llama_memory_t mem_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    int n_vocab_ = 0;
    uint32_t n_ctx_ = 0;
    bool can_shift_ = false, recurrent_ = false, hybrid_ = false;
    int n_swa_ = 0;
    mutable std::mutex tok_mu_;

    // engine-thread state
    std::map<uint64_t, SeqState> seqs_;
    std::vector<bool> slot_used_;
    uint64_t next_handle_ = 1;
    CellLedger ledger_;
    std::vector<std::unique_ptr<Task>> tasks_;
    llama_batch batch_{};
    std::vector<RowKind> row_kind_;
    std::map<uint64_t, size_t> step_len_before_;  // rollback points for the current step
    bool step_mixed_ = false;
    uint32_t job_counter_ = 0;

    // counters (engine thread writes, stats() reads on the engine thread)
    long stat_decode_calls_ = 0, stat_mixed_batches_ = 0, stat_failed_decodes_ = 0;
    long stat_rows_[3] = {0, 0, 0};
    double stat_decode_ms_ = 0;
    long stat_rebases_ = 0, stat_catch_up_rows_ = 0, stat_forks_ = 0;

    // command queue
    std::mutex q_mu_;
    std::condition_variable q_cv_;
    std::vector<std::function<void()>> commands_;
    bool stopping_ = false;
    std::thread thread_;
    std::thread::id engine_thread_id_;
};

}  // namespace pkc
