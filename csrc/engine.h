// The engine: one llama_context, one thread that owns it, several KV sequences.
//
// Every llama call on the context happens on the engine thread. Callers submit commands (run between
// two decodes, "between two tokens") and tasks (work that spans decode steps: prefill, probe,
// generation, rebase preparation). Each step is one llama_decode whose batch holds, in order:
// generation rows of urgent work, prefill chunks of urgent work (round-robin), then a bounded chunk
// of background rows: at most `background_chunk_busy` next to urgent rows or while commands wait,
// up to `background_chunk` when nothing else runs, and next to urgent rows only within their share of
// the engine's time (background_share.h). A background job somebody is blocked on is urgent.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "background_share.h"
#include "command_queue.h"
#include "errors.h"
#include "job.h"
#include "kv_book.h"
#include "llama.h"
#include "sampler.h"

namespace pkc {

struct EngineOptions {
    std::string model_path;
    uint32_t n_ctx = 4096;
    uint32_t n_seq_max = 8;
    int n_threads = 0;           // 0: caller decides (Python passes the physical core count)
    uint32_t n_batch = 512;
    uint32_t background_chunk = 64;
    uint32_t background_chunk_busy = 8;
    // Time background rows may take next to foreground work, as a fraction of the foreground's own
    // (background_share.h); >= 1: every step. Negative: by backend (kCpuBackgroundShare on a CPU, 1 on
    // a GPU, where extra rows in a step are nearly free).
    double background_share = -1.0;
    uint32_t seed = 0;
    bool use_extra_bufts = false;  // ggml AMX repacking: SIGILL on some CPUs, see docs/architecture.md
    int n_gpu_layers = 0;
    int flash_attn = -1;           // -1 auto, 0 off, 1 on
    bool verbose = false;
};

// The default share on a CPU: the foreground keeps ~1/(1+0.15) = 0.87 of its solo decode speed
// (0.2 measured 0.81-0.82x, too close to the 0.8x the project asks for; bench/share.py).
constexpr double kCpuBackgroundShare = 0.15;

struct Task;
struct RebaseTask;

// One sequence's saved state (engine_state.cpp): what a new sequence needs to continue without a prefill.
struct SeqSnapshot {
    std::vector<llama_token> tokens;
    size_t evaluated = 0;          // tokens with KV (all, or all but an unevaluated last one)
    std::vector<float> logits;     // next-token logits (n_vocab), or empty when they were not valid
    std::vector<uint8_t> state;    // llama_state_seq_get_data of the sequence's slot
    size_t exact_upto = (size_t) -1;   // SeqState::exact_upto (a splice's moved cells are approximate)
};

// Tests: the next ``count`` engines throw once their context exists, before the engine thread starts
// (the constructor must then free the context and the model it created).
void fail_next_engine_starts(int count);

class Engine {
public:
    // Is a decode of this engine being cut short for foreground work? (llama.cpp then logs errors,
    // which the engine's log callback keeps quiet.)
    bool aborting() const { return abortable_.load() && inbox_->has_urgent(); }

    explicit Engine(const EngineOptions & opts);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;
    // Idempotent and safe from several threads and from the destructor: stops the engine thread
    // (every pending job fails with EngineClosedError), then frees the context and the model.
    void shutdown();

    // ---- model and text: any thread; EngineClosedError after shutdown
    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<llama_token> & tokens, bool special) const;
    std::string token_to_piece(llama_token t, bool special) const;
    bool is_eog(llama_token t) const;
    llama_token special_token(const std::string & which) const;  // bos, eos, eot
    bool add_bos() const;
    std::string chat_template(bool & found) const;
    std::map<std::string, std::string> metadata() const;
    std::map<std::string, std::string> capabilities_strings() const;
    int n_ctx_train() const;
    int n_swa() const { return n_swa_; }
    bool mrope() const { return mrope_; }
    int n_vocab() const { return n_vocab_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_seq_max() const { return opts_.n_seq_max; }
    bool can_shift() const { return can_shift_; }
    bool recurrent() const { return recurrent_; }
    bool hybrid() const { return hybrid_; }
    bool recurrent_state() const { return recurrent_ || hybrid_; }
    void validate_tokens(const std::vector<llama_token> & tokens) const;

    // ---- sequences: any thread; each runs as a command on the engine thread
    uint64_t seq_create();
    std::shared_ptr<Job> seq_append(uint64_t h, const std::vector<llama_token> & tokens, RowKind kind, bool all_logits);
    std::shared_ptr<Job> seq_probe(uint64_t h, const std::vector<llama_token> & tokens,
                                   const std::vector<llama_token> & label_tokens);
    std::vector<float> seq_logits(uint64_t h);
    std::vector<llama_token> seq_tokens(uint64_t h);
    size_t seq_len(uint64_t h);
    std::pair<int, int> seq_pos_range(uint64_t h);  // llama_memory_seq_pos_min/max
    bool seq_spliced(uint64_t h);   // a splice moved some of its cells (approximate from there on)
    int seq_slot(uint64_t h);
    uint64_t seq_fork(uint64_t h, int64_t n_tokens);  // n_tokens < 0: all
    void seq_truncate(uint64_t h, size_t n);
    void seq_close(uint64_t h);
    void seq_close_later(uint64_t h);   // a finalizer's close: queued, never waited for
    std::shared_ptr<Job> seq_generate(uint64_t h, int max_tokens, const SamplingParams & sp,
                                      const std::vector<llama_token> & stop_tokens,
                                      const std::vector<std::string> & stop_strings, RowKind kind);
    std::pair<uint64_t, std::shared_ptr<Job>> prepare_rebase(uint64_t h, size_t keep_prefix,
                                                           const std::vector<llama_token> & replacement,
                                                           size_t keep_from, bool splice);
    std::map<std::string, double> commit_rebase(uint64_t h, uint64_t rebase_id);
    void cancel_rebase(uint64_t rebase_id);
    void cancel_rebase_later(uint64_t rebase_id);   // a finalizer's cancel: queued, never waited for
    size_t rebase_target_len(uint64_t rebase_id);
    std::map<std::string, double> stats();
    std::map<std::string, long> tokens_per_sequence();
    size_t used_cells();
    size_t free_cells();   // what a new job can take: free, less those promised to running appends and replies
    void inject_decode_failures(int count, int rc, int min_rows, bool after);  // tests: see KvBook::inject_failures

    // ---- persistence (engine_state.cpp): any thread
    SeqSnapshot seq_export(uint64_t h);
    // A new sequence from a snapshot of this model; `state` is only read during the call.
    uint64_t seq_import(const std::vector<llama_token> & tokens, size_t evaluated, const std::vector<float> & logits,
                        const uint8_t * state, size_t state_size, size_t exact_upto = (size_t) -1);

private:
    // urgent: f submits foreground work (it may cut short a background-only decode, see step()).
    template <class F> auto run_on_engine_thread(F && f, bool urgent = false) -> decltype(f());
    void check_open() const;
    void submit(std::unique_ptr<Task> t);
    RebaseTask * find_rebase(uint64_t shadow_id);
    void end_tasks_touching(uint64_t handle, const std::string & why);
    void close_now(uint64_t h);   // on the engine thread: end its tasks, free its slot and cells

    // the constructor's part after the context exists (engine.cpp): a throw there frees the context
    void start(const EngineOptions & opts);

    // the step loop (engine_step.cpp)
    void loop();
    bool step();
    bool end_cancelled_queued_tasks();
    std::vector<Task *> build_batch(int budget, bool allow_background, bool & progress, int & urgent_rows);
    void dispatch(const std::vector<Task *> & active);
    void reap_finished();

    EngineOptions opts_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    int n_vocab_ = 0;
    uint32_t n_ctx_ = 0;
    bool can_shift_ = false, recurrent_ = false, hybrid_ = false, mrope_ = false;
    int n_swa_ = 0;
    // Guards the model against shutdown: readers (tokenize, metadata...) hold it, shutdown frees
    // the model under it. Tokenization is serialised by it as well.
    mutable std::mutex model_mu_;
    std::mutex life_mu_;  // one shutdown at a time
    bool closed_ = false;  // under model_mu_

    // engine-thread state
    std::unique_ptr<KvBook> kv_;
    std::vector<std::unique_ptr<Task>> tasks_;
    BackgroundShare share_{1.0};  // set from the options once the backend is known
    // True while a decode carries only background rows: foreground work submitted meanwhile aborts it
    // (llama_set_abort_callback; attention-KV models only, whose rollback is exact).
    std::atomic<bool> abortable_{false};
    static bool abort_check(void * engine);
    // Rows a background-only step may take: halved when foreground work cut one short, raised by
    // background_chunk_busy (up to background_chunk) by each one that completes, so that it settles
    // near what fits between two foreground calls. At background_chunk_busy rows it is not cut short,
    // so background work always moves on.
    int background_only_rows_ = 0;
    bool deadline_rows_in_step_ = false;  // this step carries rows of background work on a deadline
    size_t round_robin_ = 0;
    uint32_t job_counter_ = 0;

    std::shared_ptr<CommandQueue> inbox_ = std::make_shared<CommandQueue>();
    std::thread thread_;
    std::thread::id engine_thread_id_;
};

// The engine whose decode runs on this thread (set by Engine::step around llama_decode).
extern thread_local const Engine * t_decoding;

// Runs f on the engine thread between two steps and returns its result (or rethrows).
template <class F>
auto Engine::run_on_engine_thread(F && f, bool urgent) -> decltype(f()) {
    using R = decltype(f());
    if (std::this_thread::get_id() == engine_thread_id_) return f();
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    if (!inbox_->push([task] { (*task)(); }, urgent)) throw EngineClosedError("the engine is closed; create a new Engine");
    return fut.get();
}

}  // namespace pkc
