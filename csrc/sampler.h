// Builds the llama.cpp sampler chain for one generation and samples from a logits row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace pkc {

struct SamplingParams {
    float temperature = 0.0f;
    float top_p = 1.0f;
    uint32_t seed = 0;
    std::string grammar;  // GBNF, root rule "root"; empty for none
};

class Sampler {
public:
    // Throws std::invalid_argument on bad parameters or a grammar that does not parse.
    Sampler(const llama_vocab * vocab, const SamplingParams & params);
    ~Sampler();
    Sampler(const Sampler &) = delete;
    Sampler & operator=(const Sampler &) = delete;

    // Picks the next token from a full-vocabulary logits row and advances the sampler's state
    // (grammar, RNG). Returns -1 when the grammar allows no token.
    llama_token sample(const float * logits, int n_vocab);

private:
    llama_sampler * chain_ = nullptr;
    std::vector<llama_token_data> candidates_;
};

}  // namespace pkc
