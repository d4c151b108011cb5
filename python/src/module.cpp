// python/src/module.cpp: the extension module `hybridcache._hybridcache` (nanobind).
//
// This file: the exceptions, the version, hcbench's commands run in-process (what
// `hybridcache.replay` and `hybridcache.compare` call, python/hybridcache/_harness.py) and the
// exact tokenizer. runtime.cpp: cost models, presets and the prefix cache with its lifecycle
// over a pool. The Python-facing API and its documentation: docs/python.md.
//
// Every call that runs for long (a replay, a batch of encodes) releases the GIL; the objects
// it reads are owned by C++ for the call's duration, never Python objects.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>

#include "cli_support.hpp"
#include "command.hpp"
#include "errors.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridcache::python {

// ---- exceptions ----------------------------------------------------------------------------
namespace {
PyObject* g_error = nullptr;          // hybridcache.Error(RuntimeError)
PyObject* g_invalid = nullptr;        // hybridcache.InvalidArgument(Error, ValueError)
PyObject* g_format = nullptr;         // hybridcache.FormatError(InvalidArgument)
PyObject* g_capacity = nullptr;       // hybridcache.OutOfCapacity(Error)
PyObject* g_handle = nullptr;         // hybridcache.HandleError(Error): a stale, ended or foreign ticket

PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("hybridcache.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

/// Raises `cls(message)` with `.code` set (the library's errc name, or None).
void raise_with_code(PyObject* cls, const std::string& message, const char* code) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
  if (text == nullptr) return;
  PyObject* inst = PyObject_CallOneArg(cls, text);
  Py_DECREF(text);
  if (inst == nullptr) return;  // the constructor's own error stands
  PyObject* c = code != nullptr ? PyUnicode_FromString(code) : (Py_INCREF(Py_None), Py_None);
  if (c != nullptr) {
    PyObject_SetAttrString(inst, "code", c);
    Py_DECREF(c);
  }
  PyErr_SetObject(cls, inst);
  Py_DECREF(inst);
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const library_error& e) {  // an expected<> error of a runtime call (errors.hpp)
    PyObject* cls = g_error;
    switch (e.code) {
      case errc::invalid_argument: cls = g_invalid; break;
      case errc::out_of_capacity: cls = g_capacity; break;
      case errc::stale_handle:
      case errc::double_free:
      case errc::foreign_handle: cls = g_handle; break;
      default: break;
    }
    raise_with_code(cls, e.what(), std::string(to_string(e.code)).c_str());
  } catch (const hybridcache::format_error& e) {
    raise_with_code(g_format, hcbench::strip_library_prefix(e.what()), "invalid_argument");
  } catch (const hybridcache::invalid_argument& e) {
    raise_with_code(g_invalid, hcbench::strip_library_prefix(e.what()), "invalid_argument");
  } catch (const hybridcache::capacity_error& e) {
    raise_with_code(g_capacity, hcbench::strip_library_prefix(e.what()), "out_of_capacity");
  } catch (const hybridcache::handle_error& e) {
    raise_with_code(g_handle, hcbench::strip_library_prefix(e.what()), nullptr);
  } catch (const hybridcache::error& e) {
    raise_with_code(g_error, hcbench::strip_library_prefix(e.what()), nullptr);
  } catch (const hcbench::input_error& e) {  // bad input in a trace file: FILE:LINE: field ...
    raise_with_code(g_format, e.what(), "invalid_argument");
  } catch (const CLI::ParseError& e) {  // a value hcbench's option parser refuses
    raise_with_code(g_invalid, e.what(), "invalid_argument");
  }
}
}  // namespace

// ---- hcbench's commands, in-process -------------------------------------------------------
namespace {
/// hcbench's commands bind their options to one static struct each and read process-wide
/// state (the command line for the JSON's provenance): one command runs at a time.
std::mutex g_command_mutex;

const hcbench::command& find_command(const std::string& name) {
  for (const auto& c : hcbench::registry())
    if (c.name == name) return c;
  throw hybridcache::invalid_argument("no hcbench command '" + name + "'");
}

/// The command's options as hcbench defines them: (name without dashes, takes no value,
/// repeatable). python/hybridcache/_harness.py turns keyword arguments into these.
std::vector<std::tuple<std::string, bool, bool>> command_options(const std::string& name) {
  std::lock_guard lock(g_command_mutex);
  CLI::App app;
  CLI::App* sub = app.add_subcommand(name);
  find_command(name).setup(*sub);
  std::vector<std::tuple<std::string, bool, bool>> out;
  for (const CLI::Option* o : sub->get_options()) {
    if (o->get_lnames().empty() || o->get_lnames().front() == "help") continue;
    out.emplace_back(o->get_lnames().front(), o->get_expected_max() == 0, o->get_expected_max() > 1);  // add_flag: expected(0)
  }
  return out;
}

/// hcbench prints its results with printf. glibc's `stdout` is an assignable variable (the
/// GNU C Library manual, "Standard Streams"), so for the call it points at an in-memory
/// stream and the text comes back to the caller instead of the process's standard output.
/// Python's own sys.stdout writes to file descriptor 1 through its io objects and is not
/// affected; C code in another thread that printf's during a replay would be captured.
class stdout_capture {
 public:
  stdout_capture() {
    std::fflush(stdout);
    mem_ = open_memstream(&buf_, &len_);
    if (mem_ == nullptr) throw hybridcache::error("cannot open an in-memory stream for hcbench's output");
    saved_ = stdout;
    stdout = mem_;
  }
  ~stdout_capture() {
    stdout = saved_;
    std::fclose(mem_);
    std::free(buf_);
  }
  stdout_capture(const stdout_capture&) = delete;
  stdout_capture& operator=(const stdout_capture&) = delete;
  std::string text() {
    std::fflush(mem_);
    return std::string(buf_ != nullptr ? buf_ : "", len_);
  }

 private:
  char* buf_ = nullptr;
  std::size_t len_ = 0;
  FILE* mem_ = nullptr;
  FILE* saved_ = nullptr;
};

/// Runs `hcbench NAME ARGS...` in this process; returns what it printed. Errors are thrown as
/// hcbench's own exceptions (translated above) with the message the CLI would print.
std::string run_command(const std::string& name, const std::vector<std::string>& args) {
  std::lock_guard lock(g_command_mutex);
  CLI::App app{"hcbench"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // as main.cpp
  const hcbench::command& c = find_command(name);
  c.setup(*app.add_subcommand(c.name, c.help));
  std::vector<std::string> argv{"hcbench", name};
  argv.insert(argv.end(), args.begin(), args.end());
  hcbench::invocation() = argv;  // the JSON's "command": the equivalent hcbench command line
  std::vector<const char*> cargv;
  for (const auto& a : argv) cargv.push_back(a.c_str());
  stdout_capture out;
  app.parse(static_cast<int>(cargv.size()), cargv.data());
  return out.text();
}
}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------
namespace {
using ids_array = nb::ndarray<nb::numpy, token_id, nb::ndim<1>>;

/// A vector handed to NumPy without a copy: the array owns it through a capsule.
ids_array to_array(std::vector<token_id>&& v) {
  auto* owned = new std::vector<token_id>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<token_id>*>(p); });
  return ids_array(owned->data(), {owned->size()}, owner);
}

/// `bpe_tokenizer::encode` keeps a cache of recent pieces, so one instance serves one thread
/// at a time: `encode` locks the first; `encode_batch` gives each worker thread a copy of its
/// own (made once, kept).
class tokenizer {
 public:
  explicit tokenizer(hybridcache::sim::bpe_tokenizer t, std::string path) : path_(std::move(path)) {
    workers_.push_back(std::make_unique<hybridcache::sim::bpe_tokenizer>(std::move(t)));
    build_decode_table();
  }
  static tokenizer from_file(const std::string& path) {
    return tokenizer(hybridcache::sim::bpe_tokenizer::from_file(path), path);
  }

  std::vector<token_id> encode(std::string_view text, bool add_special_tokens) {
    std::lock_guard lock(*mutex_);
    std::vector<token_id> out;
    if (add_special_tokens) workers_[0]->encode_with_special_tokens(text, out);
    else workers_[0]->encode(text, out);
    return out;
  }

  std::vector<std::vector<token_id>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                  std::size_t threads) {
    std::lock_guard lock(*mutex_);
    std::vector<std::vector<token_id>> out(texts.size());
    std::size_t bytes = 0;
    for (const auto& t : texts) bytes += t.size();
    // Threads only where there is work for them: below ~64 KiB a thread costs more than it saves.
    const std::size_t want = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
    const std::size_t n = std::max<std::size_t>(1, std::min({want, texts.size(), bytes / (64 << 10) + 1}));
    while (workers_.size() < n) workers_.push_back(std::make_unique<hybridcache::sim::bpe_tokenizer>(*workers_[0]));
    auto work = [&](std::size_t w) {
      for (std::size_t i = w; i < texts.size(); i += n) {
        if (add_special_tokens) workers_[w]->encode_with_special_tokens(texts[i], out[i]);
        else workers_[w]->encode(texts[i], out[i]);
      }
    };
    if (n == 1) {
      work(0);
      return out;
    }
    std::vector<std::exception_ptr> errors(n);
    std::vector<std::thread> pool;
    for (std::size_t w = 0; w < n; ++w)
      pool.emplace_back([&, w] {
        try {
          work(w);
        } catch (...) {
          errors[w] = std::current_exception();
        }
      });
    for (auto& t : pool) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return out;
  }

  /// The text of `ids`: each id's bytes (a vocabulary entry's byte-level spelling turned back
  /// into bytes; an added token's content), concatenated, then invalid UTF-8 replaced by
  /// U+FFFD as the `tokenizers` package's ByteLevel decoder does. Special tokens are left out
  /// when `skip_special_tokens` (that package's default).
  std::string decode(const token_id* ids, std::size_t n, bool skip_special_tokens) const {
    std::string bytes;
    for (std::size_t i = 0; i < n; ++i) {
      const token_id id = ids[i];
      if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size() || !known_[static_cast<std::size_t>(id)])
        throw hybridcache::invalid_argument("decode: id " + std::to_string(id) + " (at " + std::to_string(i) +
                                            ") is not in the vocabulary");
      if (skip_special_tokens && special_[static_cast<std::size_t>(id)]) continue;
      bytes += pieces_[static_cast<std::size_t>(id)];
    }
    std::string text;
    hybridcache::sim::utf8_replace_invalid(bytes, text);
    return text;
  }

  [[nodiscard]] std::size_t vocab_size() const { return workers_[0]->vocab_size(); }
  [[nodiscard]] bool fast_encoder() const { return workers_[0]->fast_encoder(); }
  [[nodiscard]] token_id token_to_id(std::string_view token) const { return workers_[0]->token_to_id(token); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  void build_decode_table() {
    workers_[0]->for_each_token([&](token_id id, std::string_view bytes, bool special) {
      if (id < 0) return;
      const auto i = static_cast<std::size_t>(id);
      if (i >= pieces_.size()) {
        pieces_.resize(i + 1);
        known_.resize(i + 1, false);
        special_.resize(i + 1, false);
      }
      pieces_[i] = std::string(bytes);
      known_[i] = true;
      special_[i] = special;
    });
  }

  std::string path_;
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();  // movable: from_file returns by value
  std::vector<std::unique_ptr<hybridcache::sim::bpe_tokenizer>> workers_;
  std::vector<std::string> pieces_;
  std::vector<bool> known_, special_;
};
}  // namespace

void bind_runtime(nb::module_& m);  // runtime.cpp

}  // namespace hybridcache::python

NB_MODULE(_hybridcache, m) {
  namespace py = hybridcache::python;
  m.doc() = "hybridcache's C++ core (nanobind). Use the package `hybridcache`; docs/python.md.";
  m.attr("__version__") = HYBRIDCACHE_VERSION;
  m.attr("build_version") = hcbench::version_string();  // `hcbench --version` without "hcbench "
  // PrefixCache(redis_tier=...) needs hiredis at build time (Debian libhiredis-dev).
  m.attr("has_redis_tier") = HCBENCH_HAS_REDIS != 0;

  {
    using namespace py;
    g_error = new_exception(m, "Error", PyExc_RuntimeError, "Base of every error hybridcache raises.");
    PyObject* invalid_bases = PyTuple_Pack(2, g_error, PyExc_ValueError);
    g_invalid = new_exception(m, "InvalidArgument", invalid_bases,
                              "Invalid input or configuration; the message names the argument and its value.");
    Py_DECREF(invalid_bases);
    g_format = new_exception(m, "FormatError", g_invalid, "Malformed input data (a trace line, a tokenizer.json).");
    g_capacity = new_exception(m, "OutOfCapacity", g_error,
                               "The cache cannot hold the request beside what is pinned and reserved; nothing changed.");
    g_handle = new_exception(m, "HandleError", g_error,
                             "A ticket that already ended (finish/abort), was ended by clear(), or is another cache's.");
    nb::register_exception_translator(&translate);
  }

  m.def("_command_options", &py::command_options, "command"_a,
        "hcbench COMMAND's options as (name, is_flag, repeatable); _harness.py maps keywords onto them.");
  m.def("_run_command", &py::run_command, "command"_a, "args"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Runs `hcbench COMMAND ARGS...` in this process (GIL released) and returns what it printed.");

  nb::class_<py::tokenizer>(m, "Tokenizer",
                            "A Hugging Face tokenizer.json's byte-level BPE, ids equal to the `tokenizers` package's.")
      .def_static("from_file", &py::tokenizer::from_file, "path"_a, nb::call_guard<nb::gil_scoped_release>(),
                  "Reads a tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen 2 style).")
      .def(
          "encode",
          [](py::tokenizer& t, const std::string& text, bool add_special_tokens) {
            std::vector<hybridcache::token_id> ids;
            {
              nb::gil_scoped_release release;
              ids = t.encode(text, add_special_tokens);
            }
            return py::to_array(std::move(ids));
          },
          "text"_a, "add_special_tokens"_a = false,
          "The ids of `text` as an int32 array (`add_special_tokens`: the post-processor's BOS/EOS too, the "
          "package's default; False is what a server does with a rendered chat prompt).")
      .def(
          "encode_batch",
          [](py::tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens, std::size_t threads) {
            std::vector<std::vector<hybridcache::token_id>> all;
            {
              nb::gil_scoped_release release;
              all = t.encode_batch(texts, add_special_tokens, threads);
            }
            nb::list out;
            for (auto& ids : all) out.append(py::to_array(std::move(ids)));
            return out;
          },
          "texts"_a, "add_special_tokens"_a = false, "threads"_a = 0,
          "The ids of each text (a list of int32 arrays), on up to `threads` threads (0: one per core).")
      .def(
          "decode",
          [](const py::tokenizer& t, nb::handle ids, bool skip_special_tokens) {
            const std::vector<std::int64_t> v = py::int_sequence(ids, "ids", 0, std::numeric_limits<hybridcache::token_id>::max());
            const std::vector<hybridcache::token_id> id32(v.begin(), v.end());
            std::string text;
            {
              nb::gil_scoped_release release;
              text = t.decode(id32.data(), id32.size(), skip_special_tokens);
            }
            return text;
          },
          "ids"_a, "skip_special_tokens"_a = true,
          "The text of `ids` (a list or 1-D integer array); special tokens left out unless skip_special_tokens=False, "
          "as the `tokenizers` package does.")
      .def_prop_ro("vocab_size", &py::tokenizer::vocab_size)
      .def_prop_ro("fast_encoder", &py::tokenizer::fast_encoder,
                   "Whether the backtracking encoder runs (every byte in the vocabulary, merges in rank order).")
      .def_prop_ro("path", &py::tokenizer::path)
      .def("token_to_id", &py::tokenizer::token_to_id, "token"_a, "The id of a vocabulary entry or added token, or -1.");

  py::bind_runtime(m);
}
