#include "sampler.h"

#include <cmath>
#include <stdexcept>

namespace pkc {

Sampler::Sampler(const llama_vocab * vocab, const SamplingParams & p) {
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
        throw std::invalid_argument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
    if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f)
        throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    chain_ = llama_sampler_chain_init(cp);
    if (!p.grammar.empty()) {
        llama_sampler * g = llama_sampler_init_grammar(vocab, p.grammar.c_str(), "root");
        if (!g) {
            llama_sampler_free(chain_);
            chain_ = nullptr;
            throw std::invalid_argument("grammar does not parse as GBNF with a 'root' rule");
        }
        llama_sampler_chain_add(chain_, g);
    }
    if (p.temperature == 0.0f) {
        llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
    } else {
        if (p.top_p < 1.0f) llama_sampler_chain_add(chain_, llama_sampler_init_top_p(p.top_p, 1));
        llama_sampler_chain_add(chain_, llama_sampler_init_temp(p.temperature));
        llama_sampler_chain_add(chain_, llama_sampler_init_dist(p.seed));
    }
}

Sampler::~Sampler() {
    if (chain_) llama_sampler_free(chain_);
}

llama_token Sampler::sample(const float * logits, int n_vocab) {
    candidates_.resize((size_t) n_vocab);
    for (int i = 0; i < n_vocab; ++i) candidates_[(size_t) i] = llama_token_data{i, logits[i], 0.0f};
    llama_token_data_array arr{candidates_.data(), candidates_.size(), -1, false};
    llama_sampler_apply(chain_, &arr);
    if (arr.selected < 0 || arr.selected >= (int64_t) arr.size) return -1;
    const llama_token t = arr.data[arr.selected].id;
    if (!std::isfinite(arr.data[arr.selected].logit)) return -1;  // grammar rejected everything
    llama_sampler_accept(chain_, t);
    return t;
}

}  // namespace pkc
