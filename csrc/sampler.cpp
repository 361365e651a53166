#include "sampler.h"

#include <cmath>
#include <stdexcept>

namespace pkc {

Sampler::Sampler(const llama_vocab * vocab, const SamplingParams & p) {
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
        throw std::invalid_argument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
    if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f)
        throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    if (p.top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0: off), got " + std::to_string(p.top_k));
    if (!std::isfinite(p.min_p) || p.min_p < 0.0f || p.min_p >= 1.0f)
        throw std::invalid_argument("min_p must be in [0, 1) (0: off), got " + std::to_string(p.min_p));
    if (!p.grammar.empty()) {
        grammar_ = llama_sampler_init_grammar(vocab, p.grammar.c_str(), "root");
        if (!grammar_) throw std::invalid_argument("grammar does not parse as GBNF with a 'root' rule");
    }
    greedy_ = p.temperature == 0.0f;
    if (!greedy_) {
        llama_sampler_chain_params cp = llama_sampler_chain_default_params();
        cp.no_perf = true;
        chain_ = llama_sampler_chain_init(cp);
        // top-k first: it cuts a 152k vocabulary to k candidates before top-p sorts them
        if (p.top_k > 0) llama_sampler_chain_add(chain_, llama_sampler_init_top_k(p.top_k));
        if (p.top_p < 1.0f) llama_sampler_chain_add(chain_, llama_sampler_init_top_p(p.top_p, 1));
        if (p.min_p > 0.0f) llama_sampler_chain_add(chain_, llama_sampler_init_min_p(p.min_p, 1));
        llama_sampler_chain_add(chain_, llama_sampler_init_temp(p.temperature));
        llama_sampler_chain_add(chain_, llama_sampler_init_dist(p.seed));
    }
}

Sampler::~Sampler() {
    if (chain_) llama_sampler_free(chain_);
    if (grammar_) llama_sampler_free(grammar_);
}

void Sampler::fill(const float * logits, int n_vocab) {
    candidates_.resize((size_t) n_vocab);
    for (int i = 0; i < n_vocab; ++i) candidates_[(size_t) i] = llama_token_data{i, logits[i], 0.0f};
}

llama_token Sampler::pick_with_chain() {
    llama_token_data_array arr{candidates_.data(), candidates_.size(), -1, false};
    if (greedy_) {
        size_t best = 0;
        for (size_t i = 1; i < arr.size; ++i) if (arr.data[i].logit > arr.data[best].logit) best = i;
        return std::isfinite(arr.data[best].logit) ? arr.data[best].id : -1;
    }
    llama_sampler_apply(chain_, &arr);
    if (arr.selected < 0 || arr.selected >= (int64_t) arr.size) return -1;
    if (!std::isfinite(arr.data[arr.selected].logit)) return -1;
    return arr.data[arr.selected].id;
}

llama_token Sampler::sample(const float * logits, int n_vocab) {
    if (greedy_ && !grammar_) {  // the common case: no candidate array at all
        int best = 0;
        for (int i = 1; i < n_vocab; ++i) if (logits[i] > logits[best]) best = i;
        return std::isfinite(logits[best]) ? best : -1;
    }
    fill(logits, n_vocab);
    const llama_token first = pick_with_chain();
    if (!grammar_) return first;
    if (first >= 0) {  // check only the chosen token against the grammar
        llama_token_data one{first, logits[first], 0.0f};
        llama_token_data_array single{&one, 1, -1, false};
        llama_sampler_apply(grammar_, &single);
        if (std::isfinite(one.logit)) return first;
    }
    fill(logits, n_vocab);  // rejected: mask the whole vocabulary, then pick again
    llama_token_data_array arr{candidates_.data(), candidates_.size(), -1, false};
    llama_sampler_apply(grammar_, &arr);
    return pick_with_chain();
}

void Sampler::accept(llama_token t) {
    if (grammar_) llama_sampler_accept(grammar_, t);
    if (chain_) llama_sampler_accept(chain_, t);
}

}  // namespace pkc
