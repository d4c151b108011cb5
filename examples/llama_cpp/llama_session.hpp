// examples/llama_cpp/llama_session.hpp
//
// One llama.cpp model and context as hybridcache-llama uses them: the context has one KV
// stream per slot (kv_unified off), so a sequence set from a rebuilt state lands in cells
// 0..n-1 of its own stream, exactly where a prefill from scratch puts it (bit-identical
// continuations; docs/llama_cpp.md). The session learns the context's state layout from a
// probe, and describes the model to hybridcache's cost model (`make_spec`): layer counts and
// K/V row bytes from the state, shapes from the GGUF's metadata, sized so that a KV page
// holds `tokens_per_page` tokens of one attention layer's K and V rows and a state block one
// recurrent layer's conv and SSM rows, byte for byte.
//
// Also here: rendering a conversation with the model's chat template and tokenizing it as
// llama-server does for /v1/chat/completions (specials parsed, BOS as the vocabulary says).
#pragma once

#include <llama.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/model/model_spec.hpp"
#include "llama_state.hpp"

namespace hybridcache_llama {

namespace hc = hybridcache;

/// How the context is made (aggregate).
struct context_options {
  std::uint32_t slots = 4;            ///< sequences computed at once (one KV stream each)
  std::uint32_t ctx_per_slot = 16384; ///< cells per stream: the longest prompt + output
  std::uint32_t batch = 2048;         ///< tokens per llama_decode
  std::uint32_t ubatch = 512;
  std::int32_t threads = 1;
  bool flash_attn = true;             ///< llama-server's default on this CPU (-fa auto)
};

struct model_deleter {
  void operator()(llama_model* m) const noexcept { llama_model_free(m); }
};
struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};

/// A loaded model. @throws hc::invalid_argument for a file llama.cpp cannot load, or a model
/// that is not a hybrid of attention and recurrent layers.
class loaded_model {
 public:
  explicit loaded_model(const std::string& path) {
    static const bool backend = [] {
      llama_backend_init();
      llama_log_set([](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      }, nullptr);
      return true;
    }();
    (void)backend;
    llama_model_params p = llama_model_default_params();
    p.n_gpu_layers = 0;
    model_.reset(llama_model_load_from_file(path.c_str(), p));
    if (!model_) throw hc::invalid_argument("model '" + path + "': llama.cpp cannot load it (not a GGUF file, or not readable)");
    if (!llama_model_is_hybrid(model_.get()))
      throw hc::invalid_argument("model '" + path + "': not a hybrid model (attention + recurrent layers); hybridcache-llama caches hybrids");
    vocab_ = llama_model_get_vocab(model_.get());
    const char* t = llama_model_chat_template(model_.get(), nullptr);
    if (t == nullptr) throw hc::invalid_argument("model '" + path + "': no chat template in the GGUF (tokenizer.chat_template)");
    template_ = t;
  }
  [[nodiscard]] llama_model* get() const noexcept { return model_.get(); }
  [[nodiscard]] const llama_vocab* vocab() const noexcept { return vocab_; }

  /// A metadata value as text ("" when absent).
  [[nodiscard]] std::string meta(const std::string& key) const {
    char buf[256];
    const int n = llama_model_meta_val_str(model_.get(), key.c_str(), buf, sizeof buf);
    return n < 0 ? std::string() : std::string(buf, static_cast<std::size_t>(std::min<int>(n, sizeof buf - 1)));
  }
  [[nodiscard]] std::int64_t meta_int(const std::string& key, std::int64_t fallback = 0) const {
    const std::string v = meta(key);
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) return fallback;
    return std::stoll(v);
  }
  [[nodiscard]] std::string arch() const { return meta("general.architecture"); }

  /// The conversation rendered with the model's template, ending with the assistant's
  /// generation prompt, then tokenized with specials parsed (llama-server's chat path).
  /// @throws hc::invalid_argument when the template or the tokenizer refuses.
  [[nodiscard]] std::vector<llama_token> chat_prompt(std::span<const std::pair<std::string, std::string>> messages) const {
    return tokenize(render(messages, /*generation_prompt=*/true), /*special=*/true);
  }

  /// Where a chat prompt's system message ends, as a token position of `prompt` (=
  /// chat_prompt of the same messages): the state there is what a new conversation with the
  /// same system prompt reuses (llama-server checkpoints at the first user message for the
  /// same reason). The engine also keeps the state at the prompt's end, which the
  /// conversation's next turn reuses. A state before the last message was kept too at first:
  /// on agent trajectories it was never the deepest hit and cost a third of the checkpoint
  /// memory (24 episodes, 256 MiB pool: 70,983 tokens prefilled with it, 63,390 without,
  /// the keep-everything bound being 62,963). Empty when the system message's rendering is
  /// not a token prefix of the prompt.
  [[nodiscard]] std::vector<std::int64_t> message_boundaries(std::span<const std::pair<std::string, std::string>> messages,
                                                             std::span<const llama_token> prompt) const {
    std::vector<std::int64_t> out;
    auto add = [&](std::size_t k) {
      const auto t = tokenize(render(messages.first(k), /*generation_prompt=*/false), true);
      if (!t.empty() && t.size() < prompt.size() && std::equal(t.begin(), t.end(), prompt.begin()))
        out.push_back(static_cast<std::int64_t>(t.size()));
    };
    if (messages.size() >= 2 && messages[0].first == "system") add(1);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  /// Where the last assistant message's text starts in `prompt`: the end of the prompt an
  /// earlier request of this conversation was sent (the history before that reply, with the
  /// generation prompt), when it is a prefix of `prompt`; 0 otherwise. One tokenization.
  [[nodiscard]] std::int64_t last_turn_start(std::span<const std::pair<std::string, std::string>> messages,
                                             std::span<const llama_token> prompt) const {
    for (std::size_t k = messages.size(); k-- > 1;) {
      if (messages[k].first != "assistant") continue;
      const auto t = tokenize(render(messages.first(k), /*generation_prompt=*/true), true);
      if (!t.empty() && t.size() < prompt.size() && std::equal(t.begin(), t.end(), prompt.begin()))
        return static_cast<std::int64_t>(t.size());
      return 0;
    }
    return 0;
  }

  /// The conversation rendered with the model's chat template (text).
  [[nodiscard]] std::string render(std::span<const std::pair<std::string, std::string>> messages, bool generation_prompt) const {
    std::vector<llama_chat_message> m;
    m.reserve(messages.size());
    std::size_t chars = 0;
    for (const auto& [role, text] : messages) {
      m.push_back({role.c_str(), text.c_str()});
      chars += role.size() + text.size();
    }
    std::string out(2 * chars + 256, '\0');
    int n = llama_chat_apply_template(template_.c_str(), m.data(), m.size(), generation_prompt, out.data(), static_cast<int32_t>(out.size()));
    if (n > static_cast<int>(out.size())) {
      out.resize(static_cast<std::size_t>(n));
      n = llama_chat_apply_template(template_.c_str(), m.data(), m.size(), generation_prompt, out.data(), static_cast<int32_t>(out.size()));
    }
    if (n < 0) throw hc::invalid_argument("chat template: llama.cpp does not know this model's template");
    out.resize(static_cast<std::size_t>(n));
    return out;
  }

  /// Tokens of `text` (BOS added when the vocabulary asks for it).
  [[nodiscard]] std::vector<llama_token> tokenize(const std::string& text, bool special) const {
    std::vector<llama_token> t(text.size() + 16);
    int n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), t.data(), static_cast<int32_t>(t.size()), true, special);
    if (n < 0) {
      t.resize(static_cast<std::size_t>(-n));
      n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), t.data(), static_cast<int32_t>(t.size()), true, special);
    }
    if (n < 0) throw hc::invalid_argument("tokenizer: llama.cpp could not tokenize the prompt");
    t.resize(static_cast<std::size_t>(n));
    return t;
  }
  /// The text of tokens (specials rendered).
  [[nodiscard]] std::string detokenize(std::span<const llama_token> t) const {
    std::string out(t.size() * 8 + 16, '\0');
    int n = llama_detokenize(vocab_, t.data(), static_cast<int32_t>(t.size()), out.data(), static_cast<int32_t>(out.size()), false, false);
    if (n < 0) {
      out.resize(static_cast<std::size_t>(-n));
      n = llama_detokenize(vocab_, t.data(), static_cast<int32_t>(t.size()), out.data(), static_cast<int32_t>(out.size()), false, false);
    }
    out.resize(static_cast<std::size_t>(std::max(n, 0)));
    return out;
  }

 private:
  std::unique_ptr<llama_model, model_deleter> model_;
  const llama_vocab* vocab_ = nullptr;
  std::string template_;
};

/// A context over a loaded model, with its state layout. @throws hc::invalid_argument.
class session {
 public:
  session(const loaded_model& model, const context_options& o) : model_(&model), opts_(o) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = o.ctx_per_slot * o.slots;
    p.n_batch = o.batch;
    p.n_ubatch = o.ubatch;
    p.n_seq_max = o.slots;
    p.n_threads = o.threads;
    p.n_threads_batch = o.threads;
    p.kv_unified = false;
    p.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.no_perf = true;
    ctx_.reset(llama_init_from_model(model.get(), p));
    if (!ctx_) throw hc::invalid_argument("llama.cpp: cannot create a context of " + std::to_string(p.n_ctx) + " cells");
    learn();
  }
  [[nodiscard]] llama_context* ctx() const noexcept { return ctx_.get(); }
  [[nodiscard]] llama_memory_t memory() const noexcept { return llama_get_memory(ctx_.get()); }
  [[nodiscard]] const state_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] state_layout& layout() noexcept { return layout_; }
  [[nodiscard]] const context_options& options() const noexcept { return opts_; }
  [[nodiscard]] const loaded_model& model() const noexcept { return *model_; }

  /// The model as hybridcache's cost model sees it (see the file comment).
  /// @throws hc::invalid_argument for a recurrent mixer or a K/V layout it cannot describe.
  [[nodiscard]] hc::model_spec make_spec() const;

 private:
  // Prefills a short probe in sequence 0 and reads its whole state.
  void learn() {
    std::vector<llama_token> probe{1, 2, 3, 4};
    llama_batch b = llama_batch_init(static_cast<int32_t>(probe.size()), 0, 1);
    for (std::size_t i = 0; i < probe.size(); ++i) {
      b.token[i] = probe[i];
      b.pos[i] = static_cast<llama_pos>(i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = i + 1 == probe.size();
    }
    b.n_tokens = static_cast<int32_t>(probe.size());
    const int rc = llama_decode(ctx_.get(), b);
    llama_batch_free(b);
    if (rc != 0) throw hc::invalid_argument("llama.cpp: the probe decode failed (" + std::to_string(rc) + ")");
    std::vector<std::byte> buf(llama_state_seq_get_size_ext(ctx_.get(), 0, 0));
    const std::size_t n = llama_state_seq_get_data_ext(ctx_.get(), reinterpret_cast<std::uint8_t*>(buf.data()), buf.size(), 0, 0);
    if (n != buf.size()) throw hc::invalid_argument("llama.cpp: the probe state could not be read");
    std::vector<std::int32_t> ids(probe.begin(), probe.end());
    layout_ = learn_layout(buf, ids);
    llama_memory_seq_rm(memory(), 0, -1, -1);
  }

  const loaded_model* model_;
  context_options opts_;
  std::unique_ptr<llama_context, context_deleter> ctx_;
  state_layout layout_;
};

inline hc::model_spec session::make_spec() const {
  const loaded_model& m = *model_;
  const std::string arch = m.arch();
  hc::model_spec s;
  s.name = m.meta("general.name").empty() ? arch : m.meta("general.name");
  s.source = "GGUF metadata and llama.cpp's state layout (examples/llama_cpp)";
  const auto n_layer = static_cast<std::int64_t>(llama_model_n_layer(m.get()));
  const auto n_attn = static_cast<std::int64_t>(layout_.kv.size()), n_rec = static_cast<std::int64_t>(layout_.rec.size());
  if (n_attn == 0 || n_rec == 0 || n_attn + n_rec > n_layer)
    throw hc::invalid_argument("model: " + std::to_string(n_attn) + " attention and " + std::to_string(n_rec) +
                               " recurrent layers of " + std::to_string(n_layer) + ": not a hybrid the cache can hold");
  s.layers.assign(static_cast<std::size_t>(n_rec), hc::layer_kind::recurrent);
  s.layers.insert(s.layers.end(), static_cast<std::size_t>(n_attn), hc::layer_kind::attention);
  s.layers.insert(s.layers.end(), static_cast<std::size_t>(n_layer - n_attn - n_rec), hc::layer_kind::mlp);
  s.d_model = llama_model_n_embd(m.get());
  // Attention: K and V rows of equal size in every layer, stored as one slot per token.
  const auto& k0 = layout_.kv.front();
  for (const auto& l : layout_.kv)
    if (l.k_row != k0.k_row || l.v_row != k0.v_row || l.k_row != l.v_row)
      throw hc::invalid_argument("model: K and V rows differ between layers or from each other; the pool's pages need one size");
  s.kv_dtype_bytes = 2;
  if (k0.k_row % 2 != 0) throw hc::invalid_argument("model: odd K row size");
  // kv_heads x head_dim x 2 B must be the K row; the heads come from the model where they fit
  // (a per-layer head count reads as layer 0's, 0 for a recurrent first layer).
  const auto k_elems = static_cast<std::int64_t>(k0.k_row / 2);
  const std::int64_t kv_heads = llama_model_n_head_kv(m.get()), heads = llama_model_n_head(m.get());
  s.kv_heads = kv_heads > 0 && k_elems % kv_heads == 0 ? kv_heads : 1;
  s.head_dim = k_elems / s.kv_heads;
  s.attention_heads = heads > 0 && heads % s.kv_heads == 0 ? heads : s.kv_heads;
  // Recurrent: the state shapes from the metadata; a checkpoint block holds one layer's conv
  // and SSM rows exactly (conv counted as one "kernel" of r_row / 4 float channels).
  const auto& r0 = layout_.rec.front();
  for (const auto& l : layout_.rec)
    if (l.bytes() != r0.bytes()) throw hc::invalid_argument("model: recurrent layers of different sizes");
  s.state_dtype_bytes = 4;
  s.conv_dtype_bytes = 4;
  s.conv_kernel = 1;
  s.conv_channels = static_cast<std::int64_t>(r0.r_row / 4);
  const std::string p = arch + ".ssm.";
  const std::int64_t d_state = m.meta_int(p + "state_size"), groups = m.meta_int(p + "group_count"),
                     rank = m.meta_int(p + "time_step_rank"), inner = m.meta_int(p + "inner_size");
  const auto srow = static_cast<std::int64_t>(r0.s_row);
  if (arch == "qwen35" || arch == "qwen35moe" || arch == "qwen3next") {
    s.recurrent = hc::recurrent_family::gated_deltanet;
    s.gdn_key_heads = groups;
    s.gdn_value_heads = rank;
    s.gdn_key_dim = d_state;
    s.gdn_value_dim = rank > 0 ? inner / rank : 0;
    if (s.gdn_value_heads * s.gdn_key_dim * s.gdn_value_dim * 4 != srow)
      throw hc::invalid_argument("model '" + arch + "': GDN metadata does not match the state's " + std::to_string(srow) + " B rows");
  } else {
    s.recurrent = hc::recurrent_family::mamba2;
    s.ssm_d_inner = inner;
    s.d_state = d_state;
    s.ssm_state_rows = d_state > 0 ? srow / (d_state * 4) : 0;
    if (s.ssm_state_rows * d_state * 4 != srow || inner <= 0)
      throw hc::invalid_argument("model '" + arch + "': SSM metadata does not match the state's " + std::to_string(srow) + " B rows");
  }
  s.scan_chunk = 64;  // cuts are exact here (a batch ends at each site); the chunk only shapes plans
  s.activation_dtype_bytes = 4;
  s.validate();
  return s;
}

}  // namespace hybridcache_llama
