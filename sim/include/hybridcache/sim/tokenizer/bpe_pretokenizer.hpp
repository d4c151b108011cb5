// hybridcache/sim/tokenizer/bpe_pretokenizer.hpp
//
// The components of a byte-level BPE tokenizer.json (bpe_tokenizer.hpp) that sit around
// the model: whether the text is normalized first (NFC, unicode_nfc.hpp), which regex
// splits it into pre-tokens, and which special tokens `encode` adds around a sequence.
//
// Splits. There is no regex engine here: a tokenizer.json names its split by a regex, and
// the three spellings models ship are recognised exactly and each is a hand-written scanner
// that returns what the package's Oniguruma match returns (leftmost alternative first,
// greedy quantifiers with backtracking). Any other regex is rejected with its text, never
// approximated.
//
//   gpt2    ByteLevel with use_regex (GPT-2, the byte-level BPEs the package trains):
//             's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3  Split (behavior Isolated) then ByteLevel without use_regex (Llama 3, 3.1, 3.2, 3.3):
//             (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2   the same with \p{N} for \p{N}{1,3}: one digit per piece (Qwen 2, 2.5, 3)
//
// What the Llama 3 pattern takes at a position, alternative by alternative (each scanner
// below follows this list):
//   1. an apostrophe and s, t, re, ve, m, ll or d in any case (U+017F LONG S folds to s);
//   2. letters, after at most one character that is not CR, LF, a letter or a number
//      (" word", "$word", "\tword");
//   3. one to three (one: qwen2) numbers;
//   4. an optional space, characters that are not whitespace, letters or numbers, then any
//      CRs and LFs ("!!\n");
//   5. a whitespace run up to and including its last CR or LF;
//   6. a whitespace run without its last character when a non-space follows it (that
//      character joins the next piece as alternative 2's lead);
//   7. the rest of a whitespace run.
// \p{L} and \p{N} come from data/unicode_ln.hpp and \s is Unicode White_Space, as for the
// GPT-2 split (utf8_pretokenize.hpp).
//
// Post-processors add special tokens around an encoding only when asked (`encode(text)` in
// the package adds them by default): TemplateProcessing's "single" template, alone or in a
// Sequence with ByteLevel (which changes offsets only). A replay tokenizes a rendered chat
// prompt the way a server does, without them (the template writes BOS as text, an added
// token); `bpe_tokenizer::encode_with_special_tokens` applies them.
//
// Costs: the splits are O(length) with one class lookup per character, allocation-free;
// parsing is O(size of the JSON value).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/json_value.hpp"
#include "hybridcache/sim/tokenizer/utf8_pretokenize.hpp"

namespace hybridcache::sim {

/// The regex a byte-level pre-tokenizer splits by. See the file comment.
enum class split_pattern : std::uint8_t { gpt2, llama3, qwen2 };

/// The pattern's name, for reports ("gpt2", "llama3", "qwen2").
[[nodiscard]] constexpr std::string_view split_pattern_name(split_pattern p) noexcept {
  switch (p) {
    case split_pattern::llama3: return "llama3";
    case split_pattern::qwen2: return "qwen2";
    default: return "gpt2";
  }
}

/// The pattern a Split pre-tokenizer's regex spells (exactly, as a tokenizer.json holds it
/// after JSON unescaping), or nothing for any other regex.
[[nodiscard]] inline std::optional<split_pattern> known_split_regex(std::string_view regex) noexcept {
  static constexpr std::string_view gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (regex == gpt2) return split_pattern::gpt2;
  if (regex == llama3) return split_pattern::llama3;
  if (regex == qwen2) return split_pattern::qwen2;
  return std::nullopt;
}

namespace detail {

// The end of the case-insensitive contraction at s[p] ('s 't 're 've 'm 'll 'd; U+017F
// LONG S folds to s), or 0.
[[nodiscard]] inline std::size_t contraction_end_ci(const unsigned char* s, std::size_t n, std::size_t p) noexcept {
  if (s[p] != '\'' || p + 1 >= n) return 0;
  const unsigned c1 = s[p + 1] | 0x20u;  // ASCII letters lower-cased; other bytes never match below
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
  if (s[p + 1] == 0xC5 && p + 2 < n && s[p + 2] == 0xBF) return p + 3;  // U+017F
  if (p + 2 >= n) return 0;
  const unsigned c2 = s[p + 2] | 0x20u;
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return p + 3;
  return 0;
}

}  // namespace detail

/// Calls `emit(piece)` for each piece of valid UTF-8 `text` split by the Llama 3 pattern
/// (`max_digits` 3) or Qwen 2's (1). With `Checked`, `text` may be any bytes: the split
/// stops (emitting nothing more) and returns false at the first piece holding an ill-formed
/// sequence; else it returns true.
template <bool Checked = false, class Emit>
bool llama3_split(std::string_view text, std::size_t max_digits, Emit&& emit) {
  using detail::cclass;
  using detail::class_at;
  using detail::run_end;
  const detail::class_table& table = detail::class_table::get();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  auto crlf = [](unsigned char c) { return c == '\r' || c == '\n'; };
  bool bad = false;
  std::size_t p = 0, len = 0;
  while (p < n) {
    std::size_t end = detail::contraction_end_ci(s, n, p);  // 1
    if (end == 0) {
      const cclass cls = class_at<Checked>(s, n, p, table, len, bad);
      std::size_t l2 = 0;
      if (cls == cclass::letter) {  // 2 without its lead
        end = run_end<Checked>(s, n, p + len, cclass::letter, table, bad);
      } else if (cls != cclass::number && !crlf(s[p]) && p + len < n &&
                 class_at<Checked>(s, n, p + len, table, l2, bad) == cclass::letter) {  // 2 with its lead
        end = run_end<Checked>(s, n, p + len + l2, cclass::letter, table, bad);
      } else if (cls == cclass::number) {  // 3
        end = p + len;
        for (std::size_t digits = 1; digits < max_digits && end < n; ++digits) {
          if (class_at<Checked>(s, n, end, table, l2, bad) != cclass::number) break;
          end += l2;
        }
      } else if (cls == cclass::other ||
                 (s[p] == ' ' && p + 1 < n && class_at<Checked>(s, n, p + 1, table, l2, bad) == cclass::other)) {  // 4
        end = run_end<Checked>(s, n, cls == cclass::other ? p : p + 1, cclass::other, table, bad);
        while (end < n && crlf(s[end])) ++end;
      } else {  // whitespace: 5, else 6, else 7
        const detail::space_run r = detail::whitespace_run<Checked>(s, n, p, table, bad);
        end = r.after_crlf != 0 ? r.after_crlf : r.end;
      }
    }
    if (Checked && bad) return false;
    emit(std::string_view(text.data() + p, end - p));
    p = end;
  }
  return true;
}

/// Splits `text` by `pattern` (byte_level_split or llama3_split; same contract).
template <bool Checked = false, class Emit>
HYBRIDCACHE_FORCEINLINE bool pretokenize(split_pattern pattern, std::string_view text, Emit&& emit) {
  if (pattern == split_pattern::gpt2) return byte_level_split<Checked>(text, emit);
  return llama3_split<Checked>(text, pattern == split_pattern::llama3 ? 3 : 1, emit);
}

/// The special tokens a post-processor's "single" template puts around a sequence.
struct special_token_template {
  std::vector<token_id> prefix;  ///< before the sequence (e.g. BOS)
  std::vector<token_id> suffix;  ///< after it (e.g. EOS)
};

namespace detail {

[[noreturn]] inline void unsupported_component(const std::string& name, const std::string& what) {
  throw invalid_argument("tokenizer '" + name + "': " + what + " is not implemented (supported: byte-level BPE, see bpe_tokenizer.hpp)");
}

inline const std::string& json_type(const json_value& v, const std::string& name, const std::string& where) {
  const json_value* t = v.kind() == json_kind::object ? v.find("type") : nullptr;
  if (t == nullptr || t->kind() != json_kind::string) throw invalid_argument("tokenizer '" + name + "': " + where + " has no \"type\"");
  return t->as_string();
}

inline bool json_bool(const json_value& obj, std::string_view key, bool fallback, const std::string& name) {
  const json_value* v = obj.find(key);
  if (v == nullptr || v->is_null()) return fallback;
  if (v->kind() != json_kind::boolean) throw invalid_argument("tokenizer '" + name + "': '" + std::string(key) + "' must be a boolean");
  return v->as_bool();
}

inline const std::vector<json_value>& json_array(const json_value& obj, std::string_view key, const std::string& name,
                                                 const std::string& where) {
  const json_value* v = obj.find(key);
  if (v == nullptr || v->kind() != json_kind::array)
    throw invalid_argument("tokenizer '" + name + "': " + where + " needs an array \"" + std::string(key) + "\"");
  return v->as_array();
}

// A ByteLevel pre-tokenizer: its use_regex (add_prefix_space must be false).
inline bool byte_level_use_regex(const json_value& v, const std::string& name) {
  if (json_bool(v, "add_prefix_space", true, name)) unsupported_component(name, "ByteLevel add_prefix_space = true");
  return json_bool(v, "use_regex", true, name);
}

// A Split pre-tokenizer: the pattern its regex spells (behavior Isolated, not inverted).
inline split_pattern split_of(const json_value& v, const std::string& name) {
  const json_value* pattern = v.find("pattern");
  const json_value* regex = pattern != nullptr && pattern->kind() == json_kind::object ? pattern->find("Regex") : nullptr;
  if (regex == nullptr || regex->kind() != json_kind::string) unsupported_component(name, "a Split pre_tokenizer without a \"Regex\" pattern");
  const json_value* behavior = v.find("behavior");
  if (behavior == nullptr || behavior->kind() != json_kind::string || behavior->as_string() != "Isolated")
    unsupported_component(name, "a Split pre_tokenizer whose behavior is not \"Isolated\"");
  if (json_bool(v, "invert", false, name)) unsupported_component(name, "an inverted Split pre_tokenizer");
  const auto known = known_split_regex(regex->as_string());
  if (!known) unsupported_component(name, "the Split regex '" + regex->as_string() + "' (known: the GPT-2, Llama 3 and Qwen 2 patterns)");
  return *known;
}

}  // namespace detail

/// The split a tokenizer.json's "pre_tokenizer" makes: ByteLevel with use_regex (GPT-2), or
/// a Sequence of a Split by a known regex and ByteLevel without use_regex (a one-element
/// Sequence reads as its element). Throws `invalid_argument` naming anything else.
[[nodiscard]] inline split_pattern parse_pre_tokenizer(const json_value& v, const std::string& name) {
  if (v.is_null()) detail::unsupported_component(name, "a null pre_tokenizer");
  const std::string& type = detail::json_type(v, name, "pre_tokenizer");
  if (type == "ByteLevel") {
    if (!detail::byte_level_use_regex(v, name)) detail::unsupported_component(name, "ByteLevel use_regex = false without a Split before it");
    return split_pattern::gpt2;
  }
  if (type != "Sequence") detail::unsupported_component(name, "pre_tokenizer '" + type + "'");
  const auto& parts = detail::json_array(v, "pretokenizers", name, "pre_tokenizer Sequence");
  if (parts.size() == 1) return parse_pre_tokenizer(parts[0], name);
  if (parts.size() != 2 || detail::json_type(parts[0], name, "pre_tokenizer") != "Split" ||
      detail::json_type(parts[1], name, "pre_tokenizer") != "ByteLevel")
    detail::unsupported_component(name, "a pre_tokenizer Sequence other than [Split, ByteLevel]");
  const split_pattern p = detail::split_of(parts[0], name);
  if (detail::byte_level_use_regex(parts[1], name))
    detail::unsupported_component(name, "ByteLevel use_regex = true after a Split (two splits)");
  return p;
}

/// Whether a tokenizer.json's "normalizer" is NFC (Qwen 2, 2.5, 3): false for null, true for
/// NFC alone or in a one-element Sequence. Throws `invalid_argument` naming anything else.
[[nodiscard]] inline bool parse_normalizer(const json_value& v, const std::string& name) {
  if (v.is_null()) return false;
  const std::string& type = detail::json_type(v, name, "normalizer");
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const auto& parts = detail::json_array(v, "normalizers", name, "normalizer Sequence");
    if (parts.empty()) return false;
    if (parts.size() == 1) return parse_normalizer(parts[0], name);
    detail::unsupported_component(name, "a normalizer Sequence of more than one normalizer");
  }
  detail::unsupported_component(name, "normalizer '" + type + "'");
}

/// The special tokens a tokenizer.json's "post_processor" adds around one sequence: none for
/// null or ByteLevel; TemplateProcessing's "single" template (special tokens and the
/// sequence "A" once), alone or in a Sequence with ByteLevel processors. Throws
/// `invalid_argument` naming anything else.
[[nodiscard]] inline special_token_template parse_post_processor(const json_value& v, const std::string& name) {
  special_token_template out;
  if (v.is_null()) return out;
  bool have_template = false;
  auto one = [&](const json_value& p, auto& self) -> void {
    const std::string& type = detail::json_type(p, name, "post_processor");
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      for (const json_value& q : detail::json_array(p, "processors", name, "post_processor Sequence")) self(q, self);
      return;
    }
    if (type != "TemplateProcessing") detail::unsupported_component(name, "post_processor '" + type + "'");
    if (have_template) detail::unsupported_component(name, "two TemplateProcessing post_processors");
    have_template = true;
    const json_value* specials = p.find("special_tokens");
    bool seen_sequence = false;
    for (const json_value& item : detail::json_array(p, "single", name, "TemplateProcessing")) {
      if (item.kind() != json_kind::object) throw invalid_argument("tokenizer '" + name + "': a TemplateProcessing item must be an object");
      if (const json_value* seq = item.find("Sequence"); seq != nullptr) {
        const json_value* id = seq->kind() == json_kind::object ? seq->find("id") : nullptr;
        if (id == nullptr || id->kind() != json_kind::string || id->as_string() != "A" || seen_sequence)
          throw invalid_argument("tokenizer '" + name + "': TemplateProcessing \"single\" must hold sequence \"A\" once");
        seen_sequence = true;
        continue;
      }
      const json_value* tok = item.find("SpecialToken");
      const json_value* tok_id = tok != nullptr && tok->kind() == json_kind::object ? tok->find("id") : nullptr;
      if (tok_id == nullptr || tok_id->kind() != json_kind::string)
        throw invalid_argument("tokenizer '" + name + "': a TemplateProcessing item must be a Sequence or a SpecialToken with an \"id\"");
      const json_value* entry = specials != nullptr && specials->kind() == json_kind::object ? specials->find(tok_id->as_string()) : nullptr;
      const json_value* ids = entry != nullptr && entry->kind() == json_kind::object ? entry->find("ids") : nullptr;
      if (ids == nullptr || ids->kind() != json_kind::array)
        throw invalid_argument("tokenizer '" + name + "': TemplateProcessing special token '" + tok_id->as_string() + "' has no \"ids\"");
      for (const json_value& x : ids->as_array()) {
        if (!x.is_integer() || x.as_int() < 0 || x.as_int() > 0x7FFFFFFF)
          throw invalid_argument("tokenizer '" + name + "': TemplateProcessing special token '" + tok_id->as_string() + "': an id outside [0, 2^31)");
        (seen_sequence ? out.suffix : out.prefix).push_back(static_cast<token_id>(x.as_int()));
      }
    }
    if (!seen_sequence) throw invalid_argument("tokenizer '" + name + "': TemplateProcessing \"single\" must hold sequence \"A\" once");
  };
  one(v, one);
  return out;
}

}  // namespace hybridcache::sim
