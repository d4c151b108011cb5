// The BPE vocabulary table (sim/bpe_vocab.hpp) against std::unordered_map on random
// spellings: lengths 0-40 (every tail of the 8-byte hash), bytes including NUL and non-ASCII,
// repeated spellings re-assigned (the last id wins, first place kept), growth through many
// doublings, absent spellings, and first-insertion order.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <hybridcache/sim/bpe_vocab.hpp>

using namespace hybridcache::sim;

TEST_CASE("bpe_vocab equals a std::unordered_map on random spellings") {
  std::mt19937_64 rng(1919);
  for (int round = 0; round < 6; ++round) {
    bpe_vocab vocab;
    std::unordered_map<std::string, token_id> reference;
    std::vector<std::string> order;  // first insertions
    std::size_t bytes = 0;
    const std::size_t n = round == 5 ? 60000 : 50 + 700 * static_cast<std::size_t>(round);
    // A small alphabet makes spellings repeat and share prefixes; NUL and 0xFF bytes too.
    const std::string alphabet = std::string("ab\0\xff\xe4\xb8", 6);
    auto random_spelling = [&] {
      std::string s(rng() % 41, '\0');
      for (char& c : s) c = (rng() % 4 == 0) ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng() % 256);
      if (rng() % 3 == 0) s.resize(rng() % 4);  // many short ones
      return s;
    };
    for (std::size_t k = 0; k < n; ++k) {
      const std::string s = random_spelling();
      const auto id = static_cast<token_id>(rng() % 1000000);
      vocab.assign(s, id);
      if (reference.find(s) == reference.end()) {
        order.push_back(s);
        bytes += s.size();
      }
      reference[s] = id;
    }
    CAPTURE(round);
    REQUIRE(vocab.size() == reference.size());
    CHECK(vocab.bytes() == bytes);
    for (const auto& [s, id] : reference) CHECK(vocab.find(s) == id);
    for (int k = 0; k < 2000; ++k) {
      const std::string s = random_spelling();
      const auto it = reference.find(s);
      CHECK(vocab.find(s) == (it == reference.end() ? -1 : it->second));
    }
    std::size_t at = 0;
    vocab.for_each([&](std::string_view s, token_id id) {
      REQUIRE(at < order.size());
      CHECK(s == order[at]);
      CHECK(id == reference.at(order[at]));
      ++at;
    });
    CHECK(at == order.size());
  }
  const bpe_vocab empty;
  CHECK(empty.find("") == -1);
  CHECK(empty.find("a") == -1);
  CHECK(empty.size() == 0);
}
