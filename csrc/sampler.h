// Picks the next token from a logits row: argmax for greedy decoding, llama.cpp's sampler chain
// (top-k, top-p, min-p, temperature, seeded distribution) otherwise, and a GBNF grammar checked lazily: the chain
// picks first and only that token is checked; the full grammar pass runs when it is rejected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace pkc {

struct SamplingParams {
    float temperature = 0.0f;
    float top_p = 1.0f;
    int32_t top_k = 0;     // 0: off
    float min_p = 0.0f;    // 0: off
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

    // Picks the next token (-1 when the grammar allows none). Does not advance the grammar: call
    // accept() once the token is decoded (a failed decode is retried without it).
    llama_token sample(const float * logits, int n_vocab);
    void accept(llama_token t);

private:
    void fill(const float * logits, int n_vocab);
    llama_token pick_with_chain();

    bool greedy_ = true;
    llama_sampler * chain_ = nullptr;    // null for plain greedy
    llama_sampler * grammar_ = nullptr;  // null without a grammar
    std::vector<llama_token_data> candidates_;
};

}  // namespace pkc
