// hybridcache/sim/bpe_tokenizer.hpp
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
//   normalizer     must be null.
//   pre_tokenizer  ByteLevel with "add_prefix_space": false and "use_regex": true: the
//                  GPT-2 split
//                    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                  then every byte of a piece mapped to GPT-2's printable byte alphabet.
//                  \p{L} and \p{N} come from data/unicode_ln.hpp (Python's unicodedata,
//                  its version in `data::unicode_ln_version`; code points assigned in a
//                  later Unicode version than that classify as "other"); \s is Unicode
//                  White_Space (Oniguruma's \s).
//   model          BPE: "vocab" and "merges" (either "a b" strings or ["a", "b"] pairs);
//                  a merge's priority is its index (lowest first; equal pairs leftmost
//                  first); "ignore_merges" supported; "dropout", "unk_token",
//                  "continuing_subword_prefix", "end_of_word_suffix" must be null and
//                  "byte_fallback" false. A byte missing from the vocabulary is dropped, as
//                  the package does without an unk token.
//   post_processor null or ByteLevel (which changes offsets only); "truncation" and
//                  "padding" must be null. "decoder" is ignored (no decoding here).
// Any other component is rejected with `invalid_argument` naming it: the tokenizer never
// silently approximates.
//
// Invalid UTF-8: the package takes Python strings, so text must be Unicode. `encode`
// replaces every invalid sequence in its input with U+FFFD exactly as Python's
// `bytes.decode("utf-8", errors="replace")` does (one U+FFFD per maximal invalid subpart,
// `utf8_replace_invalid`); encoding raw bytes here equals encoding their "replace"-decoded
// string with the package.
//
// Cost: loading is O(file size). `encode` merges a pre-token of up to 64 bytes over a linked
// array of pair ranks with a two-level minimum (O(16) compares and 2 lookups per merge) and a
// longer one with a heap of
// candidate merges (O(n log n)), in the package's order either way (lowest rank, then
// leftmost); pre-tokens of up to 64 bytes seen before come from a cache in flat arenas
// (cleared when it holds `cache_capacity` entries). Not thread-safe (the cache); use one per
// thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/sim/json.hpp"
#include "hybridcache/sim/utf8_pretokenize.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Byte-level BPE tokenizer from a Hugging Face tokenizer.json. See the file comment.
class bpe_tokenizer {
 public:
  /// Largest tokenizer.json read (bytes).
  static constexpr std::uintmax_t max_file_bytes = std::uintmax_t{1} << 30;
  /// Largest vocabulary, merge list and added-token list accepted.
  static constexpr std::size_t max_entries = std::size_t{1} << 24;
  /// Pre-tokens remembered before the cache is cleared.
  static constexpr std::size_t cache_capacity = std::size_t{1} << 16;
  /// Longer pre-tokens are not cached (long CJK runs rarely repeat).
  static constexpr std::size_t max_cached_piece = 64;

  /// Reads `path`. Throws `invalid_argument` when it cannot be read, is too large, or uses
  /// a component this tokenizer does not implement; `format_error` for malformed JSON.
  [[nodiscard]] static bpe_tokenizer from_file(const std::filesystem::path& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) throw invalid_argument("tokenizer '" + path.string() + "': cannot read (" + ec.message() + ")");
    if (size > max_file_bytes) throw invalid_argument("tokenizer '" + path.string() + "': larger than 1 GiB");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("tokenizer '" + path.string() + "': cannot open");
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (static_cast<std::uintmax_t>(in.gcount()) != size) throw invalid_argument("tokenizer '" + path.string() + "': short read");
    bpe_tokenizer t = from_json(text, path.string());
    return t;
  }

  /// Parses the text of a tokenizer.json; `name` labels errors.
  [[nodiscard]] static bpe_tokenizer from_json(std::string_view text, const std::string& name = "tokenizer.json") {
    bpe_tokenizer t;
    t.load(text, name);
    return t;
  }

  /// Appends the ids of `text` to `out` (invalid UTF-8 replaced as documented).
  void encode(std::string_view text, std::vector<token_id>& out) {
    if (!is_valid_utf8(text)) {
      std::string clean;
      utf8_replace_invalid(text, clean);
      encode_valid(clean, out);
      return;
    }
    encode_valid(text, out);
  }

  /// The ids of `text`.
  [[nodiscard]] std::vector<token_id> encode(std::string_view text) {
    std::vector<token_id> out;
    encode(text, out);
    return out;
  }

  /// Entries in the model vocabulary (added tokens not counted unless also in it).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_.size(); }
  /// Number of merges.
  [[nodiscard]] std::size_t merge_count() const noexcept { return merge_count_; }
  /// Number of added tokens.
  [[nodiscard]] std::size_t added_token_count() const noexcept { return added_.size(); }
  /// The id of a vocabulary entry or added token (its byte-level spelling), or -1.
  [[nodiscard]] token_id token_to_id(std::string_view token) const {
    for (const auto& a : added_)
      if (a.content == token) return a.id;
    auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  struct merge_target {
    std::int32_t rank;
    token_id id;
  };
  struct added_token {
    std::string content;
    token_id id;
    bool normalized;
  };
  struct symbol {
    token_id id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct merge_slot {
    std::uint64_t key;  // empty_key: free
    merge_target target;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};  // never a pair of ids >= 0
  // The pre-token cache: open addressing over flat arenas (no allocation per entry).
  struct cache_slot {
    std::uint64_t hash;  // 0: free
    std::uint32_t bytes_at;
    std::uint32_t ids_at;
    std::uint16_t byte_count;
    std::uint16_t id_count;
  };
  [[nodiscard]] static std::uint64_t piece_hash(std::string_view s) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a mixer
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    return splitmix64_mix(h) | 1u;
  }
  struct candidate {
    std::int32_t rank;
    std::int32_t pos;
    token_id id;
    token_id left;
    token_id right;
    bool operator>(const candidate& o) const noexcept { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  [[nodiscard]] static std::uint64_t pair_key(token_id a, token_id b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  [[noreturn]] static void unsupported(const std::string& name, const std::string& what) {
    throw invalid_argument("tokenizer '" + name + "': " + what + " is not implemented (supported: byte-level BPE, see bpe_tokenizer.hpp)");
  }

  static void require_null_or(const json_value* v, const std::string& name, const std::string& what) {
    if (v != nullptr && !v->is_null()) unsupported(name, what);
  }

  static bool get_bool(const json_value& obj, std::string_view key, bool fallback, const std::string& name) {
    const json_value* v = obj.find(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (v->kind() != json_kind::boolean) throw invalid_argument("tokenizer '" + name + "': '" + std::string(key) + "' must be a boolean");
    return v->as_bool();
  }

  static std::string type_of(const json_value& obj, const std::string& name, const std::string& where) {
    const json_value* t = obj.find("type");
    if (t == nullptr || t->kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': " + where + " has no \"type\"");
    return t->as_string();
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
        if (!v.is_null()) unsupported(name, "normalizer '" + type_of(v, name, "normalizer") + "'");
      } else if (k == "pre_tokenizer") {
        if (v.is_null()) unsupported(name, "a null pre_tokenizer");
        const std::string type = type_of(v, name, "pre_tokenizer");
        if (type != "ByteLevel") unsupported(name, "pre_tokenizer '" + type + "'");
        if (get_bool(v, "add_prefix_space", true, name)) unsupported(name, "ByteLevel add_prefix_space = true");
        if (!get_bool(v, "use_regex", true, name)) unsupported(name, "ByteLevel use_regex = false");
      } else if (k == "post_processor") {
        if (!v.is_null() && type_of(v, name, "post_processor") != "ByteLevel")
          unsupported(name, "post_processor '" + type_of(v, name, "post_processor") + "'");
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
        added_.push_back({content->as_string(), static_cast<token_id>(id->as_int()), get_bool(a, "normalized", !special, name)});
      }
    } else if (!added.is_null()) {
      throw invalid_argument("tokenizer '" + name + "': \"added_tokens\" must be an array");
    }
    // Longest first, so the first match at a position is the longest.
    std::stable_sort(added_.begin(), added_.end(), [](const added_token& a, const added_token& b) { return a.content.size() > b.content.size(); });
    for (std::size_t i = 0; i < added_.size(); ++i)
      by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<std::uint32_t>(i));
  }

  void load_model(json_cursor& cursor, const std::string& name) {
    cursor.begin_object("model");
    std::string_view key;
    bool have_vocab = false, have_merges = false;
    std::vector<std::pair<std::string, std::string>> merge_pairs;
    std::string type;
    while (cursor.next_member(key)) {
      const std::string k(key);
      if (k == "vocab") {
        have_vocab = true;
        cursor.begin_object("model.vocab");
        std::string_view token;
        while (cursor.next_member(token)) {
          std::string t(token);
          const std::int64_t id = cursor.read_int("model.vocab");
          if (id < 0 || id > 0x7FFFFFFF) cursor.fail("model.vocab", "id outside [0, 2^31)");
          if (vocab_.size() >= max_entries) cursor.fail("model.vocab", "more than 2^24 entries");
          vocab_[std::move(t)] = static_cast<token_id>(id);
        }
      } else if (k == "merges") {
        have_merges = true;
        cursor.begin_array("model.merges");
        while (cursor.next_element("model.merges")) {
          if (merge_pairs.size() >= max_entries) cursor.fail("model.merges", "more than 2^24 merges");
          if (cursor.peek("model.merges") == json_kind::string) {
            const std::string_view m = cursor.read_string("model.merges");
            const std::size_t sp = m.find(' ');
            if (sp == std::string_view::npos || m.find(' ', sp + 1) != std::string_view::npos)
              cursor.fail("model.merges", "a merge must be two tokens separated by one space");
            merge_pairs.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
          } else {
            cursor.begin_array("model.merges");
            std::string a, b;
            if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
            a = std::string(cursor.read_string("model.merges"));
            if (!cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair needs two tokens");
            b = std::string(cursor.read_string("model.merges"));
            if (cursor.next_element("model.merges")) cursor.fail("model.merges", "a merge pair has exactly two tokens");
            merge_pairs.emplace_back(std::move(a), std::move(b));
          }
        }
      } else {
        const json_value v = json_value::read(cursor, k);
        if (k == "type") {
          if (v.kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': model.type must be a string");
          type = v.as_string();
        } else if (k == "dropout" || k == "unk_token" || k == "continuing_subword_prefix" || k == "end_of_word_suffix") {
          require_null_or(&v, name, "model." + k);
        } else if (k == "byte_fallback") {
          if (v.kind() == json_kind::boolean && v.as_bool()) unsupported(name, "model.byte_fallback = true");
        } else if (k == "ignore_merges") {
          ignore_merges_ = v.kind() == json_kind::boolean && v.as_bool();
        }
      }
    }
    if (type != "BPE") unsupported(name, "model type '" + type + "'");
    if (!have_vocab || !have_merges) throw invalid_argument("tokenizer '" + name + "': model needs \"vocab\" and \"merges\"");
    std::size_t slots = 16;
    while (slots < 2 * merge_pairs.size()) slots *= 2;
    merge_table_.assign(slots, merge_slot{empty_key, {0, 0}});
    merge_mask_ = slots - 1;
    for (std::size_t r = 0; r < merge_pairs.size(); ++r) {
      const auto& [a, b] = merge_pairs[r];
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        throw invalid_argument("tokenizer '" + name + "': merge " + std::to_string(r) + " ('" + a + "' '" + b + "') uses a token missing from the vocab");
      const std::uint64_t key = pair_key(ia->second, ib->second);
      std::size_t i = splitmix64_mix(key) & merge_mask_;
      while (merge_table_[i].key != empty_key && merge_table_[i].key != key) i = (i + 1) & merge_mask_;
      if (merge_table_[i].key == empty_key) ++merge_count_;
      merge_table_[i] = {key, {static_cast<std::int32_t>(r), iab->second}};  // a repeated pair: the last wins, as in the package
    }
    // Pairs of low ids (a byte-level vocabulary puts its 256 byte tokens and its first merges
    // there, and most lookups are of those) also go into a dense table: one load, no probe.
    dense_.assign(std::size_t{dense_ids} * dense_ids, merge_target{no_rank, 0});
    for (const merge_slot& m : merge_table_) {
      if (m.key == empty_key) continue;
      const auto a = static_cast<std::uint32_t>(m.key >> 32), b = static_cast<std::uint32_t>(m.key & 0xffffffffu);
      if (a < dense_ids && b < dense_ids) dense_[std::size_t{a} * dense_ids + b] = m.target;
    }
    const auto map = bpe_detail::byte_to_unicode();
    for (std::size_t b = 0; b < 256; ++b) {
      std::string s;
      bpe_detail::append_utf8(s, map[b]);
      byte_chars_[b] = s;
      const auto it = vocab_.find(s);
      byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    }
  }

  [[nodiscard]] const merge_target* find_merge(token_id a, token_id b) const noexcept {
    if (static_cast<std::uint32_t>(a) < dense_ids && static_cast<std::uint32_t>(b) < dense_ids) {
      const merge_target& t = dense_[static_cast<std::size_t>(a) * dense_ids + static_cast<std::size_t>(b)];
      return t.rank == no_rank ? nullptr : &t;
    }
    const std::uint64_t key = pair_key(a, b);
    for (std::size_t i = splitmix64_mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
      if (merge_table_[i].key == key) return &merge_table_[i].target;
      if (merge_table_[i].key == empty_key) return nullptr;
    }
  }

  void encode_valid(std::string_view text, std::vector<token_id>& out) {
    if (added_.empty()) {
      encode_plain(text, out);
      return;
    }
    // Pass 1: tokens with normalized = false; pass 2 (inside): normalized = true.
    split_added(text, false, out);
  }

  void split_added(std::string_view text, bool normalized, std::vector<token_id>& out) {
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
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
      emit_segment(text.substr(start, i - start), normalized, out);
      out.push_back(hit->id);
      i += hit->content.size();
      start = i;
    }
    emit_segment(text.substr(start), normalized, out);
  }

  void emit_segment(std::string_view segment, bool normalized_pass, std::vector<token_id>& out) {
    if (segment.empty()) return;
    if (!normalized_pass)
      split_added(segment, true, out);
    else
      encode_plain(segment, out);
  }

  void encode_plain(std::string_view text, std::vector<token_id>& out) {
    byte_level_split(text, [&](std::string_view piece) { encode_piece(piece, out); });
  }

  void encode_piece(std::string_view piece, std::vector<token_id>& out) {
    const bool cacheable = piece.size() <= max_cached_piece;
    std::uint64_t hash = 0;
    std::size_t slot = 0;
    if (cacheable) {
      if (cache_table_.empty()) cache_table_.assign(2 * cache_capacity, cache_slot{0, 0, 0, 0, 0});
      hash = piece_hash(piece);
      for (slot = hash & (cache_table_.size() - 1); cache_table_[slot].hash != 0; slot = (slot + 1) & (cache_table_.size() - 1)) {
        const cache_slot& c = cache_table_[slot];
        if (c.hash == hash && c.byte_count == piece.size() && std::string_view(cache_bytes_).substr(c.bytes_at, c.byte_count) == piece) {
          out.insert(out.end(), cache_ids_.begin() + c.ids_at, cache_ids_.begin() + c.ids_at + c.id_count);
          return;
        }
      }
    }
    word_.clear();
    if (ignore_merges_) {
      std::string spelled;
      for (char c : piece) spelled += byte_chars_[static_cast<unsigned char>(c)];
      if (const auto it = vocab_.find(spelled); it != vocab_.end()) word_.push_back(it->second);
    }
    if (word_.empty()) merge_word(piece);
    if (cacheable) {
      if (cache_entries_ >= cache_capacity) {  // full: start over
        std::fill(cache_table_.begin(), cache_table_.end(), cache_slot{0, 0, 0, 0, 0});
        cache_bytes_.clear();
        cache_ids_.clear();
        cache_entries_ = 0;
        for (slot = hash & (cache_table_.size() - 1); cache_table_[slot].hash != 0; slot = (slot + 1) & (cache_table_.size() - 1)) {
        }
      }
      cache_table_[slot] = {hash, static_cast<std::uint32_t>(cache_bytes_.size()), static_cast<std::uint32_t>(cache_ids_.size()),
                            static_cast<std::uint16_t>(piece.size()), static_cast<std::uint16_t>(word_.size())};
      cache_bytes_.append(piece);
      cache_ids_.insert(cache_ids_.end(), word_.begin(), word_.end());
      ++cache_entries_;
    }
    out.insert(out.end(), word_.begin(), word_.end());
  }

  // Words of up to `small_word` bytes: the same order of merges (lowest rank, then leftmost)
  // by a scan over an array of pair ranks, cheaper than a heap for short words.
  static constexpr std::size_t small_word = 64;

  void merge_small_word(std::string_view piece) {
    // The symbols sit in fixed arrays linked in order; rank[i] is the rank of the pair that
    // starts at live symbol i (none for the last one and for dead slots). The minimum is
    // found in two levels, 8 blocks of 8 slots, so a merge costs O(8 + 8) compares and three
    // block refreshes instead of a scan and a shift of the whole word. Leftmost among equal
    // ranks: the first block holding the minimum, then its first slot.
    constexpr std::int32_t none = std::numeric_limits<std::int32_t>::max();
    constexpr std::size_t block = 8, blocks = small_word / block;
    std::array<token_id, small_word> ids{};
    std::array<token_id, small_word> merged{};
    std::array<std::int32_t, small_word> rank{};
    std::array<std::uint8_t, small_word> next{}, prev{};
    std::array<std::int32_t, blocks> block_min{};
    constexpr std::uint8_t end = 0xff;
    std::size_t n = 0;
    for (char c : piece) {
      const token_id id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) ids[n++] = id;  // no unk token: the package drops it
    }
    if (n == 0) return;
    rank.fill(none);
    for (std::size_t i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? static_cast<std::uint8_t>(i + 1) : end;
      prev[i] = i > 0 ? static_cast<std::uint8_t>(i - 1) : end;
    }
    auto set_pair = [&](std::size_t i) {
      if (next[i] == end) {
        rank[i] = none;
        return;
      }
      const merge_target* m = find_merge(ids[i], ids[next[i]]);
      rank[i] = m != nullptr ? m->rank : none;
      merged[i] = m != nullptr ? m->id : 0;
    };
    auto refresh = [&](std::size_t b) {
      std::int32_t lo = none;
      for (std::size_t i = b * block; i < (b + 1) * block; ++i) lo = std::min(lo, rank[i]);
      block_min[b] = lo;
    };
    for (std::size_t i = 0; i + 1 < n; ++i) set_pair(i);
    for (std::size_t b = 0; b < blocks; ++b) refresh(b);
    while (true) {
      std::size_t best_block = 0;
      for (std::size_t b = 1; b < blocks; ++b)
        if (block_min[b] < block_min[best_block]) best_block = b;
      const std::int32_t lo = block_min[best_block];
      if (lo == none) break;
      std::size_t i = best_block * block;
      while (rank[i] != lo) ++i;
      const std::size_t j = next[i];
      ids[i] = merged[i];
      next[i] = next[j];
      if (next[j] != end) prev[next[j]] = static_cast<std::uint8_t>(i);
      rank[j] = none;
      set_pair(i);
      refresh(j / block);
      refresh(i / block);
      if (prev[i] != end) {
        set_pair(prev[i]);
        refresh(prev[i] / block);
      }
    }
    for (std::size_t i = 0; i != end; i = next[i]) word_.push_back(ids[i]);
  }

  void merge_word(std::string_view piece) {
    if (piece.size() <= small_word) {
      merge_small_word(piece);
      return;
    }
    symbols_.clear();
    for (char c : piece) {
      const token_id id = byte_ids_[static_cast<unsigned char>(c)];
      if (id < 0) continue;  // no unk token: the package drops it
      const auto idx = static_cast<std::int32_t>(symbols_.size());
      symbols_.push_back({id, idx - 1, idx + 1, true});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    // A min-heap on (rank, position) in a reused vector; a candidate is stale when the
    // pair at its position changed since it was pushed.
    heap_.clear();
    const auto later = [](const candidate& a, const candidate& b) { return a > b; };
    auto candidate_at = [&](std::int32_t pos, candidate& out) {
      const std::int32_t nx = symbols_[static_cast<std::size_t>(pos)].next;
      if (nx < 0) return false;
      const token_id a = symbols_[static_cast<std::size_t>(pos)].id, b = symbols_[static_cast<std::size_t>(nx)].id;
      const merge_target* m = find_merge(a, b);
      if (m == nullptr) return false;
      out = {m->rank, pos, m->id, a, b};
      return true;
    };
    auto push_pair = [&](std::int32_t pos) {
      candidate c{};
      if (!candidate_at(pos, c)) return;
      heap_.push_back(c);
      std::push_heap(heap_.begin(), heap_.end(), later);
    };
    candidate c{};
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols_.size()); ++i)
      if (candidate_at(i, c)) heap_.push_back(c);
    std::make_heap(heap_.begin(), heap_.end(), later);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      const candidate top = heap_.back();
      heap_.pop_back();
      symbol& left = symbols_[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      symbol& right = symbols_[static_cast<std::size_t>(left.next)];
      if (left.id != top.left || right.id != top.right) continue;  // stale: the pair changed
      left.id = top.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
    for (const symbol& s : symbols_)
      if (s.alive) word_.push_back(s.id);
  }

  std::unordered_map<std::string, token_id> vocab_;
  std::vector<merge_slot> merge_table_;
  std::size_t merge_mask_ = 0;
  // Merges of two ids below dense_ids, indexed a * dense_ids + b (2 MiB); no_rank: none.
  static constexpr std::uint32_t dense_ids = 512;
  static constexpr std::int32_t no_rank = std::numeric_limits<std::int32_t>::max();
  std::vector<merge_target> dense_;
  std::size_t merge_count_ = 0;
  std::vector<added_token> added_;
  std::array<token_id, 256> byte_ids_{};
  std::array<std::string, 256> byte_chars_{};
  bool ignore_merges_ = false;
  std::vector<cache_slot> cache_table_;
  std::string cache_bytes_;
  std::vector<token_id> cache_ids_;
  std::size_t cache_entries_ = 0;
  std::vector<symbol> symbols_;
  std::vector<token_id> word_;
  std::vector<candidate> heap_;
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_{};  // indices into added_
};

}  // namespace hybridcache::sim
