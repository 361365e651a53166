// Python bindings of the native engine. Every call that talks to the engine thread releases the GIL
// while it waits, so other Python threads (and the engine) keep running.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine.h"

namespace py = pybind11;
using namespace pkc;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

py::array_t<float> to_numpy(std::vector<float> && v, py::ssize_t rows, py::ssize_t cols) {
    auto * heap = new std::vector<float>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    if (rows < 0) return py::array_t<float>({(py::ssize_t) heap->size()}, {(py::ssize_t) sizeof(float)}, heap->data(), owner);
    return py::array_t<float>({rows, cols}, {cols * (py::ssize_t) sizeof(float), (py::ssize_t) sizeof(float)}, heap->data(), owner);
}

// C++ exceptions become the classes in pykvcompact/errors.py (pure Python, importable without us).
void register_translators() {
    py::register_exception_translator([](std::exception_ptr p) {
        if (!p) return;
        auto raise = [](const char * cls, const char * what) {
            py::object errors = py::module_::import("pykvcompact.errors");
            PyErr_SetString(errors.attr(cls).ptr(), what);
        };
        try {
            std::rethrow_exception(p);
        } catch (const ContextFullError & e) { raise("ContextFullError", e.what());
        } catch (const SlotsExhaustedError & e) { raise("SlotsExhaustedError", e.what());
        } catch (const SequenceClosedError & e) { raise("SequenceClosedError", e.what());
        } catch (const EngineClosedError & e) { raise("EngineClosedError", e.what());
        } catch (const SequenceBusyError & e) { raise("SequenceBusyError", e.what());
        } catch (const UnsupportedOperationError & e) { raise("UnsupportedOperationError", e.what());
        } catch (const CancelledError & e) { raise("CancelledError", e.what());
        } catch (const RebaseSupersededError & e) { raise("RebaseSupersededError", e.what());
        } catch (const RebaseNotPendingError & e) { raise("RebaseNotPendingError", e.what());
        } catch (const EngineError & e) { raise("EngineError", e.what());
        }
    });
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "pykvcompact native engine (one llama.cpp context, one engine thread, many KV sequences)";
    m.attr("LLAMA_CPP_HEADER_BUILD") = py::str("llama-cpp-python 0.3.36");
    register_translators();
    m.def("fail_next_engine_starts", &fail_next_engine_starts, py::arg("count"),
          "Tests: the next `count` engines fail to start after creating their context.");

    py::class_<Job, std::shared_ptr<Job>>(m, "Job")
        .def("done", &Job::done)
        .def("wait", &Job::wait, py::arg("timeout_s"), Release())
        .def("wait_tokens", &Job::wait_tokens, py::arg("have"), py::arg("timeout_s"), Release())
        .def("wait_ready", &Job::wait_ready, py::arg("timeout_s"), Release())
        .def("ready", &Job::ready)
        .def("cancel", &Job::request_cancel)
        .def("cancel_requested", &Job::cancel_requested)
        .def("set_rows_per_step", &Job::set_rows_per_step, py::arg("n"))
        .def("rows_per_step", &Job::rows_per_step)
        .def("tokens", &Job::tokens)
        .def("tokens_from", &Job::tokens_from, py::arg("start"))
        .def("finish_reason", &Job::finish_reason)
        .def("error_message", &Job::error_message)
        .def("rethrow", [](const Job & j) { if (auto e = j.error()) std::rethrow_exception(e); })
        .def("rows_decoded", &Job::rows_decoded)
        .def("mixed_steps", &Job::mixed_steps)
        .def("values", [](const Job & j) { return j.values(); })
        .def("logit_rows", [](const Job & j, int n_vocab) {
            // The rows of a prefill with all_logits: (n_rows, n_vocab); n_vocab must be the model's.
            const int cols = j.value_cols();
            if (n_vocab != cols && !(cols == 0 && n_vocab > 0))
                throw std::invalid_argument("logit_rows: n_vocab must be the model's vocabulary size (" + std::to_string(cols) +
                                            "), got " + std::to_string(n_vocab));
            std::vector<float> r = j.values();
            const py::ssize_t rows = cols > 0 ? (py::ssize_t) (r.size() / (size_t) cols) : 0;
            return to_numpy(std::move(r), rows, n_vocab);
        }, py::arg("n_vocab"));

    py::class_<Engine>(m, "Engine")
        .def(py::init([](const std::string & path, uint32_t n_ctx, uint32_t n_seq_max, int n_threads, uint32_t n_batch,
                         uint32_t background_chunk, uint32_t background_chunk_busy, uint32_t seed, bool use_extra_bufts,
                         int n_gpu_layers, int flash_attn, bool verbose, double background_share) {
                 EngineOptions o;
                 o.model_path = path; o.n_ctx = n_ctx; o.n_seq_max = n_seq_max; o.n_threads = n_threads;
                 o.n_batch = n_batch; o.background_chunk = background_chunk; o.background_chunk_busy = background_chunk_busy;
                 o.seed = seed; o.use_extra_bufts = use_extra_bufts; o.n_gpu_layers = n_gpu_layers;
                 o.flash_attn = flash_attn; o.verbose = verbose; o.background_share = background_share;
                 return new Engine(o);
             }),
             // keywords with the defaults of EngineOptions (pykvcompact.Engine checks and documents them)
             py::arg("model_path"), py::kw_only(), py::arg("n_ctx") = 4096u, py::arg("n_seq_max") = 8u,
             py::arg("n_threads") = 0, py::arg("n_batch") = 512u, py::arg("background_chunk") = 64u,
             py::arg("background_chunk_busy") = 8u, py::arg("seed") = 0u, py::arg("use_extra_bufts") = false,
             py::arg("n_gpu_layers") = 0, py::arg("flash_attn") = -1, py::arg("verbose") = false,
             py::arg("background_share") = -1.0, Release())
        .def("shutdown", &Engine::shutdown, Release())
        .def("tokenize", &Engine::tokenize, py::arg("text"), py::arg("add_special"), py::arg("parse_special"), Release())
        .def("detokenize", [](const Engine & e, const std::vector<llama_token> & t, bool special) {
            std::string s;
            { py::gil_scoped_release r; s = e.detokenize(t, special); }
            return py::bytes(s);
        }, py::arg("tokens"), py::arg("special"))
        .def("token_to_piece", [](const Engine & e, llama_token t, bool special) {
            std::string s;
            { py::gil_scoped_release r; s = e.token_to_piece(t, special); }
            return py::bytes(s);
        }, py::arg("token"), py::arg("special"))
        .def("is_eog", &Engine::is_eog, py::arg("token"), Release())
        .def("token_bos", [](const Engine & e) { return e.special_token("bos"); }, Release())
        .def("token_eos", [](const Engine & e) { return e.special_token("eos"); }, Release())
        .def("token_eot", [](const Engine & e) { return e.special_token("eot"); }, Release())
        .def("add_bos", &Engine::add_bos, Release())
        .def("n_vocab", &Engine::n_vocab)
        .def("n_ctx", &Engine::n_ctx)
        .def("n_seq_max", &Engine::n_seq_max)
        .def("chat_template", [](const Engine & e) -> py::object {
            bool found = false;
            std::string t;
            { py::gil_scoped_release r; t = e.chat_template(found); }
            if (!found) return py::none();
            return py::str(t);
        })
        .def("metadata", &Engine::metadata, Release())
        .def("capabilities", [](const Engine & e) {
            std::map<std::string, std::string> strings;
            int n_ctx_train = 0;
            { py::gil_scoped_release r; strings = e.capabilities_strings(); n_ctx_train = e.n_ctx_train(); }
            py::dict d;
            d["n_ctx"] = e.n_ctx();
            d["n_seq_max"] = e.n_seq_max();
            d["n_vocab"] = e.n_vocab();
            d["n_ctx_train"] = n_ctx_train;
            d["can_shift"] = e.can_shift();
            d["recurrent"] = e.recurrent();
            d["hybrid"] = e.hybrid();
            d["n_swa"] = e.n_swa();
            d["sliding_window"] = e.n_swa() > 0;
            d["mrope"] = e.mrope();
            d["truncate"] = !e.recurrent_state();
            py::list modes; modes.append("exact");
            // splice removes a middle range and shifts positions: attention-only memories with shifting
            if (e.can_shift() && !e.recurrent_state() && !e.mrope()) modes.append("splice");
            d["rebase_modes"] = py::tuple(modes);
            d["kv_unified"] = true;
            for (auto & [k, v] : strings) d[py::str(k)] = v;
            return d;
        })
        .def("seq_create", &Engine::seq_create, Release())
        .def("seq_append", [](Engine & e, uint64_t h, const std::vector<llama_token> & t, int kind, bool all) {
            return e.seq_append(h, t, (RowKind) kind, all);
        }, py::arg("handle"), py::arg("tokens"), py::arg("kind"), py::arg("all_logits"), Release())
        .def("seq_probe", &Engine::seq_probe, py::arg("handle"), py::arg("tokens"), py::arg("label_tokens"), Release())
        .def("seq_logits", [](Engine & e, uint64_t h) {
            std::vector<float> v;
            { py::gil_scoped_release r; v = e.seq_logits(h); }
            return to_numpy(std::move(v), -1, 0);
        }, py::arg("handle"))
        .def("seq_tokens", &Engine::seq_tokens, py::arg("handle"), Release())
        .def("seq_len", &Engine::seq_len, py::arg("handle"), Release())
        .def("seq_pos_range", &Engine::seq_pos_range, py::arg("handle"), Release())
        .def("seq_spliced", &Engine::seq_spliced, py::arg("handle"), Release())
        .def("seq_slot", &Engine::seq_slot, py::arg("handle"), Release())
        .def("seq_fork", &Engine::seq_fork, py::arg("handle"), py::arg("n_tokens") = -1, Release())
        .def("seq_truncate", &Engine::seq_truncate, py::arg("handle"), py::arg("n_tokens"), Release())
        .def("seq_close", &Engine::seq_close, py::arg("handle"), Release())
        .def("seq_close_later", &Engine::seq_close_later, py::arg("handle"), Release())
        .def("seq_generate", [](Engine & e, uint64_t h, int max_tokens, float temperature, float top_p, int64_t seed,
                                const std::vector<llama_token> & stop_tokens, const std::vector<std::string> & stop_strings,
                                const std::string & grammar, int kind, int top_k, float min_p) {
            SamplingParams sp;
            sp.temperature = temperature; sp.top_p = top_p; sp.grammar = grammar;
            sp.top_k = top_k; sp.min_p = min_p;
            sp.seed = seed < 0 ? 0xFFFFFFFFu : (uint32_t) (seed % 0xFFFFFFFFll);
            return e.seq_generate(h, max_tokens, sp, stop_tokens, stop_strings, (RowKind) kind);
        }, py::arg("handle"), py::arg("max_tokens"), py::arg("temperature"), py::arg("top_p"), py::arg("seed"),
           py::arg("stop_tokens"), py::arg("stop_strings"), py::arg("grammar"), py::arg("kind"),
           py::arg("top_k") = 0, py::arg("min_p") = 0.0f, Release())
        .def("prepare_rebase", [](Engine & e, uint64_t h, size_t kp, const std::vector<llama_token> & repl, size_t kf, bool splice) {
            return e.prepare_rebase(h, kp, repl, kf, splice);
        }, py::arg("handle"), py::arg("keep_prefix"), py::arg("replacement"), py::arg("keep_from"), py::arg("splice"),
           Release())
        .def("commit_rebase", &Engine::commit_rebase, py::arg("handle"), py::arg("rebase_id"), Release())
        .def("cancel_rebase", &Engine::cancel_rebase, py::arg("rebase_id"), Release())
        .def("cancel_rebase_later", &Engine::cancel_rebase_later, py::arg("rebase_id"), Release())
        .def("rebase_target_len", &Engine::rebase_target_len, py::arg("rebase_id"), Release())
        .def("seq_export", [](Engine & e, uint64_t h) {
            // (tokens, evaluated, logits float32 or empty, state bytes)
            SeqSnapshot snap;
            { py::gil_scoped_release r; snap = e.seq_export(h); }
            py::bytes state(reinterpret_cast<const char *>(snap.state.data()), (py::ssize_t) snap.state.size());
            py::object exact = snap.exact_upto == (size_t) -1 ? py::object(py::none()) : py::object(py::int_(snap.exact_upto));
            return py::make_tuple(std::move(snap.tokens), snap.evaluated, to_numpy(std::move(snap.logits), -1, 0), state,
                                  exact);
        }, py::arg("handle"))
        .def("seq_import", [](Engine & e, const std::vector<llama_token> & tokens, size_t evaluated,
                              py::array_t<float, py::array::c_style | py::array::forcecast> logits, py::buffer state,
                              std::optional<size_t> exact_upto) {
            std::vector<float> l(logits.data(), logits.data() + logits.size());
            py::buffer_info info = state.request();  // held until we return: the bytes stay alive and unmoved
            if (info.ndim != 1 || info.itemsize != 1 || (info.size > 1 && info.strides[0] != 1))
                throw std::invalid_argument("state must be a contiguous 1-D byte buffer");
            py::gil_scoped_release r;
            return e.seq_import(tokens, evaluated, l, static_cast<const uint8_t *>(info.ptr), (size_t) info.size,
                                exact_upto.value_or((size_t) -1));
        }, py::arg("tokens"), py::arg("evaluated"), py::arg("logits"), py::arg("state"), py::arg("exact_upto") = py::none())
        .def("stats", &Engine::stats, Release())
        .def("tokens_per_sequence", &Engine::tokens_per_sequence, Release())
        .def("used_cells", &Engine::used_cells, Release())
        .def("free_cells", &Engine::free_cells, Release())
        .def("inject_decode_failures", &Engine::inject_decode_failures, py::arg("count"), py::arg("rc"),
             py::arg("min_rows") = 1, py::arg("after") = false, Release());
}
