// libFuzzer target: the byte-level BPE tokenizer (sim/include/hybridcache/sim/tokenizer/bpe_tokenizer.hpp).
// An input whose first byte is even is a tokenizer.json for `bpe_tokenizer::from_json` (it may
// only be rejected with a hybridcache::error; a loaded one then encodes its own text). One whose
// first byte is odd is text: encoded by a fixed random well-formed merge list
// (tests/support/bpe_random_model.hpp) piece by piece, by the fast encoder
// (bpe_backtracking.hpp) and by merging in the package's order (bpe_merges.hpp), which must
// agree where the fast encoder answers, and split by the Llama 3 and Qwen 2 patterns
// (bpe_pretokenizer.hpp), whose pieces must be non-empty and spell the text, and normalized
// by NFC (unicode_nfc.hpp), which must give valid UTF-8 that NFC leaves as it is and that
// `inert` calls inert when the text was (a difference aborts: a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/tokenizer/bpe_backtracking.hpp>
#include <hybridcache/sim/tokenizer/bpe_merges.hpp>
#include <hybridcache/sim/tokenizer/bpe_pretokenizer.hpp>
#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>
#include <hybridcache/sim/tokenizer/unicode_nfc.hpp>

#include "../support/bpe_random_model.hpp"

namespace {

struct fixed_model {
  bpe_test::random_model model;
  hybridcache::sim::bpe_backtracking_encoder fast;
  fixed_model() {
    std::mt19937_64 rng(2024);
    model = bpe_test::make_model(rng, 200, false);
    fast.build(model.table, model.byte_ids, model.id_limit());
    if (!fast.enabled()) std::abort();
  }
};

void differential(std::string_view text) {
  static fixed_model f;
  static hybridcache::sim::bpe_word_merger merger;
  std::string clean;
  hybridcache::sim::utf8_replace_invalid(text, clean);
  std::vector<hybridcache::token_id> fast, merged;
  hybridcache::sim::byte_level_split(clean, [&](std::string_view piece) {
    fast.clear();
    merged.clear();
    merger.merge(piece, f.model.byte_ids, f.model.table, merged);
    if (f.fast.encode(piece, f.model.table, fast) && fast != merged) std::abort();
  });
  for (const std::size_t digits : {std::size_t{3}, std::size_t{1}}) {
    std::string spelled;
    const bool ok = hybridcache::sim::llama3_split<true>(clean, digits, [&](std::string_view piece) {
      if (piece.empty()) std::abort();
      spelled.append(piece);
    });
    if (!ok || spelled != clean) std::abort();
  }
  const auto& nfc = hybridcache::sim::nfc_normalizer::get();
  std::string once, twice;
  std::vector<std::uint32_t> scratch;
  nfc.normalize(clean, once, scratch);
  if (!hybridcache::sim::is_valid_utf8(once)) std::abort();
  nfc.normalize(once, twice, scratch);
  if (twice != once || (nfc.inert(clean) && once != clean)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0) {
    differential(rest);
    return 0;
  }
  try {
    auto tok = hybridcache::sim::bpe_tokenizer::from_json(rest);
    std::vector<hybridcache::token_id> ids;
    tok.encode_with_special_tokens(rest, ids);
  } catch (const hybridcache::error&) {
  }
  return 0;
}
