#include "tasks.h"

#include <algorithm>
#include <cmath>

namespace pkc {

namespace {
template <class E> std::exception_ptr make_err(const std::string & msg) { return std::make_exception_ptr(E(msg)); }

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string context_full_msg(KvBook & kv, size_t need) {
    return "KV cache full: " + std::to_string(need) + " new cells needed, " + std::to_string(kv.free_for(0)) +
           " free of n_ctx=" + std::to_string(kv.n_ctx()) + " (one pool shared by all sequences" +
           (kv.reserved_cells() ? ", less " + std::to_string(kv.reserved_cells()) + " promised to appends and replies still running"
                                : std::string()) +
           "). Close or truncate sequences, or create the Engine with a larger n_ctx.";
}

// n new tokens, each taking a new cell (the sequence is fully evaluated)
// (free cells less those promised to foreground appends: KvBook::reserve)
bool fits(KvBook & kv, const SeqState & s, size_t n) { return kv.free_for(0) >= n && s.size() + n <= kv.n_ctx(); }
}  // namespace

// ---------------------------------------------------------------- Task

bool Task::runnable(KvBook & kv) const {
    for (uint64_t h : claims) {
        SeqState * s = kv.find(h);
        if (s && s->active() != this) return false;
    }
    return true;
}

bool Task::touches(uint64_t h) const { return std::find(claims.begin(), claims.end(), h) != claims.end(); }

void Task::leave_queues(KvBook & kv) {
    for (uint64_t h : claims) kv.dequeue(*this, h);
}

void Task::complete(KvBook & kv, const std::string & reason) {
    if (finished) return;
    finished = true;
    on_complete(kv);
    release(kv);
    leave_queues(kv);
    job->finish(reason);
}

void Task::fail(KvBook & kv, std::exception_ptr err, const std::string & msg) {
    if (finished) return;
    finished = true;
    on_fail(kv, err);
    release(kv);
    leave_queues(kv);
    job->fail(err, msg);
}

// ---------------------------------------------------------------- PrefillTask

int PrefillTask::add_rows(KvBook & kv, int budget) {
    SeqState * s = kv.find(handle);
    if (!s) { fail(kv, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (job->cancel_requested()) { complete(kv, "cancelled"); return 0; }
    const size_t left = tokens.size() - offset;
    // With nothing left to append, the sequence still needs its next-token logits.
    if (left == 0 && (s->logits_valid || s->size() == 0)) { complete(kv, "done"); return 0; }
    // A re-decode of the last token gives its cell back first, so it always fits.
    const bool redecode = left == 0 && s->fully_evaluated();
    const size_t pending = redecode ? 1 : s->size() - s->evaluated();  // 0 or 1
    const size_t n = std::min(left, (size_t) budget - std::min((size_t) budget, pending));
    const size_t new_cells = n + (redecode ? 0 : pending);
    if (promise.free_in(kv) < new_cells || s->size() + n > kv.n_ctx()) {
        const std::string msg = context_full_msg(kv, new_cells);
        fail(kv, make_err<ContextFullError>(msg), msg);
        return 0;
    }
    promise.step += new_cells;
    if (redecode) kv.unevaluate_last(*s);
    if (pending) {
        const bool want = n == 0;  // the pending token is the last one of this step
        const int r = kv.add_pending_row(*s, want, kind);
        if (want) last_row = r;
    }
    for (size_t i = 0; i < n; ++i) {
        const bool last = offset + 1 == tokens.size();
        const bool want = all_logits || last || (logits_every_chunk && i + 1 == n);
        const int row = kv.add_row(*s, tokens[offset++], want, kind);
        if (all_logits) logit_rows.push_back(row);
        if (last || (logits_every_chunk && i + 1 == n)) last_row = row;
    }
    return (int) (n + pending);
}

void PrefillTask::after_decode(KvBook & kv) {
    SeqState * s = kv.find(handle);
    const int nv = kv.n_vocab();
    for (int r : logit_rows) {  // rows are readable until the next decode: copy what a label needs
        const float * row = kv.row_logits(r);
        collected.insert(collected.end(), row, row + nv);
    }
    if (s && last_row >= 0) kv.set_logits_row(*s, last_row);
    else if (s) s->logits_valid = false;
    job->push_tokens(tokens.data() + offset_at_step, offset - offset_at_step);
    promise.settle(kv);
    logit_rows.clear();
    last_row = -1;
    if (offset == tokens.size() && s && s->fully_evaluated() && (s->logits_valid || s->size() == 0)) complete(kv, "done");
}

void PrefillTask::on_complete(KvBook & kv) {
    if (all_logits) job->set_values(std::move(collected), kv.n_vocab());
}

// ---------------------------------------------------------------- ProbeTask

void ProbeTask::on_complete(KvBook & kv) {
    SeqState * s = kv.find(handle);
    const float * l = s ? kv.logits(*s) : nullptr;
    if (!l) return;
    // log-softmax at the label tokens, in double precision
    const int nv = kv.n_vocab();
    double mx = l[0];
    for (int i = 1; i < nv; ++i) mx = std::max(mx, (double) l[i]);
    double sum = 0;
    for (int i = 0; i < nv; ++i) sum += std::exp((double) l[i] - mx);
    const double lse = mx + std::log(sum);
    std::vector<float> out;
    for (llama_token t : label_tokens) out.push_back((float) ((double) l[t] - lse));
    job->set_values(std::move(out), (int) label_tokens.size());
}

void ProbeTask::release(KvBook & kv) {
    PrefillTask::release(kv);
    if (SeqState * s = kv.find(handle)) kv.release(*s);
}

// ---------------------------------------------------------------- GenerateTask

int GenerateTask::add_rows(KvBook & kv, int budget) {
    SeqState * s = kv.find(handle);
    if (!s) { fail(kv, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (job->cancel_requested()) { complete(kv, "cancelled"); return 0; }
    if (s->size() == 0) {
        const char * msg = "cannot generate on an empty sequence: append a prompt first";
        fail(kv, std::make_exception_ptr(std::invalid_argument(msg)), msg);
        return 0;
    }
    if (generated >= max_tokens) { complete(kv, "length"); return 0; }
    if (!s->logits_valid) {
        // After a truncate, a splice or a failed decode the last token is decoded again, once.
        if (!s->fully_evaluated() && !fits_promised(kv, *s, 1)) { complete(kv, "context_full"); return 0; }
        if (s->fully_evaluated()) kv.unevaluate_last(*s);   // (gives its cell back first: no new cell)
        else promise.step = 1;
        sampled_token = -1;
        row = kv.add_pending_row(*s, true, kind);
        return 1;
    }
    if (!fits_promised(kv, *s, 1)) { complete(kv, "context_full"); return 0; }
    promise.step = 1;
    const llama_token t = retry_token >= 0 ? retry_token : sampler.sample(kv.logits(*s), kv.n_vocab());
    retry_token = -1;
    if (t < 0 || llama_vocab_is_eog(kv.vocab(), t)) { complete(kv, "stop"); return 0; }
    sampled_token = t;
    row = kv.add_row(*s, t, true, kind);
    return 1;
}

bool GenerateTask::fits_promised(KvBook & kv, const SeqState & s, size_t n) const {
    return promise.free_in(kv) >= n && s.size() + n <= kv.n_ctx();
}

void GenerateTask::after_decode(KvBook & kv) {
    promise.settle(kv);   // the promised cell this step took
    SeqState * s = kv.find(handle);
    if (s && row >= 0) kv.set_logits_row(*s, row);
    row = -1;
    if (sampled_token < 0) return;  // a re-decode: no new token
    const llama_token t = sampled_token;
    sampled_token = -1;
    sampler.accept(t);
    generated += 1;
    job->push_token(t);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), t) != stop_tokens.end()) { complete(kv, "stop"); return; }
    if (hit_stop_string(kv, t)) { complete(kv, "stop"); return; }
    if (generated >= max_tokens) complete(kv, "length");
}

bool GenerateTask::hit_stop_string(KvBook & kv, llama_token t) {
    if (stop_strings.empty()) return false;
    char buf[256];
    int n = llama_token_to_piece(kv.vocab(), t, buf, sizeof(buf), 0, false);
    std::string piece;
    if (n >= 0) {
        piece.assign(buf, (size_t) n);
    } else {
        piece.resize((size_t) -n);
        n = llama_token_to_piece(kv.vocab(), t, piece.data(), (int32_t) piece.size(), 0, false);
        piece.resize(n > 0 ? (size_t) n : 0);
    }
    size_t longest = 0;
    for (auto & ss : stop_strings) longest = std::max(longest, ss.size());
    const size_t from = text.size() >= longest ? text.size() - longest : 0;
    text += piece;
    for (auto & ss : stop_strings) {
        if (!ss.empty() && text.find(ss, from) != std::string::npos) return true;
    }
    return false;
}

// ---------------------------------------------------------------- RebaseTask

size_t RebaseTask::rows_to_catch_up(KvBook & kv) {
    size_t n = fed_first.size() - fed_first_done;
    if (!splice) {
        if (SeqState * m = kv.find(main_handle)) n += m->size() > main_fed ? m->size() - main_fed : 0;
    }
    return n;
}

bool RebaseTask::superseded(KvBook & kv) {
    SeqState * m = kv.find(main_handle);
    return m && m->epoch != main_epoch;
}

void RebaseTask::update_ready(KvBook & kv) {
    const bool r = rows_to_catch_up(kv) == 0;
    if (r != ready) { ready = r; job->set_ready(r); }
}

bool RebaseTask::has_work(KvBook & kv) {
    if (finished) return false;
    if (job->cancel_requested() || superseded(kv) || !kv.find(main_handle) || !kv.find(shadow_handle)) return true;
    update_ready(kv);
    return committing || !ready;
}

int RebaseTask::add_rows(KvBook & kv, int budget) {
    SeqState * m = kv.find(main_handle);
    SeqState * sh = kv.find(shadow_handle);
    if (!m || !sh) { fail(kv, make_err<SequenceClosedError>("sequence was closed"), "sequence was closed"); return 0; }
    if (job->cancel_requested()) {
        fail(kv, make_err<CancelledError>("rebase preparation was cancelled"), "rebase preparation was cancelled");
        return 0;
    }
    if (superseded(kv)) {
        const char * msg = "superseded: another rebase of this sequence was committed; prepare it again";
        fail(kv, make_err<RebaseSupersededError>(msg), msg);
        return 0;
    }
    const size_t want = rows_to_catch_up(kv);
    if (want == 0) {
        if (committing) swap(kv);
        return 0;
    }
    const size_t n = std::min(want, (size_t) budget);
    if (!fits(kv, *sh, n)) {
        const std::string msg = "rebase preparation: " + context_full_msg(kv, n);
        fail(kv, make_err<ContextFullError>(msg), msg);
        return 0;
    }
    for (size_t i = 0; i < n; ++i) {
        // Logits only where they are read: the last row the commit is waiting for.
        const bool want_logits = (committing || logits_every_chunk) && i + 1 == n && n == want;
        const llama_token t = fed_first_done < fed_first.size() ? fed_first[fed_first_done++] : m->tokens[main_fed++];
        const int r = kv.add_row(*sh, t, want_logits, kind);
        if (want_logits) logits_row = r;
    }
    if (committing) catch_up_rows += (long) n;
    return (int) n;
}

void RebaseTask::after_decode(KvBook & kv) {
    SeqState * sh = kv.find(shadow_handle);
    if (sh) {
        if (logits_row >= 0) kv.set_logits_row(*sh, logits_row);
        else sh->logits_valid = false;
    }
    logits_row = -1;
    update_ready(kv);
    if (committing && ready) swap(kv);
}

void RebaseTask::check_splice_allowed(KvBook & kv, SeqState & m) const {
    if (!m.fully_evaluated()) {
        throw EngineError("the sequence's last token has no KV yet (a decode failed); call logits() on it, then commit");
    }
    for (size_t i = keep_from; i < m.cells.size(); ++i) {
        if (kv.holders(m.cells[i]) > 1) {
            throw UnsupportedOperationError("mode='splice' would shift KV cells that another live sequence (a fork) "
                                            "shares with this one; close the forks first or use mode='exact'");
        }
    }
}

void RebaseTask::request_commit(KvBook & kv) {
    if (committing) throw SequenceBusyError("a commit of this rebase is already in progress");
    SeqState & m = kv.get(main_handle);
    if (superseded(kv)) throw RebaseSupersededError("superseded: another rebase of this sequence was committed; prepare it again");
    if (splice) check_splice_allowed(kv, m);
    kv.enqueue(m, *this, false);  // SequenceBusyError while another job runs on it
    claims.push_back(main_handle);
    committing = true;
    commit_started = std::chrono::steady_clock::now();
    kind = RowKind::Foreground;  // the caller is waiting now: catch up at full speed
    if (rows_to_catch_up(kv) == 0) swap(kv);
}

void RebaseTask::swap(KvBook & kv) {
    SeqState & m = *kv.find(main_handle);
    SeqState & sh = *kv.find(shadow_handle);
    std::map<std::string, double> info;
    info["tokens_before"] = (double) m.size();
    info["splice"] = splice ? 1.0 : 0.0;
    try {
        if (splice) {
            check_splice_allowed(kv, m);  // again at the swap: nothing may have taken a share since
            splice_into(kv, m, sh);
        } else {
            kv.take_over(m, shadow_handle);
        }
    } catch (const std::exception & ex) {
        fail(kv, std::current_exception(), ex.what());
        return;
    }
    m.epoch += 1;
    info["tokens_after"] = (double) m.size();
    info["catch_up_tokens"] = (double) catch_up_rows;
    info["reused_tokens"] = (double) reused;
    info["stall_ms"] = ms_since(commit_started);
    kv.counters().rebases += 1;
    kv.counters().catch_up_rows += catch_up_rows;
    commit_promise.set_value(info);
    complete(kv, "committed");
}

void RebaseTask::splice_into(KvBook & kv, SeqState & m, SeqState & sh) {
    // Drop [keep_prefix, keep_from), shift the tail, then move the replacement's cells in.
    llama_memory_t mem = kv.memory();
    const size_t kp = keep_prefix, kf = keep_from, R = replacement_len;
    const llama_pos delta = (llama_pos) (kp + R) - (llama_pos) kf;
    if (!llama_memory_seq_rm(mem, m.sid, (llama_pos) kp, (llama_pos) kf))
        throw UnsupportedOperationError("this model's memory cannot remove a range of a sequence; use mode='exact'");
    if (delta != 0) {
        llama_memory_seq_add(mem, m.sid, (llama_pos) kf, -1, delta);
        m.shift_pending = true;  // K is rotated at the next decode; see SeqState::shift_pending
    }
    // The replacement's cells were computed in the shadow after the same prefix: exact where the shadow's
    // are. The tail's were computed after the span they no longer follow: approximate from kp + R on.
    // (a splice that replaced nothing, the whole span reused, moved nothing either)
    size_t exact = sh.exact_upto;
    if (m.tokens.size() > kf && (kf != kp || R != 0)) exact = std::min(exact, kp + R);
    if (R > 0) llama_memory_seq_cp(mem, sh.sid, m.sid, (llama_pos) kp, (llama_pos) (kp + R));
    std::vector<llama_token> toks(m.tokens.begin(), m.tokens.begin() + (long) kp);
    std::vector<CellId> cells(m.cells.begin(), m.cells.begin() + (long) kp);
    toks.insert(toks.end(), sh.tokens.begin() + (long) kp, sh.tokens.end());
    cells.insert(cells.end(), sh.cells.begin() + (long) kp, sh.cells.end());
    for (size_t i = kp; i < sh.cells.size(); ++i) kv.hold(sh.cells[i]);
    kv.release_cells(m.cells, kp, kf);
    toks.insert(toks.end(), m.tokens.begin() + (long) kf, m.tokens.end());
    cells.insert(cells.end(), m.cells.begin() + (long) kf, m.cells.end());
    m.tokens = std::move(toks);
    m.cells = std::move(cells);
    m.exact_upto = exact;
    m.logits_valid = false;  // recomputed on demand against the spliced cache
    m.logits_row = -1;
}

void RebaseTask::on_main_truncated(KvBook & kv, size_t n) {
    if (finished) return;
    if (n < keep_from) {
        const std::string msg = "the sequence was truncated to " + std::to_string(n) +
                                " tokens, below the rebase mark keep_from=" + std::to_string(keep_from) +
                                "; prepare the rebase again";
        fail(kv, make_err<EngineError>(msg), msg);
        return;
    }
    if (!splice && n < main_fed) {
        if (SeqState * sh = kv.find(shadow_handle)) kv.drop_tail(*sh, sh->size() - (main_fed - n));
        main_fed = n;
    }
}

void RebaseTask::on_fail(KvBook & kv, std::exception_ptr err) {
    if (committing) commit_promise.set_exception(err);
}

void RebaseTask::release(KvBook & kv) {
    job->set_ready(false);
    if (SeqState * sh = kv.find(shadow_handle)) kv.release(*sh);
}

}  // namespace pkc
