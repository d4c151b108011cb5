// Checker for tests/tokenizer/hf_exact.py: `bpe_check tokenizer.json cases.txt [--fast]
// [--special-tokens | --split | --nfc]`, where each line of cases.txt is "<hex bytes>\t<ids separated by
// spaces>" (the ids the Hugging Face package gave for the bytes decoded with
// errors="replace"; with --special-tokens its default encode, which adds the
// post-processor's special tokens, checked against `encode_with_special_tokens`; without,
// its add_special_tokens=False, checked against `encode`; with --split the byte lengths of
// the package's pre-tokenizer pieces, checked against `pretokenize` of the
// replacement-decoded text; with --nfc the code points of the package's NFC of the text,
// checked against nfc_normalizer). Prints the count, the first
// mismatches, the split and whether the fast encoder (bpe_backtracking.hpp) was on; exit 0
// when every string matches (and, with --fast, the fast encoder was on; with
// --out-of-order, on for a merge list out of rank order).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>

namespace {
int hex(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
}  // namespace

int main(int argc, char** argv) {
  bool need_fast = false, specials = false, split = false, nfc = false, need_out_of_order = false, usage = argc < 3;
  for (int i = 3; i < argc; ++i) {
    const std::string flag = argv[i];
    need_fast = need_fast || flag == "--fast";
    specials = specials || flag == "--special-tokens";
    split = split || flag == "--split";
    nfc = nfc || flag == "--nfc";
    need_out_of_order = need_out_of_order || flag == "--out-of-order";
    usage = usage || (flag != "--fast" && flag != "--special-tokens" && flag != "--split" && flag != "--nfc" && flag != "--out-of-order");
  }
  if (usage) {
    std::fprintf(stderr, "usage: bpe_check tokenizer.json cases.txt [--fast] [--out-of-order] [--special-tokens | --split | --nfc]\n");
    return 2;
  }
  try {
    auto tok = hybridcache::sim::bpe_tokenizer::from_file(argv[1]);
    std::ifstream in(argv[2]);
    std::string line;
    long total = 0, bad = 0;
    std::vector<hybridcache::token_id> got, want;
    double seconds = 0;
    while (std::getline(in, line)) {
      const auto tab = line.find('\t');
      if (tab == std::string::npos) continue;
      std::string raw;
      for (std::size_t i = 0; i + 1 < tab; i += 2) raw.push_back(static_cast<char>(hex(line[i]) * 16 + hex(line[i + 1])));
      want.clear();
      const char* p = line.data() + tab + 1;
      const char* end = line.data() + line.size();
      while (p < end) {
        int v = 0;
        auto r = std::from_chars(p, end, v);
        if (r.ec != std::errc{}) break;
        want.push_back(v);
        p = r.ptr;
        while (p < end && *p == ' ') ++p;
      }
      got.clear();
      const auto t0 = std::chrono::steady_clock::now();
      if (nfc) {
        std::string clean, normalized;
        std::vector<std::uint32_t> scratch;
        hybridcache::sim::utf8_replace_invalid(raw, clean);
        hybridcache::sim::nfc_normalizer::get().normalize(clean, normalized, scratch);
        for (std::size_t i = 0; i < normalized.size();) {
          std::size_t len = 0;
          got.push_back(static_cast<int>(hybridcache::sim::detail::decode_at(
              reinterpret_cast<const unsigned char*>(normalized.data()) + i, len)));
          i += len;
        }
      } else if (split) {
        std::string clean;
        hybridcache::sim::utf8_replace_invalid(raw, clean);
        (void)hybridcache::sim::pretokenize(tok.pre_tokenizer(), clean,
                                            [&](std::string_view piece) { got.push_back(static_cast<int>(piece.size())); });
      } else if (specials) {
        tok.encode_with_special_tokens(raw, got);
      } else {
        tok.encode(raw, got);
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++total;
      if (got != want) {
        if (++bad <= 10) {
          std::printf("MISMATCH %s\n  want", line.substr(0, tab).c_str());
          for (auto v : want) std::printf(" %d", v);
          std::printf("\n  got ");
          for (auto v : got) std::printf(" %d", v);
          std::printf("\n");
        }
      }
    }
    std::printf("bpe_check %s: %ld strings, %ld mismatches (split %s%s, Unicode tables %s, fast encoder %s%s), %.3f s\n", argv[1], total,
                bad, std::string(hybridcache::sim::split_pattern_name(tok.pre_tokenizer())).c_str(),
                specials ? ", with special tokens" : split ? ", pieces" : nfc ? ", NFC" : "", hybridcache::sim::data::unicode_ln_version,
                tok.fast_encoder() ? "on" : "off", tok.fast_encoder() && !tok.merges_in_rank_order() ? ", merges out of rank order" : "", seconds);
    const bool order_ok = !need_out_of_order || (tok.fast_encoder() && !tok.merges_in_rank_order());
    return bad == 0 && total > 0 && (tok.fast_encoder() || !need_fast) && order_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bpe_check: %s\n", e.what());
    return 1;
  }
}
