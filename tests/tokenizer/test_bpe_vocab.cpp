// The BPE vocabulary table (sim/tokenizer/bpe_vocab.hpp) against std::unordered_map on random
// spellings: lengths 0-40 (every tail of the 8-byte hash), bytes including NUL and non-ASCII,
// repeated spellings re-assigned (the last id wins, first place kept), growth through many
// doublings, absent spellings, first-insertion order, and find_from with right, wrong and
// outside hints.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_vocab.hpp>

using namespace hybridcache::sim;
using hybridcache::token_id;  // the tokenizer returns the library's one token_id

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
    // find_from: the same ids whatever entry it tries first, and `next` then names the
    // entry after the one found, so spellings looked up in first-insertion order hit.
    std::size_t next = 0, adjacent = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t before = next;
      CHECK(vocab.find_from(order[k], next) == reference.at(order[k]));
      CHECK(next == k + 1);
      adjacent += before == k ? 1 : 0;
      if (rng() % 5 == 0) next = rng() % (order.size() + 3);  // a wrong or outside hint
    }
    CHECK(adjacent > order.size() / 2);
    for (int k = 0; k < 500; ++k) {
      const std::string s = random_spelling();
      const auto it = reference.find(s);
      std::size_t hint = rng() % (order.size() + 3);
      CHECK(vocab.find_from(s, hint) == (it == reference.end() ? -1 : it->second));
    }
  }
  const bpe_vocab empty;
  std::size_t hint = 0;
  CHECK(empty.find_from("a", hint) == -1);
  CHECK(empty.find("") == -1);
  CHECK(empty.find("a") == -1);
  CHECK(empty.size() == 0);
}
