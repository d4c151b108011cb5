// hybridcache/sim/tokenizer/text_tokenizer.hpp
//
// A deterministic built-in tokenizer for replaying text traces (ShareGPT) without a model
// vocabulary, and the word count behind the think-time model.
//
// A prefix cache only needs two things from a tokenizer: equal text gives equal ids, and
// the number of tokens is roughly what a real BPE gives. This one splits UTF-8 text into
// pieces and hashes each piece (FNV-1a 64) into an id in [16, 2^31 - 1); ids 0-15 are left
// for markers (role tokens). The rules, in order:
//   letters   a run of letters (ASCII, Latin-1/Extended, Greek, Cyrillic) is cut into
//             pieces of at most 6 letters; a single space right before the run is part of
//             its first piece (as GPT-style BPEs fold " word" into one token);
//   digits    a run of digits is cut into pieces of at most 3 (as Llama 3 / GPT-4 do);
//   spaces    any other run of whitespace is one token (indentation, blank lines);
//   others    every other code point is one token: punctuation, CJK ideographs, kana,
//             hangul, emoji; an invalid UTF-8 byte is one token.
// Bias against real BPEs (estimates from the BPEs' published characters-per-token ratios,
// not measured here; see docs/traces.md):
//   English prose  about 1 token per word, close to Llama 2 / GPT-4 (1.2-1.3 per word);
//                  long or rare words count 2 instead of 3-4, so it under-counts a little;
//   code           one token per punctuation character over-counts runs like "});" or
//                  "!=" that BPEs merge;
//   Chinese        1 per character: Llama 2 (32k vocabulary, byte fallback) needs about 1.5,
//                  GPT-4o / Qwen about 0.7, so it sits between the two;
//   emoji          1 per code point; byte-level BPEs often need 2-3.
// A hash collision merges two different pieces into one id: with 2^31 ids and the tens of
// thousands of distinct pieces in a trace, a few collisions are possible; they can only
// create a spurious one-token match, never change lengths.
//
// Cost: O(bytes), no allocation besides the output vector.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::sim {

/// Reserved ids for message markers (a minimal chat template).
inline constexpr token_id role_token_system = 1;
inline constexpr token_id role_token_user = 2;
inline constexpr token_id role_token_assistant = 3;
/// First id the tokenizer gives to text.
inline constexpr token_id first_text_token = 16;

namespace detail {

struct code_point {
  std::uint32_t value;  // 0xFFFFFFFF for an invalid byte
  std::size_t bytes;
};

// Decodes one UTF-8 code point at s[i] (i < s.size()).
[[nodiscard]] inline code_point decode_utf8(std::string_view s, std::size_t i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return {0xFFFFFFFFu, 1};
  }
  if (i + n > s.size()) return {0xFFFFFFFFu, 1};
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {0xFFFFFFFFu, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, n};
}

enum class char_class { letter, digit, space, other };

[[nodiscard]] constexpr char_class classify_approx(std::uint32_t cp) noexcept {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return char_class::letter;
  if (cp >= '0' && cp <= '9') return char_class::digit;
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0xA0 || cp == 0x3000)
    return char_class::space;
  if (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) return char_class::letter;  // Latin-1, Latin Extended
  if (cp >= 0x370 && cp <= 0x52F) return char_class::letter;                             // Greek, Cyrillic
  return char_class::other;
}

// Code points that count as a word on their own (CJK ideographs, kana, hangul syllables).
[[nodiscard]] constexpr bool is_cjk_word(std::uint32_t cp) noexcept {
  return (cp >= 0x3040 && cp <= 0x30FF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
         (cp >= 0xAC00 && cp <= 0xD7AF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x20000 && cp <= 0x3FFFF);
}

[[nodiscard]] constexpr token_id piece_id(std::string_view piece) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : piece) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  constexpr std::uint64_t span = 0x7FFFFFFFULL - static_cast<std::uint64_t>(first_text_token);
  return static_cast<token_id>(static_cast<std::uint64_t>(first_text_token) + h % span);
}

}  // namespace detail

/// Appends the tokens of UTF-8 `text` to `out` (rules in the file comment).
inline void tokenize_text(std::string_view text, std::vector<token_id>& out) {
  auto class_at = [text](std::size_t i, detail::code_point& cp) {
    cp = detail::decode_utf8(text, i);
    return cp.value == 0xFFFFFFFFu ? detail::char_class::other : detail::classify_approx(cp.value);
  };
  // Emits the run of `cls` that starts at `run_begin`, cut into pieces of at most 6
  // letters or 3 digits; the first piece starts at `piece_begin` (a leading space).
  auto emit_run = [&](std::size_t piece_begin, std::size_t run_begin, detail::char_class cls) {
    const std::size_t limit = cls == detail::char_class::letter ? 6 : 3;
    std::size_t count = 0, k = run_begin;
    detail::code_point cp{};
    while (k < text.size() && class_at(k, cp) == cls) {
      if (count == limit) {
        out.push_back(detail::piece_id(text.substr(piece_begin, k - piece_begin)));
        piece_begin = k;
        count = 0;
      }
      k += cp.bytes;
      ++count;
    }
    out.push_back(detail::piece_id(text.substr(piece_begin, k - piece_begin)));
    return k;
  };
  std::size_t i = 0;
  detail::code_point cp{};
  while (i < text.size()) {
    const detail::char_class cls = class_at(i, cp);
    if (cls == detail::char_class::letter || cls == detail::char_class::digit) {
      i = emit_run(i, i, cls);
    } else if (cls == detail::char_class::space) {
      std::size_t j = i;
      detail::code_point c{};
      while (j < text.size() && class_at(j, c) == detail::char_class::space) j += c.bytes;
      // A single ' ' right before a letter or digit joins that word; the rest of the
      // whitespace run (if any) is one token.
      detail::char_class next = detail::char_class::other;
      if (j < text.size()) next = class_at(j, c);
      const bool joins = text[j - 1] == ' ' && (next == detail::char_class::letter || next == detail::char_class::digit);
      const std::size_t run_end = joins ? j - 1 : j;
      if (run_end > i) out.push_back(detail::piece_id(text.substr(i, run_end - i)));
      i = joins ? emit_run(j - 1, j, next) : j;
    } else {
      out.push_back(detail::piece_id(text.substr(i, cp.bytes)));
      i += cp.bytes;
    }
  }
}

/// Words for the think-time model: runs of letters, runs of digits, and each CJK
/// ideograph, kana or hangul syllable (Chinese has no spaces, so a character is the
/// closest unit to an English word a typist types).
[[nodiscard]] inline std::int64_t count_words(std::string_view text) noexcept {
  std::int64_t words = 0;
  detail::char_class previous = detail::char_class::space;
  for (std::size_t i = 0; i < text.size();) {
    const detail::code_point cp = detail::decode_utf8(text, i);
    const detail::char_class cls = cp.value == 0xFFFFFFFFu ? detail::char_class::other : detail::classify_approx(cp.value);
    if ((cls == detail::char_class::letter || cls == detail::char_class::digit) && cls != previous) ++words;
    if (cls == detail::char_class::other && detail::is_cjk_word(cp.value)) ++words;
    previous = cls;
    i += cp.bytes;
  }
  return words;
}

/// Number of ' ' characters: Marconi's word count (utils/generate_trace.py counts spaces in
/// the user's text).
[[nodiscard]] inline std::int64_t count_spaces(std::string_view text) noexcept {
  std::int64_t n = 0;
  for (char c : text) n += c == ' ' ? 1 : 0;
  return n;
}

}  // namespace hybridcache::sim
