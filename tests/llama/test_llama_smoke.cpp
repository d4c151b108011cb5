// Smoke tests of llama.cpp (libllama's C API, llama.h) on the random-weight hybrid models that
// scripts/llama_models.py writes (via scripts/llama.sh). One ctest entry per model:
//
//   HYBRIDCACHE_LLAMA_MODEL  the .gguf file
//   HYBRIDCACHE_LLAMA_CASES  chat_cases.txt (conversations, their ChatML rendering and the ids
//                            the Hugging Face `tokenizers` package gives them)
//   HYBRIDCACHE_LLAMA_ARCH   the architecture the file must declare (qwen35, nemotron_h)
//
// What must hold:
//  - the model loads as a hybrid (attention + recurrent) model with the trained vocabulary and
//    a ChatML template that llama.cpp recognises;
//  - llama.cpp renders each conversation with that template as ChatML, and tokenizes it
//    (specials parsed, as llama-server does for a chat prompt) into exactly the package's ids;
//  - greedy decoding is deterministic, logits bit for bit;
//  - a recurrent-state snapshot (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) taken at q, restored into
//    a sequence that holds the attention KV past q and truncated there, continues
//    bit-identically to the uninterrupted run; with one KV stream per sequence, so does the
//    whole sequence state (no flag) set into an empty sequence, and a state rebuilt from
//    per-token attention KV rows (cut out of a full state taken at q) for a shorter prefix
//    q' < q plus the recurrent snapshot taken at q', which also reads back byte for byte
//    (docs/llama_cpp.md, "llama.cpp's sequence state, as read from its sources"), with and
//    without flash attention.
// Prefill speed with one thread, the state sizes and the outcomes that are not required (the
// unified cache, cells out of position order) are printed, not asserted.
#include <doctest/doctest.h>

#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the process: with one thread, what the prefill costs whatever else the machine runs.
double cpu_ms() {
  return 1000.0 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// --- the model, loaded once per process -------------------------------------------------

struct Model {
  llama_model* model = nullptr;
  const llama_vocab* vocab = nullptr;
  std::string arch;
  Model() {
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    const std::string path = env("HYBRIDCACHE_LLAMA_MODEL");
    if (path.empty()) throw std::runtime_error("HYBRIDCACHE_LLAMA_MODEL is not set");
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model = llama_model_load_from_file(path.c_str(), mp);
    if (model == nullptr) throw std::runtime_error("cannot load " + path);
    vocab = llama_model_get_vocab(model);
    char buf[128] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", buf, sizeof buf) > 0) arch = buf;
  }
  ~Model() {
    if (model != nullptr) llama_model_free(model);
  }
};

Model& the_model() {
  static Model m;
  return m;
}

struct Ctx {
  llama_context* ctx = nullptr;
  explicit Ctx(uint32_t n_ctx = 8192, uint32_t n_seq = 4, int threads = 1,
               llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO, bool unified = true) {
    auto cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = n_seq;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.kv_unified = unified;  // true: one cache for all sequences, as llama-server runs its slots
    cp.flash_attn_type = fa;  // AUTO (llama-server's default) turns it on for the CPU backend
    cp.no_perf = false;
    ctx = llama_init_from_model(the_model().model, cp);
    if (ctx == nullptr) throw std::runtime_error("llama_init_from_model failed");
  }
  ~Ctx() { llama_free(ctx); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  llama_memory_t mem() const { return llama_get_memory(ctx); }
};

std::vector<llama_token> tokenize(const std::string& text) {
  const auto* vocab = the_model().vocab;
  int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), nullptr, 0, true, true);
  std::vector<llama_token> ids(static_cast<size_t>(n < 0 ? -n : n));
  n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()), true, true);
  REQUIRE(n == static_cast<int>(ids.size()));
  return ids;
}

std::string detokenize(const std::vector<llama_token>& ids) {
  std::string out(ids.size() * 16 + 64, '\0');
  int n = llama_detokenize(the_model().vocab, ids.data(), static_cast<int32_t>(ids.size()), out.data(),
                           static_cast<int32_t>(out.size()), /*remove_special=*/false, /*unparse_special=*/true);
  REQUIRE(n >= 0);
  out.resize(static_cast<size_t>(n));
  return out;
}

// Decodes tokens [begin, end) of `ids` for `seq` at positions begin.., in batches that end at
// every position of `cuts` inside the range (and at most n_batch long). Returns the logits of
// the last token.
std::vector<float> prefill(Ctx& c, llama_seq_id seq, const std::vector<llama_token>& ids, size_t begin, size_t end,
                           std::vector<size_t> cuts = {}) {
  cuts.push_back(end);
  std::sort(cuts.begin(), cuts.end());
  const size_t n_batch = llama_n_batch(c.ctx);
  llama_batch b = llama_batch_init(static_cast<int32_t>(n_batch), 0, 1);
  size_t pos = begin;
  for (size_t cut : cuts) {
    if (cut <= pos || cut > end) continue;
    while (pos < cut) {
      const size_t n = std::min(n_batch, cut - pos);
      b.n_tokens = static_cast<int32_t>(n);
      for (size_t i = 0; i < n; ++i) {
        b.token[i] = ids[pos + i];
        b.pos[i] = static_cast<llama_pos>(pos + i);
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq;
        b.logits[i] = (pos + i + 1 == end) ? 1 : 0;
      }
      const int rc = llama_decode(c.ctx, b);
      if (rc != 0) {
        llama_batch_free(b);
        FAIL("llama_decode returned " << rc);
      }
      pos += n;
    }
  }
  llama_batch_free(b);
  const int n_vocab = llama_vocab_n_tokens(the_model().vocab);
  const float* l = llama_get_logits_ith(c.ctx, -1);
  REQUIRE(l != nullptr);
  return std::vector<float>(l, l + n_vocab);
}

llama_token argmax(const std::vector<float>& logits) {
  return static_cast<llama_token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct Run {
  std::vector<llama_token> tokens;          // greedy tokens
  std::vector<std::vector<float>> logits;   // the logits each was chosen from
};

// Greedy decoding of n tokens for `seq`, whose last prefilled token is at position pos-1 and
// gave `first` as its logits.
Run greedy(Ctx& c, llama_seq_id seq, llama_pos pos, std::vector<float> first, int n) {
  Run r;
  llama_batch b = llama_batch_init(1, 0, 1);
  const int n_vocab = llama_vocab_n_tokens(the_model().vocab);
  std::vector<float> cur = std::move(first);
  for (int i = 0; i < n; ++i) {
    const llama_token t = argmax(cur);
    r.tokens.push_back(t);
    r.logits.push_back(cur);
    b.n_tokens = 1;
    b.token[0] = t;
    b.pos[0] = pos++;
    b.n_seq_id[0] = 1;
    b.seq_id[0][0] = seq;
    b.logits[0] = 1;
    const int rc = llama_decode(c.ctx, b);
    if (rc != 0) {
      llama_batch_free(b);
      FAIL("llama_decode returned " << rc);
    }
    const float* l = llama_get_logits_ith(c.ctx, -1);
    cur.assign(l, l + n_vocab);
  }
  llama_batch_free(b);
  return r;
}

float max_abs_diff(const Run& a, const Run& b) {
  float m = 0;
  for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i)
    for (size_t j = 0; j < a.logits[i].size(); ++j) m = std::max(m, std::abs(a.logits[i][j] - b.logits[i][j]));
  return m;
}

bool identical(const Run& a, const Run& b) {
  if (a.tokens != b.tokens || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) return false;
  return true;
}

std::vector<uint8_t> get_state(Ctx& c, llama_seq_id seq, llama_state_seq_flags flags) {
  std::vector<uint8_t> buf(llama_state_seq_get_size_ext(c.ctx, seq, flags));
  REQUIRE(!buf.empty());
  const size_t n = llama_state_seq_get_data_ext(c.ctx, buf.data(), buf.size(), seq, flags);
  REQUIRE(n == buf.size());
  return buf;
}

void set_state(Ctx& c, llama_seq_id seq, const std::vector<uint8_t>& buf, llama_state_seq_flags flags) {
  const size_t n = llama_state_seq_set_data_ext(c.ctx, buf.data(), buf.size(), seq, flags);
  REQUIRE(n == buf.size());
}

// --- the conversations ------------------------------------------------------------------

struct ChatCase {
  std::vector<std::pair<std::string, std::string>> messages;  // role, content
  std::string rendered;
  std::vector<llama_token> ids;
};

std::vector<ChatCase> read_cases(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<ChatCase> out;
  std::string line;
  auto read_bytes = [&](size_t n) {
    std::string s(n, '\0');
    f.read(s.data(), static_cast<std::streamsize>(n));
    if (f.get() != '\n') throw std::runtime_error(path + ": bad record");
    return s;
  };
  while (std::getline(f, line)) {
    std::istringstream h(line);
    std::string tag;
    size_t n_bytes = 0, n_ids = 0, n_msgs = 0;
    h >> tag >> n_bytes >> n_ids >> n_msgs;
    if (tag != "case" || !h) throw std::runtime_error(path + ": bad header: " + line);
    ChatCase c;
    for (size_t i = 0; i < n_msgs; ++i) {
      std::getline(f, line);
      std::istringstream mh(line);
      std::string role;
      size_t len = 0;
      mh >> role >> len;
      if (!mh) throw std::runtime_error(path + ": bad message header: " + line);
      c.messages.emplace_back(role, read_bytes(len));
    }
    c.rendered = read_bytes(n_bytes);
    std::getline(f, line);
    std::istringstream ids(line);
    llama_token t = 0;
    while (ids >> t) c.ids.push_back(t);
    if (c.ids.size() != n_ids) throw std::runtime_error(path + ": id count mismatch");
    out.push_back(std::move(c));
  }
  return out;
}

const std::vector<ChatCase>& cases() {
  static const std::vector<ChatCase> c = [] {
    const std::string path = env("HYBRIDCACHE_LLAMA_CASES");
    if (path.empty()) throw std::runtime_error("HYBRIDCACHE_LLAMA_CASES is not set");
    return read_cases(path);
  }();
  return c;
}

// A prompt of at least n tokens: conversations' ids one after another.
std::vector<llama_token> long_prompt(size_t n) {
  std::vector<llama_token> out;
  while (out.size() < n)
    for (const auto& c : cases()) {
      out.insert(out.end(), c.ids.begin(), c.ids.end());
      if (out.size() >= n) break;
    }
  out.resize(n);
  return out;
}

// --- the sequence state format (docs/llama_cpp.md) ----------------------------------------

struct Reader {
  const std::vector<uint8_t>& b;
  size_t off = 0;
  template <class T>
  T get() {
    T v;
    if (off + sizeof(T) > b.size()) throw std::runtime_error("state buffer too short");
    std::memcpy(&v, b.data() + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  const uint8_t* take(size_t n) {
    if (off + n > b.size()) throw std::runtime_error("state buffer too short");
    const uint8_t* p = b.data() + off;
    off += n;
    return p;
  }
};

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void put_bytes(const uint8_t* p, size_t n) { b.insert(b.end(), p, p + n); }
};

// The attention part of a hybrid sequence's full state, cut into per-token pieces.
struct KvLayer {
  int32_t k_type = 0;
  uint64_t k_row = 0;
  int32_t v_type = 0;
  uint64_t v_row = 0;      // row size when V is not transposed
  uint32_t v_el = 0;       // element size when it is
  uint32_t v_embd = 0;     // elements per V row when it is
};
struct KvToken {
  int32_t pos = 0;
  std::vector<uint8_t> meta_ext;  // llama_kv_cell_ext (12 bytes) when the cache keeps it, else empty
  std::vector<std::vector<uint8_t>> k, v;  // per attention layer
};
struct SplitState {
  uint32_t n_stream = 0, stream = 0;  // streams, and the one holding the sequence
  uint32_t v_trans = 0;
  std::vector<KvLayer> layers;
  std::vector<KvToken> tokens;      // in buffer (cell) order
  std::vector<uint8_t> recurrent;   // the recurrent part, as written (cell count, meta, rows)
};

SplitState split_full_state(const std::vector<uint8_t>& buf, bool has_ext) {
  Reader r{buf};
  SplitState s;
  REQUIRE(r.get<uint32_t>() == 0xaf143cd8u);  // the sequence-state magic
  r.get<int32_t>();                             // source seq id
  s.n_stream = r.get<uint32_t>();
  bool seen = false;
  for (uint32_t st = 0; st < s.n_stream; ++st) {
    const uint32_t cells = r.get<uint32_t>();
    if (cells == 0) continue;
    REQUIRE_FALSE(seen);
    seen = true;
    s.stream = st;
    s.tokens.resize(cells);
    for (auto& t : s.tokens) {
      t.pos = r.get<int32_t>();
      REQUIRE(r.get<uint32_t>() == 1u);  // n_seq_id: one sequence per cell in a sequence state
      if (has_ext) {
        const uint8_t* e = r.take(12);  // llama_kv_cell_ext: x, y, token
        t.meta_ext.assign(e, e + 12);
      }
      r.get<int32_t>();                  // the seq id (ignored on reading)
    }
    s.v_trans = r.get<uint32_t>();
    const uint32_t n_layer = r.get<uint32_t>();
    s.layers.resize(n_layer);
    for (auto& t : s.tokens) {
      t.k.resize(n_layer);
      t.v.resize(n_layer);
    }
    for (auto& l : s.layers) {
      l.k_type = r.get<int32_t>();
      l.k_row = r.get<uint64_t>();
      const size_t il = static_cast<size_t>(&l - s.layers.data());
      for (auto& t : s.tokens) {
        const uint8_t* p = r.take(l.k_row);
        t.k[il].assign(p, p + l.k_row);
      }
    }
    for (auto& l : s.layers) {
      const size_t il = static_cast<size_t>(&l - s.layers.data());
      l.v_type = r.get<int32_t>();
      if (s.v_trans == 0) {
        l.v_row = r.get<uint64_t>();
        for (auto& t : s.tokens) {
          const uint8_t* p = r.take(l.v_row);
          t.v[il].assign(p, p + l.v_row);
        }
      } else {
        l.v_el = r.get<uint32_t>();
        l.v_embd = r.get<uint32_t>();
        for (auto& t : s.tokens) t.v[il].resize(static_cast<size_t>(l.v_el) * l.v_embd);
        for (uint32_t j = 0; j < l.v_embd; ++j)
          for (auto& t : s.tokens) std::memcpy(t.v[il].data() + j * l.v_el, r.take(l.v_el), l.v_el);
      }
    }
  }
  REQUIRE(seen);
  s.recurrent.assign(buf.begin() + static_cast<std::ptrdiff_t>(r.off), buf.end());
  return s;
}

// A full sequence state for the tokens at positions [0, q) of `s`, with the recurrent part of
// `partial` (a PARTIAL_ONLY state: magic, seq id, then the recurrent part).
// The cells are listed in position order, or (rotate > 0) starting at position `rotate`.
std::vector<uint8_t> build_full_state(const SplitState& s, int32_t q, const std::vector<uint8_t>& partial, llama_seq_id seq,
                                      int32_t rotate = 0) {
  std::vector<const KvToken*> toks;
  for (const auto& t : s.tokens)
    if (t.pos < q) toks.push_back(&t);
  std::sort(toks.begin(), toks.end(), [](const KvToken* a, const KvToken* b) { return a->pos < b->pos; });
  REQUIRE(toks.size() == static_cast<size_t>(q));
  std::rotate(toks.begin(), toks.begin() + rotate, toks.end());
  Writer w;
  w.put<uint32_t>(0xaf143cd8u);
  w.put<int32_t>(seq);
  w.put<uint32_t>(s.n_stream);
  // The cells go into the destination's stream (one per sequence without kv_unified); reading
  // maps any stream to the destination's anyway, but then the buffer reads back byte for byte.
  const uint32_t dest_stream = s.n_stream == 1 ? 0 : static_cast<uint32_t>(seq);
  for (uint32_t st = 0; st < s.n_stream; ++st) {
    if (st != dest_stream) {
      w.put<uint32_t>(0);
      continue;
    }
    w.put<uint32_t>(static_cast<uint32_t>(toks.size()));
    for (const auto* t : toks) {
      w.put<int32_t>(t->pos);
      w.put<uint32_t>(1);
      if (!t->meta_ext.empty()) w.put_bytes(t->meta_ext.data(), t->meta_ext.size());
      w.put<int32_t>(seq);
    }
    w.put<uint32_t>(s.v_trans);
    w.put<uint32_t>(static_cast<uint32_t>(s.layers.size()));
    for (size_t il = 0; il < s.layers.size(); ++il) {
      w.put<int32_t>(s.layers[il].k_type);
      w.put<uint64_t>(s.layers[il].k_row);
      for (const auto* t : toks) w.put_bytes(t->k[il].data(), t->k[il].size());
    }
    for (size_t il = 0; il < s.layers.size(); ++il) {
      const auto& l = s.layers[il];
      w.put<int32_t>(l.v_type);
      if (s.v_trans == 0) {
        w.put<uint64_t>(l.v_row);
        for (const auto* t : toks) w.put_bytes(t->v[il].data(), t->v[il].size());
      } else {
        w.put<uint32_t>(l.v_el);
        w.put<uint32_t>(l.v_embd);
        for (uint32_t j = 0; j < l.v_embd; ++j)
          for (const auto* t : toks) w.put_bytes(t->v[il].data() + j * l.v_el, l.v_el);
      }
    }
  }
  REQUIRE(partial.size() > 8);
  w.put_bytes(partial.data() + 8, partial.size() - 8);
  return w.b;
}

const std::vector<llama_token>& prompt() {
  static const std::vector<llama_token> p = long_prompt(1200);
  return p;
}

}  // namespace

TEST_CASE("llama: the model loads as a hybrid with the trained vocabulary and a ChatML template") {
  const auto& m = the_model();
  const std::string want = env("HYBRIDCACHE_LLAMA_ARCH");
  REQUIRE_FALSE(want.empty());
  CHECK(m.arch == want);
  CHECK(llama_model_is_hybrid(m.model));
  CHECK(llama_vocab_type(m.vocab) == LLAMA_VOCAB_TYPE_BPE);
  CHECK(llama_vocab_n_tokens(m.vocab) == 32000);
  CHECK(llama_model_n_ctx_train(m.model) >= 16384);
  const char* tmpl = llama_model_chat_template(m.model, nullptr);
  REQUIRE(tmpl != nullptr);
  CHECK(std::string(tmpl).find("<|im_start|>") != std::string::npos);
  CHECK(llama_vocab_eos(m.vocab) == tokenize("<|im_end|>").at(0));
  CHECK(llama_vocab_is_eog(m.vocab, tokenize("<|im_end|>").at(0)));
  CHECK(tokenize("<|im_start|>").size() == 1);
  MESSAGE(m.arch << ": " << llama_model_n_params(m.model) << " parameters, " << llama_model_n_layer(m.model)
                 << " layers, n_embd " << llama_model_n_embd(m.model));
}

TEST_CASE("llama: ChatML rendering and tokenization equal the tokenizers package's") {
  const auto& m = the_model();
  const char* tmpl = llama_model_chat_template(m.model, nullptr);
  REQUIRE(tmpl != nullptr);
  REQUIRE(cases().size() >= 10);
  size_t n_tokens = 0, mismatched = 0;
  for (const auto& c : cases()) {
    std::vector<llama_chat_message> msgs;
    for (const auto& [role, content] : c.messages) msgs.push_back({role.c_str(), content.c_str()});
    std::string out(c.rendered.size() * 2 + 256, '\0');
    const int n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, out.data(), static_cast<int32_t>(out.size()));
    REQUIRE(n > 0);
    out.resize(static_cast<size_t>(n));
    const bool rendered_equal = out == c.rendered;
    CHECK_MESSAGE(rendered_equal, "llama_chat_apply_template renders case " << (&c - cases().data()) << " differently");
    const auto ids = tokenize(c.rendered);
    n_tokens += ids.size();
    if (ids != c.ids) {
      ++mismatched;
      size_t i = 0;
      while (i < ids.size() && i < c.ids.size() && ids[i] == c.ids[i]) ++i;
      MESSAGE("first difference at token " << i << " of " << c.ids.size());
    }
    const bool round_trip = detokenize(ids) == c.rendered;
    CHECK_MESSAGE(round_trip, "case " << (&c - cases().data()) << " does not detokenize to its text");
  }
  CHECK(mismatched == 0);
  MESSAGE(cases().size() << " conversations, " << n_tokens << " tokens, " << mismatched << " tokenized differently");
}

TEST_CASE("llama: greedy decoding is deterministic") {
  const auto& p = prompt();
  Ctx c1;
  const Run a = greedy(c1, 0, static_cast<llama_pos>(p.size()), prefill(c1, 0, p, 0, p.size()), 24);
  Ctx c2;
  const Run b = greedy(c2, 0, static_cast<llama_pos>(p.size()), prefill(c2, 0, p, 0, p.size()), 24);
  CHECK(identical(a, b));
  // The same context again, after clearing its memory, and another sequence.
  llama_memory_clear(c1.mem(), true);
  const Run d = greedy(c1, 2, static_cast<llama_pos>(p.size()), prefill(c1, 2, p, 0, p.size()), 24);
  CHECK(identical(a, d));
  // Another batch split: report only (the CPU kernels may sum in another order).
  Ctx c3;
  const Run e = greedy(c3, 0, static_cast<llama_pos>(p.size()), prefill(c3, 0, p, 0, p.size(), {100, 333, 700}), 24);
  const std::string tokens_same = e.tokens == a.tokens ? "equal" : "DIFFERENT";
  const std::string logits_same = identical(a, e) ? "bit-identical" : "differ";
  MESSAGE("another batch split: greedy tokens " << tokens_same << ", logits " << logits_same << " (max |d| "
                                                << max_abs_diff(a, e) << ")");
}

TEST_CASE("llama: recurrent snapshots and sequence states restore exactly") {
  const auto& p = prompt();
  const size_t n = p.size();
  const size_t q = 700, q2 = 450;  // snapshot sites (prefill batches end there)
  const bool has_ext = the_model().arch == "qwen35";  // M-RoPE: the KV cells keep (x, y, token)
  // With flash attention (llama-server's default on the CPU) V is stored by rows; without it,
  // transposed. Both layouts must rebuild exactly. The attention kernels sum over KV cells in
  // cell order, in SIMD blocks: a restored sequence computes bit-identically only where its
  // cells sit as the reference's did. One stream per sequence (kv_unified = false) gives
  // that: a sequence state is set into its own emptied stream from cell 0, as a fresh prefill
  // fills it. In the unified cache (llama-server's) only a rewind in place is asserted.
  bool flash = true, unified = false;
  SUBCASE("flash attention, one stream per sequence") { flash = true; unified = false; }
  SUBCASE("no flash attention, one stream per sequence") { flash = false; unified = false; }
  SUBCASE("flash attention, unified cache") { flash = true; unified = true; }
  SUBCASE("no flash attention, unified cache") { flash = false; unified = true; }
  Ctx c(8192, 4, 1, flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED, unified);
  const std::string mode = std::string(flash ? "flash attention" : "no flash attention") +
                           (unified ? ", unified cache" : ", one stream per sequence");
  std::ostringstream report;

  // Reference: seq 0, batches cut at q2 and q; snapshots at both.
  prefill(c, 0, p, 0, q2);
  double t0 = now_ms();
  const auto partial_q2 = get_state(c, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const double save_ms = now_ms() - t0;
  prefill(c, 0, p, q2, q);
  const auto partial_q = get_state(c, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  t0 = now_ms();
  const auto full_q = get_state(c, 0, LLAMA_STATE_SEQ_FLAGS_NONE);
  const double full_save_ms = now_ms() - t0;
  const Run ref = greedy(c, 0, static_cast<llama_pos>(n), prefill(c, 0, p, q, n), 16);
  auto outcome = [&](const char* what, const Run& r) {
    const std::string same = identical(ref, r) ? "bit-identical" : "NOT bit-identical";
    const std::string toks = ref.tokens == r.tokens ? "equal" : "DIFFERENT";
    report << "\n  " << what << ": logits " << same << " (max |d| " << max_abs_diff(ref, r) << "), greedy tokens " << toks;
    return identical(ref, r);
  };

  // 1. Rewind in place: seq 1 prefilled to the end (batches cut at q2 and q as well), then the
  //    snapshot for q restored and the KV past q dropped.
  prefill(c, 1, p, 0, n, {q2, q});
  CHECK_FALSE(llama_memory_seq_rm(c.mem(), 1, static_cast<llama_pos>(q), -1));  // recurrent state is past q
  t0 = now_ms();
  set_state(c, 1, partial_q, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const double restore_ms = now_ms() - t0;
  REQUIRE(llama_memory_seq_rm(c.mem(), 1, static_cast<llama_pos>(q), -1));
  CHECK(llama_memory_seq_pos_max(c.mem(), 1) == static_cast<llama_pos>(q - 1));
  const Run r1 = greedy(c, 1, static_cast<llama_pos>(n), prefill(c, 1, p, q, n), 16);
  CHECK(outcome("rewind to q in place", r1));
  llama_memory_seq_rm(c.mem(), 1, -1, -1);

  // 2. The whole sequence state at q (attention KV + recurrent) set into an empty sequence.
  t0 = now_ms();
  set_state(c, 2, full_q, LLAMA_STATE_SEQ_FLAGS_NONE);
  const double full_restore_ms = now_ms() - t0;
  // A hybrid memory reports the larger of its two parts' minimum positions: the recurrent part
  // holds one cell, at q-1.
  CHECK(llama_memory_seq_pos_min(c.mem(), 2) == static_cast<llama_pos>(q - 1));
  CHECK(llama_memory_seq_pos_max(c.mem(), 2) == static_cast<llama_pos>(q - 1));
  const Run r2 = greedy(c, 2, static_cast<llama_pos>(n), prefill(c, 2, p, q, n), 16);
  const bool ok2 = outcome("whole state at q set into an empty sequence", r2);
  if (!unified) CHECK(ok2);
  llama_memory_seq_rm(c.mem(), 2, -1, -1);

  // 3. A state rebuilt from per-token KV rows: the first q2 tokens' rows cut out of the full
  //    state at q, with the recurrent snapshot taken at q2, set into a sequence (which held
  //    other tokens before). It must continue like the reference (which also cut its batches
  //    at q2 and q), and read back byte for byte.
  const SplitState split = split_full_state(full_q, has_ext);
  CHECK(split.tokens.size() == q);
  CHECK(split.v_trans == (flash ? 0u : 1u));
  // The cell metadata holds nothing a cache of tokens cannot rebuild: the position and, for
  // M-RoPE models, (x, y) = (pos, pos) for text and the token id.
  bool meta_ok = true;
  for (const auto& t : split.tokens) {
    meta_ok = meta_ok && t.pos >= 0 && static_cast<size_t>(t.pos) < q;
    if (has_ext && meta_ok) {
      int32_t ext[3];
      std::memcpy(ext, t.meta_ext.data(), sizeof ext);
      meta_ok = ext[0] == t.pos && ext[1] == t.pos && ext[2] == p[static_cast<size_t>(t.pos)];
    }
  }
  CHECK(meta_ok);
  CHECK(split.n_stream == (unified ? 1u : 4u));
  t0 = now_ms();
  const auto rebuilt = build_full_state(split, static_cast<int32_t>(q2), partial_q2, 3);
  const double build_ms = now_ms() - t0;
  prefill(c, 3, p, 0, 123);
  t0 = now_ms();
  set_state(c, 3, rebuilt, LLAMA_STATE_SEQ_FLAGS_NONE);
  const double rebuilt_restore_ms = now_ms() - t0;
  CHECK(llama_memory_seq_pos_max(c.mem(), 3) == static_cast<llama_pos>(q2 - 1));
  CHECK(get_state(c, 3, LLAMA_STATE_SEQ_FLAGS_NONE) == rebuilt);
  prefill(c, 3, p, q2, q);
  const Run r3 = greedy(c, 3, static_cast<llama_pos>(n), prefill(c, 3, p, q, n), 16);
  const bool ok3 = outcome("rebuilt from per-token rows for q' < q", r3);
  if (!unified) CHECK(ok3);
  llama_memory_seq_rm(c.mem(), 3, -1, -1);

  // 4. The same with other sequences' cells freed in between (a fragmented cache).
  prefill(c, 1, p, 0, 100);
  prefill(c, 2, p, 0, 300);
  llama_memory_seq_rm(c.mem(), 1, -1, -1);
  set_state(c, 3, rebuilt, LLAMA_STATE_SEQ_FLAGS_NONE);
  prefill(c, 3, p, q2, q);
  const Run r4 = greedy(c, 3, static_cast<llama_pos>(n), prefill(c, 3, p, q, n), 16);
  const bool ok4 = outcome("rebuilt, after other sequences came and went", r4);
  if (!unified) CHECK(ok4);
  llama_memory_seq_rm(c.mem(), 2, -1, -1);
  llama_memory_seq_rm(c.mem(), 3, -1, -1);

  // 5. Cells whose index order is not the position order (the buffer lists positions q2/2..
  //    before 0..): reported only.
  const auto rotated = build_full_state(split, static_cast<int32_t>(q2), partial_q2, 3, static_cast<int32_t>(q2 / 2));
  set_state(c, 3, rotated, LLAMA_STATE_SEQ_FLAGS_NONE);
  prefill(c, 3, p, q2, q);
  outcome("rebuilt with the cells out of position order", greedy(c, 3, static_cast<llama_pos>(n), prefill(c, 3, p, q, n), 16));
  llama_memory_seq_rm(c.mem(), 3, -1, -1);

  MESSAGE(mode << ": recurrent snapshot " << partial_q.size() << " B (save " << save_ms << " ms, restore " << restore_ms
          << " ms); full state at q=" << q << ": " << full_q.size() << " B (save " << full_save_ms << " ms, set "
          << full_restore_ms << " ms), " << (full_q.size() - partial_q.size() - 8 - 4 * split.n_stream) / q
          << " B of attention KV + cell metadata per token; V transposed " << split.v_trans << ", " << split.layers.size()
          << " attention layers, " << split.n_stream << " streams; state rebuilt for q'=" << q2 << ": " << rebuilt.size()
          << " B, built in " << build_ms << " ms, set in " << rebuilt_restore_ms << " ms" << report.str());
}

TEST_CASE("llama: prefill speed with one thread (printed)") {
  // The best of three prefills of 2,048 tokens (batches of 2,048, ubatches of 512): the machine
  // may be running other work.
  const auto p = long_prompt(2048);
  Ctx c(4096, 1, 1);
  prefill(c, 0, p, 0, 64);  // warm up
  double best_ms = 1e300, best_cpu_ms = 1e300;
  std::vector<float> logits;
  for (int rep = 0; rep < 3; ++rep) {
    llama_memory_clear(c.mem(), true);
    const double t0 = now_ms(), c0 = cpu_ms();
    logits = prefill(c, 0, p, 0, p.size());
    best_ms = std::min(best_ms, now_ms() - t0);
    best_cpu_ms = std::min(best_cpu_ms, cpu_ms() - c0);
  }
  const double t1 = now_ms();
  const Run r = greedy(c, 0, static_cast<llama_pos>(p.size()), logits, 32);
  const double dec_ms = now_ms() - t1;
  CHECK(r.tokens.size() == 32);
  MESSAGE(the_model().arch << ": prefill " << p.size() << " tokens in " << best_ms << " ms = " << (p.size() / (best_ms / 1000.0))
          << " tok/s with 1 thread (best of 3), " << (p.size() / (best_cpu_ms / 1000.0)) << " tokens per CPU second; decode "
          << (32 / (dec_ms / 1000.0)) << " tok/s");
}
