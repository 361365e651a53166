#include "engine.h"

#include <algorithm>
#include <cmath>
#include <future>

#include "tasks.h"

namespace pkc {

thread_local const Engine * t_decoding = nullptr;

namespace {

bool g_verbose = false;

void log_callback(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR && t_decoding && t_decoding->aborting()) return;  // not an error
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

const char * kClosed = "the engine is closed; create a new Engine";

std::atomic<int> g_failing_starts{0};   // tests: engine starts that throw once the context exists

}  // namespace

void fail_next_engine_starts(int count) { g_failing_starts.store(std::max(0, count)); }

// ================================================================ lifecycle

Engine::Engine(const EngineOptions & opts) : opts_(opts) {
    if (opts.n_seq_max < 1 || opts.n_seq_max > 256)
        throw std::invalid_argument("n_seq_max must be between 1 and 256, got " + std::to_string(opts.n_seq_max));
    if (opts.n_ctx < 16) throw std::invalid_argument("n_ctx must be at least 16, got " + std::to_string(opts.n_ctx));
    if (opts.n_batch < 1) throw std::invalid_argument("n_batch must be >= 1");
    // llama.cpp reserves one output row per sequence at context creation and aborts (GGML_ASSERT)
    // when the batch is smaller than that.
    // (llama.cpp also caps n_batch at n_ctx.)
    if (std::min(opts.n_batch, opts.n_ctx) < opts.n_seq_max)
        throw std::invalid_argument("n_batch (" + std::to_string(opts.n_batch) + ") and n_ctx (" + std::to_string(opts.n_ctx) +
                                    ") must both be >= n_seq_max (" + std::to_string(opts.n_seq_max) +
                                    "): llama.cpp needs one output row per sequence");
    if (opts.background_chunk < 1 || opts.background_chunk_busy < 1)
        throw std::invalid_argument("background_chunk and background_chunk_busy must be >= 1");
    if (opts.n_threads < 0 || opts.n_threads > 1024)
        throw std::invalid_argument("n_threads must be between 1 and 1024, got " + std::to_string(opts.n_threads));
    if (std::isnan(opts.background_share))
        throw std::invalid_argument("background_share must be a number (negative: by backend)");
    if (opts.flash_attn < -1 || opts.flash_attn > 1) throw std::invalid_argument("flash_attn must be -1 (auto), 0 or 1");
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
    cp.kv_unified = true;  // fork = metadata only; partial seq_cp is safe (docs/architecture.md, "Numerics")
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
    try {
        start(opts);
    } catch (...) {
        // the destructor does not run for a constructor that throws: free what exists, stop what runs
        inbox_->stop();
        if (thread_.joinable()) thread_.join();
        kv_.reset();
        llama_free(ctx_);
        ctx_ = nullptr;
        llama_model_free(model_);
        model_ = nullptr;
        throw;
    }
}

void Engine::start(const EngineOptions & opts) {
    llama_memory_t mem = llama_get_memory(ctx_);
    n_ctx_ = llama_n_ctx(ctx_);
    // llama.cpp may lower n_batch (it never exceeds n_ctx); a bigger batch would trip a GGML_ASSERT.
    opts_.n_batch = std::min({opts_.n_batch, (uint32_t) llama_n_batch(ctx_), (uint32_t) llama_n_ubatch(ctx_)});
    can_shift_ = llama_memory_can_shift(mem);
    recurrent_ = llama_model_is_recurrent(model_);
    hybrid_ = llama_model_is_hybrid(model_);
    n_swa_ = llama_model_n_swa(model_);
    const auto rope = llama_model_rope_type(model_);
    mrope_ = rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE;
    const bool on_gpu = opts.n_gpu_layers != 0 && llama_supports_gpu_offload();
    share_ = BackgroundShare(opts.background_share >= 0.0 ? opts.background_share : on_gpu ? 1.0 : kCpuBackgroundShare);
    background_only_rows_ = (int) opts.background_chunk;
    kv_ = std::make_unique<KvBook>(ctx_, vocab_, n_ctx_, opts.n_seq_max, opts_.n_batch, !recurrent_state());
    int failing = g_failing_starts.load();
    while (failing > 0 && !g_failing_starts.compare_exchange_weak(failing, failing - 1)) {}
    if (failing > 0) throw EngineError("the engine thread could not be started (injected by a test)");
    thread_ = std::thread([this] { loop(); });
    engine_thread_id_ = thread_.get_id();
    kv_->bind_thread(engine_thread_id_);
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
    std::lock_guard<std::mutex> life(life_mu_);
    inbox_->stop();
    if (thread_.joinable()) {
        if (std::this_thread::get_id() == engine_thread_id_) {
            thread_.detach();  // never join ourselves; cannot happen from Python
        } else {
            thread_.join();
        }
    }
    std::lock_guard<std::mutex> lk(model_mu_);
    if (closed_) return;
    closed_ = true;
    kv_.reset();  // frees the batch
    if (ctx_) { llama_free(ctx_); ctx_ = nullptr; }
    if (model_) { llama_model_free(model_); model_ = nullptr; }
}

void Engine::check_open() const {
    if (closed_ || !model_) throw EngineClosedError(kClosed);
}

void Engine::submit(std::unique_ptr<Task> t) {
    t->job->set_waker(inbox_);
    tasks_.push_back(std::move(t));
}

// ================================================================ model and text

void Engine::validate_tokens(const std::vector<llama_token> & tokens) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab_) {
            throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                        " is out of range: this model's vocabulary has ids 0.." + std::to_string(n_vocab_ - 1));
        }
    }
}

std::vector<llama_token> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    if (text.size() > (size_t) INT32_MAX / 2) throw std::invalid_argument("text is too long to tokenize");
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
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
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
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
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    std::string out(tokens.size() * 8 + 16, '\0');
    int n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), false, special);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), false, special);
    }
    out.resize(n > 0 ? (size_t) n : 0);
    return out;
}

bool Engine::is_eog(llama_token t) const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    return t >= 0 && t < n_vocab_ && llama_vocab_is_eog(vocab_, t);
}

llama_token Engine::special_token(const std::string & which) const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    if (which == "bos") return llama_vocab_bos(vocab_);
    if (which == "eos") return llama_vocab_eos(vocab_);
    if (which == "eot") return llama_vocab_eot(vocab_);
    throw std::invalid_argument("special token must be 'bos', 'eos' or 'eot', got '" + which + "'");
}

bool Engine::add_bos() const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    return llama_vocab_get_add_bos(vocab_);
}

std::string Engine::chat_template(bool & found) const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    const char * t = llama_model_chat_template(model_, nullptr);
    found = t != nullptr;
    return t ? std::string(t) : std::string();
}

std::map<std::string, std::string> Engine::metadata() const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    std::map<std::string, std::string> out;
    const int n = llama_model_meta_count(model_);
    std::vector<char> key(512), val(1 << 16);
    for (int i = 0; i < n; ++i) {
        if (llama_model_meta_key_by_index(model_, i, key.data(), key.size()) < 0) continue;
        const int vn = llama_model_meta_val_str_by_index(model_, i, val.data(), val.size());
        if (vn < 0) continue;
        out[key.data()] = std::string(val.data(), std::min((size_t) vn, val.size() - 1));
    }
    return out;
}

std::map<std::string, std::string> Engine::capabilities_strings() const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    std::map<std::string, std::string> m;
    char buf[512];
    if (llama_model_desc(model_, buf, sizeof(buf)) > 0) m["description"] = buf;
    if (llama_model_meta_val_str(model_, "general.architecture", buf, sizeof(buf)) > 0) m["architecture"] = buf;
    return m;
}

int Engine::n_ctx_train() const {
    std::lock_guard<std::mutex> lk(model_mu_);
    check_open();
    return llama_model_n_ctx_train(model_);
}

}  // namespace pkc
