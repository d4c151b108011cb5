// Test support for the tiered store with real bytes (test_prefix_tiered_bytes.cpp,
// test_tiered_concurrency.cpp): a tiny hybrid model, the bytes a runtime computes for a
// token prefix (`pattern`), a view of an entry's bytes through its pages, and the check
// that every node of a tree holds its own tokens' bytes.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"

#include "../support/tiny_hybrid_model.hpp"

namespace hybridcache::test::tiered_bytes {

using hybridcache::token_id;

inline const cost_model& tiny() {
  static const cost_model m(test::tiny_hybrid_spec());
  return m;
}

using engine_t = tiered::host_copy_engine;
using store_t = stores::tiered_state_store<tiered::lru_demotion, engine_t>;

/// The bytes a runtime computes: KV of token t and the state after token t are functions of
/// tokens [0, t] (here: of a hash of them), so equal prefixes give equal bytes.
struct pattern {
  std::vector<std::uint64_t> h;  // h[t] = hash of tokens [0, t)
  explicit pattern(std::span<const token_id> s) : h(s.size() + 1) {
    h[0] = 0x1234;
    for (std::size_t i = 0; i < s.size(); ++i) h[i + 1] = splitmix64_mix(h[i] ^ (static_cast<std::uint64_t>(s[i]) + 7));
  }
  std::byte kv(std::int64_t t, std::int64_t j) const {  // byte j of token t's KV
    return static_cast<std::byte>(splitmix64_mix(h[static_cast<std::size_t>(t + 1)] + static_cast<std::uint64_t>(j)) & 0xff);
  }
  std::byte state(std::int64_t p, std::int64_t j) const {  // byte j of the state after p tokens
    return static_cast<std::byte>(splitmix64_mix(~h[static_cast<std::size_t>(p)] + static_cast<std::uint64_t>(j)) & 0xff);
  }
};

/// The runtime's view of the bytes: logical byte i of an entry, through its page list.
struct bytes_view {
  engine_t& engine;
  const store_t& store;
  struct entry_bytes {  // one entry's pages, looked up once
    std::byte* base;
    std::vector<std::uint32_t> pages;
    std::int64_t page;
    std::byte& operator[](std::int64_t i) const {
      return base[static_cast<std::int64_t>(pages.at(static_cast<std::size_t>(i / page))) * page + i % page];
    }
  };
  entry_bytes operator()(entry_id id) const {
    const auto e = store.table().find(id);
    REQUIRE(e.has_value());
    REQUIRE(e->home() != nullptr);
    return {engine.base(e->tier()), pages_of(e->home()->pages), store.table().page_bytes()};
  }
  static std::vector<std::uint32_t> pages_of(const page_list& l) {
    std::vector<std::uint32_t> v;
    l.for_each_page([&](std::uint32_t p) { v.push_back(p); });
    return v;
  }
  std::byte& at(entry_id id, std::int64_t i) const { return (*this)(id)[i]; }
};

/// Tokens from the root to the end of node `n`.
template <class Tree>
std::vector<token_id> tokens_of(const Tree& tree, node_id n) {
  std::vector<node_id> chain;
  for (; n != Tree::root(); n = tree.at(n).parent) chain.push_back(n);
  std::vector<token_id> out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    out.insert(out.end(), tree.at(*it).tokens.begin(), tree.at(*it).tokens.end());
  return out;
}

/// Every live node's KV and checkpoint hold the bytes of its token prefix.
template <class Tree>
void check_tree_bytes(const Tree& tree, const bytes_view& b, std::int64_t kv, std::int64_t ck) {
  for (node_id n = 1; n < tree.id_bound(); ++n) {
    if (!tree.live(n)) continue;
    const auto& nd = tree.at(n);
    const auto toks = tokens_of(tree, n);
    const pattern p(toks);
    const auto kvb = b(nd.kv.id);
    for (std::int64_t t = nd.begin(); t < nd.end; ++t)
      for (std::int64_t j = 0; j < kv; ++j)
        if (kvb[(t - nd.begin()) * kv + j] != p.kv(t, j))
          FAIL("node " << n << " token " << t << " byte " << j << " holds another token's KV");
    if (!nd.has_checkpoint) continue;
    const auto ckb = b(nd.checkpoint.id);
    for (std::int64_t j = 0; j < ck; ++j)
      if (ckb[j] != p.state(nd.end, j)) FAIL("checkpoint of node " << n << " byte " << j << " is wrong");
  }
}

struct run_stats {
  std::int64_t loads = 0, loaded_tokens = 0, adopted = 0, demoted = 0, failures = 0, refused = 0;
  std::int64_t disk_puts = 0, disk_gets = 0;  ///< with a disk tier: values put and read by the engine
};

}  // namespace hybridcache::test::tiered_bytes
