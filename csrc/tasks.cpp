#include "tasks.h"

#include <algorithm>

namespace pkc {

namespace {
template <class E> std::exception_ptr make_err(const std::string & msg) { return std::make_exception_ptr(E(msg)); }

void clear_busy(Engine & e, uint64_t h, Task * t) {
    if (SeqState * s = e.find_seq(h)) if (s->busy == t) s->busy = nullptr;
}
std::string context_full_msg(Engine & e, size_t need) {
    return "KV cache full: " + std::to_string(need) + " new cells needed, " + std::to_string(e.free_cells()) +
           " free of n_ctx=" + std::to_string(e.n_ctx()) +
           " (one pool shared by all sequences). Close or truncate sequences, or create the Engine with a larger n_ctx.";
}
}  // namespace

// ---------------------------------------------------------------- PrefillTask

int PrefillTask::add_rows(Engine & e, int budget) {
    SeqState * s = e.find_seq(handle);
    if (!s) { abort(e, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (!started) {
        started = true;
        if (refresh) {
            if (s->size() == 0 || s->logits_valid) { end(e); return 0; }
            llama_token last = s->tokens.back();
            e.truncate_kv(*s, s->size() - 1);
            tokens = {last};
        }
    }
    const size_t left = tokens.size() - offset;
    if (left == 0) { end(e); return 0; }
    const size_t n = std::min(left, (size_t) budget);
    if (e.free_cells() < n || s->size() + n > e.n_ctx()) {
        std::string msg = context_full_msg(e, n);
        abort(e, make_err<ContextFullError>(msg), msg);
        return 0;
    }
    s->logits_valid = false;
    logit_rows.clear();
    for (size_t i = 0; i < n; ++i) {
        const bool last = offset + i + 1 == tokens.size();
        const bool want = all_logits || last;
        int row = e.add_row(*s, tokens[offset + i], want, kind);
        if (want) logit_rows.push_back(row);
        if (last) rows.push_back(row);
    }
    offset += n;
    job->add_stat((int) n, e.in_mixed_step());
    return (int) n;
}

void PrefillTask::after_decode(Engine & e) {
    SeqState * s = e.find_seq(handle);
    if (all_logits) {
        const int nv = e.n_vocab();
        for (int row : logit_rows) {
            const float * l = e.row_logits(row);
            collected.insert(collected.end(), l, l + nv);
        }
    }
    if (s && !rows.empty()) e.store_logits(*s, rows.back());
    rows.clear();
    if (offset == tokens.size()) end(e);
}

void PrefillTask::end(Engine & e) {
    if (finished) return;
    finished = true;
    clear_busy(e, handle, this);
    if (all_logits) job->set_rows(std::move(collected));
    job->finish("done");
}

void PrefillTask::abort(Engine & e, std::exception_ptr err, const std::string & msg) {
    if (finished) return;
    finished = true;
    clear_busy(e, handle, this);
    job->fail(err, msg);
}

// ---------------------------------------------------------------- GenerateTask

int GenerateTask::add_rows(Engine & e, int budget) {
    SeqState * s = e.find_seq(handle);
    if (!s) { abort(e, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (job->cancel_requested()) { end(e, "cancelled"); return 0; }
    if (s->size() == 0) {
        const char * msg = "cannot generate on an empty sequence: append a prompt first";
        abort(e, std::make_exception_ptr(std::invalid_argument(msg)), msg);
        return 0;
    }
    if (generated >= max_tokens) { end(e, "length"); return 0; }
    if (!s->logits_valid) {
        // After a truncate or a splice the last token's logits are recomputed once, exactly.
        llama_token last = s->tokens.back();
        e.truncate_kv(*s, s->size() - 1);
        rows.push_back(e.add_row(*s, last, true, kind));
        redecoding = true;
        job->add_stat(1, e.in_mixed_step());
        return 1;
    }
    if (generated >= max_tokens) { end(e, "length"); return 0; }
    if (s->size() >= e.n_ctx() || e.free_cells() == 0) { end(e, "context_full"); return 0; }
    const llama_token t = sampler.sample(s->logits.data(), e.n_vocab());
    if (t < 0 || llama_vocab_is_eog(e.vocab(), t)) { end(e, "stop"); return 0; }
    pending = t;
    rows.push_back(e.add_row(*s, t, true, kind));
    job->add_stat(1, e.in_mixed_step());
    return 1;
}

void GenerateTask::after_decode(Engine & e) {
    SeqState * s = e.find_seq(handle);
    if (s && !rows.empty()) e.store_logits(*s, rows.back());
    rows.clear();
    if (redecoding) { redecoding = false; return; }
    generated += 1;
    job->push_token(pending);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), pending) != stop_tokens.end()) { end(e, "stop"); return; }
    if (!stop_strings.empty()) {
        const std::string piece = e.token_to_piece(pending, false);
        size_t longest = 0;
        for (auto & ss : stop_strings) longest = std::max(longest, ss.size());
        const size_t from = text.size() >= longest ? text.size() - longest : 0;
        text += piece;
        for (auto & ss : stop_strings) {
            if (!ss.empty() && text.find(ss, from) != std::string::npos) { end(e, "stop"); return; }
        }
    }
    if (generated >= max_tokens) end(e, "length");
}

void GenerateTask::end(Engine & e, const std::string & reason) {
    if (finished) return;
    finished = true;
    clear_busy(e, handle, this);
    job->finish(reason);
}

void GenerateTask::abort(Engine & e, std::exception_ptr err, const std::string & msg) {
    if (finished) return;
    finished = true;
    clear_busy(e, handle, this);
    job->fail(err, msg);
}

// ---------------------------------------------------------------- RebaseTask

size_t RebaseTask::pending(Engine & e) {
    size_t n = head.size() - head_offset;
    if (!splice) {
        if (SeqState * m = e.find_seq(main_handle)) n += m->size() > main_consumed ? m->size() - main_consumed : 0;
    }
    return n;
}

void RebaseTask::update_ready(Engine & e) {
    const bool r = pending(e) == 0;
    if (r != ready_flag) { ready_flag = r; job->set_ready(r); }
}

bool RebaseTask::has_work(Engine & e) {
    if (finished) return false;
    update_ready(e);
    if (commit_requested && ready_flag) return true;  // the swap itself is done in add_rows
    return !ready_flag;
}

int RebaseTask::add_rows(Engine & e, int budget) {
    SeqState * m = e.find_seq(main_handle);
    SeqState * sh = e.find_seq(shadow_handle);
    if (!m || !sh) { abort(e, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (job->cancel_requested()) {
        abort(e, make_err<CancelledError>("rebase preparation was cancelled"), "rebase preparation was cancelled");
        return 0;
    }
    const size_t want = pending(e);
    if (want == 0) {
        if (commit_requested) e.finish_rebase(*this);
        return 0;
    }
    const size_t n = std::min(want, (size_t) budget);
    if (e.free_cells() < n || sh->size() + n > e.n_ctx()) {
        std::string msg = "rebase preparation: " + context_full_msg(e, n);
        abort(e, make_err<ContextFullError>(msg), msg);
        return 0;
    }
    sh->logits_valid = false;
    logits_row = -1;
    for (size_t i = 0; i < n; ++i) {
        const bool last = i + 1 == n && n == want;  // logits only when this chunk catches up
        llama_token t = head_offset < head.size() ? head[head_offset++] : m->tokens[main_consumed++];
        int row = e.add_row(*sh, t, last, kind);
        if (last) logits_row = row;
    }
    if (commit_requested) catch_up_rows += (long) n;
    job->add_stat((int) n, e.in_mixed_step());
    return (int) n;
}

void RebaseTask::after_decode(Engine & e) {
    rows.clear();
    SeqState * sh = e.find_seq(shadow_handle);
    if (sh && logits_row >= 0) e.store_logits(*sh, logits_row);
    logits_row = -1;
    update_ready(e);
    if (commit_requested && ready_flag) e.finish_rebase(*this);
}

void RebaseTask::on_main_truncated(Engine & e, size_t n) {
    if (finished) return;
    if (n < keep_from) {
        std::string msg = "the sequence was truncated to " + std::to_string(n) + " tokens, below the rebase mark keep_from=" +
                          std::to_string(keep_from) + "; prepare the rebase again";
        abort(e, make_err<EngineError>(msg), msg);
        return;
    }
    if (!splice && n < main_consumed) {
        SeqState * sh = e.find_seq(shadow_handle);
        if (sh) e.truncate_kv(*sh, sh->size() - (main_consumed - n));
        main_consumed = n;
    }
}

void RebaseTask::abort(Engine & e, std::exception_ptr err, const std::string & msg) {
    if (finished) return;
    finished = true;
    if (SeqState * sh = e.find_seq(shadow_handle)) e.release_sequence(*sh);
    if (commit_requested) commit_promise.set_exception(err);
    job->set_ready(false);
    job->fail(err, msg);
}

}  // namespace pkc
