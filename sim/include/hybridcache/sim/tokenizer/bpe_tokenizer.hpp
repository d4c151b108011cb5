// hybridcache/sim/tokenizer/bpe_tokenizer.hpp
//
// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, for replaying text
// traces with a model's real token ids instead of the built-in approximation
// (text_tokenizer.hpp). Its output equals the `tokenizers` Python package's
// `Tokenizer.encode(text).ids` for the components it implements (tested on thousands of
// strings against the package, tests/tokenizer/):
//
//   added_tokens   split out first, leftmost-longest, in two passes as the package does:
//                  the tokens with "normalized": false over the whole text, then those with
//                  "normalized": true over what is left. "single_word", "lstrip" and
//                  "rstrip" must be false.
//   normalizer     null, or NFC (alone or in a one-element Sequence; Qwen 2, 2.5, 3) with
//                  the package's Unicode data (unicode_nfc.hpp): applied to the text
//                  between non-normalized added tokens, before normalized ones are split out.
//   pre_tokenizer  ByteLevel with "add_prefix_space": false and "use_regex": true: the
//                  GPT-2 split
//                    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                  or a Sequence of a Split by the Llama 3 or Qwen 2 regex (or GPT-2's)
//                  and ByteLevel without use_regex (bpe_pretokenizer.hpp names the three
//                  spellings; any other regex is rejected); then every byte of a piece
//                  mapped to GPT-2's printable byte alphabet.
//                  \p{L} and \p{N} come from data/unicode_ln.hpp (the Unicode version of
//                  the package's Oniguruma, `data::unicode_ln_version`; code points
//                  assigned later classify as "other"); \s is Unicode White_Space
//                  (Oniguruma's \s).
//   model          BPE: "vocab" and "merges" (either "a b" strings or ["a", "b"] pairs);
//                  a merge's priority is its index (lowest first; equal pairs leftmost
//                  first); "ignore_merges" supported; "dropout" must be null,
//                  "continuing_subword_prefix" and "end_of_word_suffix" null or "" (no-ops),
//                  "unk_token" null or, when every byte is in the vocabulary, anything
//                  (then it is never emitted), and "byte_fallback" false. A byte missing
//                  from the vocabulary is dropped, as the package does without an unk token.
//   post_processor null, ByteLevel (which changes offsets only), TemplateProcessing
//                  (its "single" template), or a Sequence of those: `encode` is the
//                  package's encode(text, add_special_tokens=False), what a server does
//                  with a rendered chat prompt; `encode_with_special_tokens` is its
//                  default. "truncation" and "padding" must be null. "decoder" is ignored
//                  (no decoding here).
// Any other component is rejected with `invalid_argument` naming it: the tokenizer never
// silently approximates.
//
// Invalid UTF-8: the package takes Python strings, so text must be Unicode. `encode`
// replaces every invalid sequence in its input with U+FFFD exactly as Python's
// `bytes.decode("utf-8", errors="replace")` does (one U+FFFD per maximal invalid subpart,
// `utf8_replace_invalid`); encoding raw bytes here equals encoding their "replace"-decoded
// string with the package.
//
// Encoding a pre-token: for the merge lists trainers write and the ones converted from
// tiktoken vocabularies (Llama 3, Qwen: merges out of rank order; `fast_encoder()`,
// `merges_in_rank_order()`), by the fast exact encoder (bpe_backtracking.hpp: the longest
// token that fits its neighbour, backing off where none fits further on; argued equal to
// merging, and tested against the definition of BPE and against the package); otherwise
// (a pathological list), or where that encoder finds no tokens (text
// needing a token that is part of a character, whose neighbours it cannot keep), by merging
// in the package's order (bpe_merges.hpp). A character no whole-character token starts
// with is merged alone and kept where its ids fit its neighbours' (bpe_backtracking.hpp).
// Pre-tokens of up to 8 bytes (words, spaces, punctuation: most of them) and characters
// merged alone are remembered in a small direct-mapped cache.
//
// Cost: loading is O(file size + merges x spine depth), plus, for a list out of rank
// order, one encoding of each token's bytes (bounded, bpe_backtracking.hpp). `encode` is
// O(n) for the split and O(n x L) for the fast encoder (L: the longest token in
// characters), one hash probe per character it walks; merging is O(n log n).
// Allocation-free once its buffers are warm. Not thread-safe (the buffers and the cache);
// use one per thread (copies are independent).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/json_value.hpp"
#include "hybridcache/sim/tokenizer/bpe_backtracking.hpp"
#include "hybridcache/sim/tokenizer/bpe_merges.hpp"
#include "hybridcache/sim/tokenizer/bpe_pretokenizer.hpp"
#include "hybridcache/sim/tokenizer/bpe_vocab.hpp"
#include "hybridcache/sim/tokenizer/unicode_nfc.hpp"
#include "hybridcache/sim/tokenizer/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// Byte-level BPE tokenizer from a Hugging Face tokenizer.json. See the file comment.
class bpe_tokenizer {
 public:
  /// Largest tokenizer.json read (bytes).
  static constexpr std::uintmax_t max_file_bytes = std::uintmax_t{1} << 30;
  /// Largest vocabulary, merge list and added-token list accepted.
  static constexpr std::size_t max_entries = std::size_t{1} << 24;
  /// Pre-tokens of up to this many bytes are remembered (with up to `cached_ids` ids) in a
  /// direct-mapped cache of `cache_entries` entries.
  static constexpr std::size_t max_cached_piece = 8;
  static constexpr std::size_t cached_ids = 5;
  static constexpr std::size_t cache_entries = std::size_t{1} << 13;

  /// Reads `path`. Throws `invalid_argument` when it cannot be read, is too large, or uses
  /// a component this tokenizer does not implement; `format_error` for malformed JSON.
  [[nodiscard]] static bpe_tokenizer from_file(const std::filesystem::path& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) throw invalid_argument("tokenizer '" + path.string() + "': cannot read (" + ec.message() + ")");
    if (size > max_file_bytes) throw invalid_argument("tokenizer '" + path.string() + "': larger than 1 GiB");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("tokenizer '" + path.string() + "': cannot open");
    // Not a std::string: that would zero the bytes before reading over them.
    const auto text = std::make_unique_for_overwrite<char[]>(static_cast<std::size_t>(size));
    in.read(text.get(), static_cast<std::streamsize>(size));
    if (static_cast<std::uintmax_t>(in.gcount()) != size) throw invalid_argument("tokenizer '" + path.string() + "': short read");
    return from_json(std::string_view(text.get(), static_cast<std::size_t>(size)), path.string());
  }

  /// Parses the text of a tokenizer.json; `name` labels errors.
  [[nodiscard]] static bpe_tokenizer from_json(std::string_view text, const std::string& name = "tokenizer.json") {
    bpe_tokenizer t;
    t.load(text, name);
    return t;
  }

  /// Appends the ids of `text` to `out` (invalid UTF-8 replaced as documented).
  void encode(std::string_view text, std::vector<token_id>& out) {
    // The split checks the UTF-8 as it goes; at an ill-formed sequence everything is
    // redone on the repaired text (what was appended is dropped).
    const std::size_t start = out.size();
    // Room for the ids up front (at most one per byte of valid text), growing geometrically,
    // so appending a piece's ids rarely reallocates.
    if (out.capacity() - start < text.size()) out.reserve(std::max(start + text.size(), 2 * out.capacity()));
    ill_formed_ = false;
    encode_valid(text, out);
    if (!ill_formed_) return;
    out.resize(start);
    std::string clean;
    utf8_replace_invalid(text, clean);
    ill_formed_ = false;
    encode_valid(clean, out);
  }

  /// The ids of `text`.
  [[nodiscard]] std::vector<token_id> encode(std::string_view text) {
    std::vector<token_id> out;
    encode(text, out);
    return out;
  }

  /// Appends the ids of `text` with the post-processor's special tokens around them (the
  /// package's default `encode(text)`; `encode` is its `add_special_tokens=False`, what a
  /// server does with a rendered chat prompt and what the trace readers use). Equal to
  /// `encode` when the post-processor adds none.
  void encode_with_special_tokens(std::string_view text, std::vector<token_id>& out) {
    out.insert(out.end(), specials_.prefix.begin(), specials_.prefix.end());
    encode(text, out);
    out.insert(out.end(), specials_.suffix.begin(), specials_.suffix.end());
  }

  /// The regex the pre-tokenizer splits by (bpe_pretokenizer.hpp).
  [[nodiscard]] split_pattern pre_tokenizer() const noexcept { return pattern_; }
  /// The special tokens `encode_with_special_tokens` adds.
  [[nodiscard]] const special_token_template& special_tokens() const noexcept { return specials_; }

  /// Entries in the model vocabulary (added tokens not counted unless also in it).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_.size(); }
  /// Number of merges.
  [[nodiscard]] std::size_t merge_count() const noexcept { return merges_.size(); }
  /// True when pre-tokens are encoded by the fast exact encoder (bpe_backtracking.hpp: for
  /// merge lists in rank order and converted ones alike); false (a pathological list): every
  /// pre-token is merged in the package's order.
  [[nodiscard]] bool fast_encoder() const noexcept { return fast_.enabled(); }
  /// False when the merge list makes some token only after a merge that takes it ranks
  /// (lists converted from tiktoken vocabularies: Llama 3's, Qwen's); the fast encoder then
  /// checks neighbouring tokens by replaying their histories (bpe_backtracking.hpp).
  [[nodiscard]] bool merges_in_rank_order() const noexcept { return fast_.in_rank_order(); }
  /// Number of added tokens.
  [[nodiscard]] std::size_t added_token_count() const noexcept { return added_.size(); }
  /// The id of a vocabulary entry or added token (its byte-level spelling), or -1.
  [[nodiscard]] token_id token_to_id(std::string_view token) const {
    for (const auto& a : added_)
      if (a.content == token) return a.id;
    return vocab_.find(token);
  }

  /// Calls `f(id, bytes, special)` for every vocabulary entry (the bytes its byte-level
  /// spelling stands for; an entry not spelled in that alphabet is skipped, as the encoder
  /// never emits it) and then every added token (its content; `special` as the file says).
  /// What a decoder's id -> bytes table is built from (python/, Tokenizer.decode).
  template <class F>
  void for_each_token(F&& f) const {
    std::string bytes;
    vocab_.for_each([&](std::string_view token, token_id id) {
      if (detail::byte_level_to_bytes(token, bytes)) f(id, std::string_view(bytes), false);
    });
    for (const auto& a : added_) f(a.id, std::string_view(a.content), a.special);
  }

 private:
  struct added_token {
    std::string content;
    token_id id;
    bool normalized;
    bool special;
  };
  // An entry of the short pre-token cache: the piece's bytes (little-endian, zero-padded)
  // and length, and its ids. 32 bytes: two to a cache line.
  struct cache_entry {
    std::uint64_t bytes = 0;
    std::uint8_t length = 0;  // 0: empty
    std::uint8_t id_count = 0;
    token_id ids[cached_ids] = {};
  };
  // The bytes of a piece of 1-8 bytes as one word, by loads that never cross its end.
  [[nodiscard]] static std::uint64_t short_bytes(std::string_view s) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const std::size_t n = s.size();
    if (n >= 4) {
      std::uint32_t lo = 0, hi = 0;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + n - 4, 4);  // overlaps lo where n < 8: the same bytes
      return lo | (static_cast<std::uint64_t>(hi) << (8 * (n - 4)));
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return v;
  }
  [[noreturn]] static void unsupported(const std::string& name, const std::string& what) {
    detail::unsupported_component(name, what);
  }

  static void require_null_or(const json_value* v, const std::string& name, const std::string& what) {
    if (v != nullptr && !v->is_null()) unsupported(name, what);
  }

  static bool get_bool(const json_value& obj, std::string_view key, bool fallback, const std::string& name) {
    return detail::json_bool(obj, key, fallback, name);
  }

  void load(std::string_view text, const std::string& name) {
    json_cursor cursor(text);
    cursor.begin_object("");
    std::string_view key;
    bool have_model = false;
    json_value added;
    while (cursor.next_member(key)) {
      const std::string k(key);
      if (k == "model") {
        have_model = true;
        load_model(cursor, name);
        continue;
      }
      const json_value v = json_value::read(cursor, k);
      if (k == "normalizer") {
        nfc_ = parse_normalizer(v, name);
      } else if (k == "pre_tokenizer") {
        pattern_ = parse_pre_tokenizer(v, name);
      } else if (k == "post_processor") {
        specials_ = parse_post_processor(v, name);
      } else if (k == "truncation") {
        require_null_or(&v, name, "truncation");
      } else if (k == "padding") {
        require_null_or(&v, name, "padding");
      } else if (k == "added_tokens") {
        added = v;
      }
      // "version", "decoder" and unknown keys are ignored.
    }
    cursor.expect_end();
    if (!have_model) throw invalid_argument("tokenizer '" + name + "': no \"model\"");
    if (added.kind() == json_kind::array) {
      if (added.as_array().size() > max_entries) throw invalid_argument("tokenizer '" + name + "': too many added tokens");
      for (const json_value& a : added.as_array()) {
        const json_value* content = a.find("content");
        const json_value* id = a.find("id");
        if (content == nullptr || content->kind() != json_kind::string || content->as_string().empty() || id == nullptr || !id->is_integer() ||
            id->as_int() < 0 || id->as_int() > 0x7FFFFFFF)
          throw invalid_argument("tokenizer '" + name + "': an added token needs a non-empty \"content\" and an \"id\" in [0, 2^31)");
        if (get_bool(a, "single_word", false, name) || get_bool(a, "lstrip", false, name) || get_bool(a, "rstrip", false, name))
          unsupported(name, "added token '" + content->as_string() + "' with single_word/lstrip/rstrip");
        const bool special = get_bool(a, "special", false, name);
        added_.push_back({content->as_string(), static_cast<token_id>(id->as_int()), get_bool(a, "normalized", !special, name), special});
      }
    } else if (!added.is_null()) {
      throw invalid_argument("tokenizer '" + name + "': \"added_tokens\" must be an array");
    }
    // Longest first, so the first match at a position is the longest.
    std::stable_sort(added_.begin(), added_.end(), [](const added_token& a, const added_token& b) { return a.content.size() > b.content.size(); });
    for (std::size_t i = 0; i < added_.size(); ++i) {
      const auto first = static_cast<unsigned char>(added_[i].content[0]);
      by_first_byte_[first].push_back(static_cast<std::uint32_t>(i));
      std::string& starts = first_bytes_[added_[i].normalized ? 1 : 0];
      if (starts.find(static_cast<char>(first)) == std::string::npos) starts.push_back(static_cast<char>(first));
    }
  }

  void load_model(json_cursor& cursor, const std::string& name) {
    cursor.begin_object("model");
    std::string_view key;
    bool have_vocab = false, have_merges = false;
    // The merges' spellings, each "a" then "b" back to back in one arena (so a + b is a
    // view too), with where b starts and ends: no string per merge.
    std::string merge_bytes;
    struct merge_spelling {
      std::uint32_t at, split, end;
    };
    std::vector<merge_spelling> merge_pairs;
    std::string type;
    bool has_unk = false;
    while (cursor.next_member(key)) {
      const std::string k(key);
      if (k == "vocab") {
        have_vocab = true;
        cursor.begin_object("model.vocab");
        auto entry = [&](std::string_view token, std::int64_t id) {
          if (id < 0 || id > 0x7FFFFFFF) cursor.fail("model.vocab", "id outside [0, 2^31)");
          if (vocab_.size() >= max_entries) cursor.fail("model.vocab", "more than 2^24 entries");
          vocab_.assign(token, static_cast<token_id>(id));
        };
        // Plain entries ("token": id) by the fast path; one of another shape (an escape in
        // the token) by the general one, then back.
        std::string_view token;  // valid until the next key or string is read: read_int reads neither
        while (!cursor.plain_int_members(entry) && cursor.next_member(token)) entry(token, cursor.read_int("model.vocab"));
      } else if (k == "merges") {
        have_merges = true;
        cursor.begin_array("model.merges");
        auto spelled = [&](std::string_view m) {  // "a b"
          if (merge_pairs.size() >= max_entries) cursor.fail("model.merges", "more than 2^24 merges");
          const std::size_t sp = m.find(' ');
          if (sp == std::string_view::npos || m.find(' ', sp + 1) != std::string_view::npos)
            cursor.fail("model.merges", "a merge must be two tokens separated by one space");
          const auto at = static_cast<std::uint32_t>(merge_bytes.size());
          merge_bytes.append(m.substr(0, sp)).append(m.substr(sp + 1));
          merge_pairs.push_back({at, static_cast<std::uint32_t>(at + sp), static_cast<std::uint32_t>(merge_bytes.size())});
        };
        auto paired = [&](std::string_view a, std::string_view b) {  // ["a", "b"]
          if (merge_pairs.size() >= max_entries) cursor.fail("model.merges", "more than 2^24 merges");
          const auto at = static_cast<std::uint32_t>(merge_bytes.size());
          merge_bytes.append(a).append(b);
          merge_pairs.push_back({at, static_cast<std::uint32_t>(at + a.size()), static_cast<std::uint32_t>(merge_bytes.size())});
        };
        // Plain merges by the fast path; one with an escape by the general one, then back.
        while (!cursor.plain_string_elements(spelled, paired) && cursor.next_element("model.merges")) {
          if (cursor.peek("model.merges") == json_kind::string) {
            spelled(cursor.read_string("model.merges"));
            continue;
          }
          cursor.begin_array("model.merges");
          if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
          const std::string a(cursor.read_string("model.merges"));  // the next read reuses the view's buffer
          if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
          const std::string_view b = cursor.read_string("model.merges");
          if (cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair has exactly two tokens");
          paired(a, b);
        }
      } else {
        const json_value v = json_value::read(cursor, k);
        if (k == "type") {
          if (v.kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': model.type must be a string");
          type = v.as_string();
        } else if (k == "dropout") {
          require_null_or(&v, name, "model.dropout");
        } else if (k == "continuing_subword_prefix" || k == "end_of_word_suffix") {
          // "" (what Qwen's and GPT-2's files hold) adds nothing to any token: the same as null.
          if (!v.is_null() && !(v.kind() == json_kind::string && v.as_string().empty())) unsupported(name, "model." + k + " other than null or \"\"");
        } else if (k == "unk_token") {
          if (!v.is_null() && v.kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': model.unk_token must be a string or null");
          has_unk = !v.is_null();
        } else if (k == "byte_fallback") {
          if (v.kind() == json_kind::boolean && v.as_bool()) unsupported(name, "model.byte_fallback = true");
        } else if (k == "ignore_merges") {
          ignore_merges_ = v.kind() == json_kind::boolean && v.as_bool();
        }
      }
    }
    if (type != "BPE") unsupported(name, "model type '" + type + "'");
    if (!have_vocab || !have_merges) throw invalid_argument("tokenizer '" + name + "': model needs \"vocab\" and \"merges\"");
    merges_.reserve(merge_pairs.size());
    token_id id_limit = 0;
    vocab_.for_each([&](std::string_view, token_id id) { id_limit = std::max(id_limit, id + 1); });
    std::size_t next_made = 0;  // the vocab entry after the last merge's result
    for (std::size_t r = 0; r < merge_pairs.size(); ++r) {
      const merge_spelling& m = merge_pairs[r];
      const std::string_view a(merge_bytes.data() + m.at, m.split - m.at), b(merge_bytes.data() + m.split, m.end - m.split);
      const token_id ia = vocab_.find(a), ib = vocab_.find(b);
      const token_id iab = vocab_.find_from(std::string_view(merge_bytes.data() + m.at, m.end - m.at), next_made);
      if (ia < 0 || ib < 0 || iab < 0)
        throw invalid_argument("tokenizer '" + name + "': merge " + std::to_string(r) + " ('" + std::string(a) + "' '" + std::string(b) +
                               "') uses a token missing from the vocab");
      merges_.add(ia, ib, static_cast<std::int32_t>(r), iab);  // a repeated pair: the last wins, as in the package
    }
    merges_.finish();
    const auto map = detail::byte_to_unicode();
    for (std::size_t b = 0; b < 256; ++b) {
      std::string s;
      detail::append_utf8(s, map[b]);
      byte_ids_[b] = vocab_.find(s);
    }
    // An unknown token is emitted only for a byte the vocabulary lacks; with every byte in it
    // (every byte-level BPE a trainer writes) it never is, and the model is plain BPE.
    if (has_unk && std::any_of(byte_ids_.begin(), byte_ids_.end(), [](token_id id) { return id < 0; }))
      unsupported(name, "model.unk_token with bytes missing from the vocab (the unknown token would be emitted)");
    if (ignore_merges_) {
      std::string bytes;
      vocab_.for_each([&](std::string_view token, token_id id) {
        if (!detail::byte_level_to_bytes(token, bytes)) return;  // not spelled in the byte alphabet: never a piece
        by_bytes_.emplace(bytes, id);
        mark_whole_piece(bytes);
      });
    }
    fast_.build(merges_, byte_ids_, static_cast<std::size_t>(id_limit));
  }

  void encode_valid(std::string_view text, std::vector<token_id>& out) {
    if (added_.empty()) {
      encode_plain(normalized(text), out);
      return;
    }
    // Pass 1: tokens with normalized = false; pass 2 (inside, on the normalized text):
    // normalized = true.
    split_added(text, false, out);
  }

  // `text` after the normalizer: itself, or NFC of it in `nfc_text_` (valid only until the
  // next call). Ill-formed UTF-8 sets `ill_formed_` (the encode is redone on repaired text).
  std::string_view normalized(std::string_view text) {
    if (!nfc_ || ill_formed_) return text;
    const nfc_normalizer& nfc = nfc_normalizer::get();
    const auto state = nfc.scan(text);
    if (state == nfc_normalizer::text_state::ill_formed) ill_formed_ = true;
    if (state != nfc_normalizer::text_state::changes) return text;
    nfc_text_.clear();
    nfc.normalize(text, nfc_text_, nfc_cps_);
    return nfc_text_;
  }

  void split_added(std::string_view text, bool normalized, std::vector<token_id>& out) {
    std::size_t start = 0;
    const std::string_view starts = first_bytes_[normalized ? 1 : 0];
    for (std::size_t i = 0; i < text.size();) {
      // Skip to the next byte an added token of this pass starts with.
      i = starts.size() == 1 ? text.find(starts[0], i) : text.find_first_of(starts, i);
      if (i == std::string_view::npos) break;
      const added_token* hit = nullptr;
      for (const std::uint32_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        const added_token& a = added_[k];
        if (a.normalized == normalized && text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      emit_segment(std::string_view(text.data() + start, i - start), normalized, out);
      out.push_back(hit->id);
      i += hit->content.size();
      start = i;
    }
    emit_segment(std::string_view(text.data() + start, text.size() - start), normalized, out);
  }

  void emit_segment(std::string_view segment, bool normalized_pass, std::vector<token_id>& out) {
    if (segment.empty()) return;
    if (!normalized_pass)
      split_added(normalized(segment), true, out);  // the second pass emits without normalizing again
    else
      encode_plain(segment, out);
  }

  void encode_plain(std::string_view text, std::vector<token_id>& out) {
    if (ill_formed_) return;  // the text is redone anyway
    if (!pretokenize<true>(pattern_, text, [&](std::string_view piece) { encode_piece(piece, out); })) ill_formed_ = true;
  }

  void encode_piece(std::string_view piece, std::vector<token_id>& out) {
    cache_entry* entry = nullptr;
    std::uint64_t bytes = 0;
    if (piece.size() <= max_cached_piece) {
      entry = &cache_slot(piece, bytes);
      if (cached(*entry, piece, bytes, out)) return;
    }
    const std::size_t start = out.size();
    if (ignore_merges_) {
      if (maybe_whole_piece(piece))
        if (const auto it = by_bytes_.find(piece); it != by_bytes_.end()) out.push_back(it->second);
    }
    if (out.size() == start && !fast_.encode(piece, merges_, out, [this](std::string_view c, std::vector<token_id>& ids) { merge_char(c, ids); }))
      merger_.merge(piece, byte_ids_, merges_, out);
    if (entry != nullptr) cache(*entry, piece, bytes, out, start);
  }

  // The ids of one character merged alone, for the fast encoder (a character outside its
  // trie), through the short-piece cache: they are that piece's ids, unless merges are
  // ignored (then a piece may be one vocabulary entry, not its merge).
  void merge_char(std::string_view c, std::vector<token_id>& out) {
    if (ignore_merges_ || c.size() > max_cached_piece) {
      merger_.merge(c, byte_ids_, merges_, out);
      return;
    }
    std::uint64_t bytes = 0;
    cache_entry& entry = cache_slot(c, bytes);
    if (cached(entry, c, bytes, out)) return;
    const std::size_t start = out.size();
    merger_.merge(c, byte_ids_, merges_, out);
    cache(entry, c, bytes, out, start);
  }

  // The cache entry a piece of up to `max_cached_piece` bytes maps to; `bytes` gets its key.
  cache_entry& cache_slot(std::string_view piece, std::uint64_t& bytes) {
    if (cache_.empty()) cache_.resize(cache_entries);
    bytes = short_bytes(piece);
    return cache_[splitmix64_mix(bytes ^ (piece.size() << 59)) & (cache_entries - 1)];
  }
  // Appends the ids `entry` holds for `piece` and returns true, or returns false.
  static bool cached(const cache_entry& entry, std::string_view piece, std::uint64_t bytes, std::vector<token_id>& out) {
    if (entry.length != piece.size() || entry.bytes != bytes) return false;
    for (std::size_t k = 0; k < entry.id_count; ++k) out.push_back(entry.ids[k]);  // a few ids: no call to memmove
    return true;
  }
  // Remembers out[start, ...) as the ids of `piece`, when they are few enough.
  static void cache(cache_entry& entry, std::string_view piece, std::uint64_t bytes, const std::vector<token_id>& out, std::size_t start) {
    const std::size_t count = out.size() - start;
    if (count > cached_ids) return;
    entry.bytes = bytes;
    entry.length = static_cast<std::uint8_t>(piece.size());
    entry.id_count = static_cast<std::uint8_t>(count);
    std::copy(out.begin() + static_cast<std::ptrdiff_t>(start), out.end(), entry.ids);
  }

  // The bit of `whole_piece_bits_` for a piece: a hash of its length and its first and last
  // 8 bytes (they overlap below 16 bytes; `short_bytes` reads pieces of up to 8).
  [[nodiscard]] std::uint64_t whole_piece_bit(std::string_view s) const noexcept {
    std::uint64_t head = short_bytes(s.substr(0, 8)), tail = 0;
    if (s.size() > 8) std::memcpy(&tail, s.data() + s.size() - 8, 8);
    return splitmix64_mix(head ^ splitmix64_mix(tail ^ s.size())) & ((whole_piece_bits_.size() << 6) - 1);
  }
  void mark_whole_piece(std::string_view s) {
    const std::uint64_t k = whole_piece_bit(s);
    whole_piece_bits_[k >> 6] |= std::uint64_t{1} << (k & 63);
  }
  [[nodiscard]] bool maybe_whole_piece(std::string_view s) const noexcept {
    const std::uint64_t k = whole_piece_bit(s);
    return ((whole_piece_bits_[k >> 6] >> (k & 63)) & 1u) != 0;
  }

  // Hashes std::string and std::string_view alike, so lookups by a piece do not allocate.
  struct bytes_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  bpe_vocab vocab_;
  bpe_merge_table merges_;
  bpe_word_merger merger_;           // the package's merge order: where fast_ does not apply
  bpe_backtracking_encoder fast_;    // exact, faster
  std::vector<added_token> added_;
  std::array<token_id, 256> byte_ids_{};
  bool nfc_ = false;                   // normalizer NFC
  std::string nfc_text_;               // the normalized segment being encoded
  std::vector<std::uint32_t> nfc_cps_;  // scratch of the normalizer
  split_pattern pattern_ = split_pattern::gpt2;
  special_token_template specials_;
  bool ignore_merges_ = false;
  bool ill_formed_ = false;  // `encode` met ill-formed UTF-8
  std::unordered_map<std::string, token_id, bytes_hash, std::equal_to<>> by_bytes_;  // ignore_merges: raw bytes -> id
  // ignore_merges: a bit per `whole_piece_bit` of every entry of by_bytes_, so most pieces
  // that are no vocabulary entry skip hashing all their bytes.
  std::vector<std::uint64_t> whole_piece_bits_ = std::vector<std::uint64_t>(std::size_t{1} << 12, 0);
  std::vector<cache_entry> cache_;  // short pre-tokens; allocated on first use
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_{};  // indices into added_
  std::array<std::string, 2> first_bytes_{};  // the bytes added tokens start with: [normalized]
};

}  // namespace hybridcache::sim
