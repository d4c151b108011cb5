// sim::block_tree_reference: the Marconi reference simulator's vLLM+ block tree
// (radix_cache_vllm.py @ 08016617). Unit tests of its rules on tiny trees, and its rows on
// synth-v1 traces (marconi_7b, match(input) then insert(input ++ output) per request),
// checked against the reference run side by side (docs/replay.md).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/sim/reference/block_tree_reference.hpp"
#include "hybridcache/sim/synth_v1.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;

namespace {

using tokens = std::vector<token_id>;

// Blocks of 4 ids; a node costs 10 (state) + its ids (KV 1 B per id).
sim::block_tree_reference small_tree(std::int64_t capacity, std::int64_t block = 4) {
  return sim::block_tree_reference(
      {.block_ids = block, .capacity_bytes = capacity, .kv_bytes_per_id = 1, .recurrent_layers = 2, .state_bytes_per_layer = 5});
}

std::int64_t skipped(sim::block_tree_reference& t, const tokens& in) { return t.match(in).reusable_tokens; }

tokens node_tokens(const sim::block_tree_reference& t, node_id n) {
  const auto s = t.tokens(n);
  return {s.begin(), s.end()};
}

std::vector<std::int64_t> replay(sim::block_tree_reference& t, const std::vector<sim::synth_request>& trace) {
  std::vector<std::int64_t> out;
  out.reserve(trace.size());
  for (const auto& r : trace) {
    const match_result m = t.match(r.input);
    out.push_back(m.reusable_tokens);
    tokens seq = r.input;
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    t.commit(seq, static_cast<std::int64_t>(r.input.size()), m);
  }
  return out;
}

// FNV-1a over the row's values (little-endian int64 bytes).
std::uint64_t row_hash(const std::vector<std::int64_t>& row) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t v : row)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<std::uint64_t>(v) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  return h;
}

// A naive model of the same rules, written the obvious way: owning pointers, recursion,
// sizes recomputed by traversal, a fresh leaf list per eviction round. The CPython heapq
// order is spelled out once more (heapify = sift every inner position from the last).
class naive_block_tree {
 public:
  naive_block_tree(std::int64_t block, std::int64_t capacity, std::int64_t state_bytes)
      : block_(block), capacity_(capacity), state_(state_bytes) {}

  std::int64_t match(const tokens& in) {
    ++clock_;
    std::int64_t nodes = 0;
    return lookup(root_.get(), in, 0, nodes);
  }

  void insert(const tokens& seq) {
    clock_ += 2;
    std::int64_t nodes = 0;
    lookup(root_.get(), seq, 0, nodes);
    const auto extra = static_cast<std::int64_t>(seq.size()) - block_ * (nodes + 1);
    // layers = 2, state per layer = state_ / 2, KV 1 B per id (small_tree's sizes).
    const double estimate = static_cast<double>(extra) / static_cast<double>(block_) * 2.0 *
                                static_cast<double>(state_ / 2) + static_cast<double>(extra);
    const double after = static_cast<double>(bytes(root_.get())) + estimate;
    if (after > static_cast<double>(capacity_)) evict(after - static_cast<double>(capacity_));
    store(root_.get(), seq, 0);
  }

  std::int64_t used() const { return bytes(root_.get()); }

  // Keys, last access and child order of every node, depth first.
  std::string dump() const { return dump(root_.get()); }

 private:
  struct node {
    tokens key;
    node* parent = nullptr;
    std::vector<std::unique_ptr<node>> kids;
    std::uint64_t ts = 0;
  };

  static std::int64_t agree(const tokens& key, const tokens& s, std::size_t from) {
    std::int64_t i = 0;
    while (static_cast<std::size_t>(i) < key.size() && from + static_cast<std::size_t>(i) < s.size() &&
           key[static_cast<std::size_t>(i)] == s[from + static_cast<std::size_t>(i)])
      ++i;
    return i;
  }

  std::int64_t lookup(node* n, const tokens& s, std::size_t from, std::int64_t& nodes) {
    n->ts = clock_;
    std::int64_t best = 0;
    for (auto& k : n->kids) best = std::max(best, agree(k->key, s, from));
    if (best == block_) {
      for (auto& k : n->kids)
        if (agree(k->key, s, from) == best) {
          ++nodes;
          return best + lookup(k.get(), s, from + static_cast<std::size_t>(best), nodes);
        }
    }
    if (best > 0)
      for (auto& k : n->kids)
        if (agree(k->key, s, from) == static_cast<std::int64_t>(k->key.size())) {
          ++nodes;
          return static_cast<std::int64_t>(k->key.size());
        }
    return 0;
  }

  void store(node* n, const tokens& s, std::size_t from) {
    n->ts = clock_;
    std::int64_t best = 0;
    for (auto& k : n->kids) best = std::max(best, agree(k->key, s, from));
    for (auto& k : n->kids)
      if (agree(k->key, s, from) == static_cast<std::int64_t>(k->key.size()) &&
          static_cast<std::int64_t>(k->key.size()) == best)
        return store(k.get(), s, from + k->key.size());
    if (from >= s.size()) return;
    const auto rest = s.size() - from;
    if (n == root_.get() || static_cast<std::int64_t>(n->key.size()) == block_) {
      auto k = std::make_unique<node>();
      k->key.assign(s.begin() + static_cast<std::ptrdiff_t>(from),
                    s.begin() + static_cast<std::ptrdiff_t>(from + std::min<std::size_t>(rest, static_cast<std::size_t>(block_))));
      k->parent = n;
      k->ts = clock_;
      node* raw = k.get();
      n->kids.push_back(std::move(k));
      return store(raw, s, from + raw->key.size());
    }
    const auto take = std::min<std::size_t>(rest, static_cast<std::size_t>(block_) - n->key.size());
    n->key.insert(n->key.end(), s.begin() + static_cast<std::ptrdiff_t>(from),
                  s.begin() + static_cast<std::ptrdiff_t>(from + take));
    auto& sib = n->parent->kids;
    auto it = std::find_if(sib.begin(), sib.end(), [n](const auto& p) { return p.get() == n; });
    auto self = std::move(*it);
    sib.erase(it);
    sib.push_back(std::move(self));
    store(n, s, from + take);
  }

  std::int64_t bytes(const node* n) const {
    std::int64_t b = n == root_.get() ? 0 : state_ + static_cast<std::int64_t>(n->key.size());
    for (const auto& k : n->kids) b += bytes(k.get());
    return b;
  }

  void leaves(node* n, std::vector<node*>& out) {
    if (n->kids.empty()) out.push_back(n);
    for (auto& k : n->kids) leaves(k.get(), out);
  }

  // CPython heapq on `h`, ordered by ts only.
  static void sift_toward_root(std::vector<node*>& h, std::size_t start, std::size_t pos) {
    node* item = h[pos];
    while (pos > start) {
      const std::size_t up = (pos - 1) / 2;
      if (item->ts < h[up]->ts) {
        h[pos] = h[up];
        pos = up;
      } else {
        break;
      }
    }
    h[pos] = item;
  }
  static void sift_to_leaf(std::vector<node*>& h, std::size_t pos) {
    const std::size_t start = pos;
    node* item = h[pos];
    for (std::size_t c = 2 * pos + 1; c < h.size(); c = 2 * pos + 1) {
      if (c + 1 < h.size() && !(h[c]->ts < h[c + 1]->ts)) ++c;
      h[pos] = h[c];
      pos = c;
    }
    h[pos] = item;
    sift_toward_root(h, start, pos);
  }

  void evict(double need) {
    ++clock_;
    std::vector<node*> h;
    leaves(root_.get(), h);
    for (std::size_t i = h.size() / 2; i > 0; --i) sift_to_leaf(h, i - 1);
    std::int64_t freed = 0;
    while (static_cast<double>(freed) < need && !h.empty()) {
      node* v = h.front();
      h.front() = h.back();
      h.pop_back();
      if (!h.empty()) sift_to_leaf(h, 0);
      if (v == root_.get()) break;
      freed += state_ + static_cast<std::int64_t>(v->key.size());
      node* parent = v->parent;
      auto& sib = parent->kids;
      sib.erase(std::find_if(sib.begin(), sib.end(), [v](const auto& p) { return p.get() == v; }));
      if (sib.empty()) {
        h.push_back(parent);
        sift_toward_root(h, 0, h.size() - 1);
      }
    }
  }

  std::string dump(const node* n) const {
    std::string out = "(" + std::to_string(n->ts) + ":";
    for (token_id t : n->key) out += std::to_string(t) + ",";
    for (const auto& k : n->kids) out += dump(k.get());
    return out + ")";
  }

  std::int64_t block_, capacity_, state_;
  std::uint64_t clock_ = 0;
  std::unique_ptr<node> root_ = std::make_unique<node>();
};

void leaf_stamps(const sim::block_tree_reference& t, node_id n, std::vector<time_point>& out) {
  if (t.children(n).empty()) out.push_back(t.last_access(n));
  for (node_id k : t.children(n)) leaf_stamps(t, k, out);
}

std::string dump(const sim::block_tree_reference& t, node_id n) {
  std::string out = "(" + std::to_string(t.last_access(n)) + ":";
  for (token_id x : t.tokens(n)) out += std::to_string(x) + ",";
  for (node_id k : t.children(n)) out += dump(t, k);
  return out + ")";
}

}  // namespace

TEST_CASE("block tree: a partial last block is filled in place and moves last among its siblings") {
  auto t = small_tree(1'000'000);
  t.insert(tokens{1, 2, 3});  // root -> [1 2 3] (partial)
  t.insert(tokens{1, 2});     // [1 2 3] agrees on 2 only: a new partial child [1 2]
  REQUIRE(t.children(t.root()).size() == 2);
  CHECK(node_tokens(t, t.children(t.root())[0]) == tokens{1, 2, 3});
  CHECK(node_tokens(t, t.children(t.root())[1]) == tokens{1, 2});
  CHECK(t.stored_ids() == 5);
  // Lookup: no full block agrees; the first child (in child order) agreeing entirely ends it.
  CHECK(skipped(t, {1, 2, 3, 9}) == 3);
  CHECK(skipped(t, {1, 2, 7, 9}) == 2);
  // [1 2] agrees entirely and nothing agrees longer: it is filled up to [1 2 5 6], moves
  // last, and the rest goes below it.
  t.insert(tokens{1, 2, 5, 6, 7});
  REQUIRE(t.children(t.root()).size() == 2);
  CHECK(node_tokens(t, t.children(t.root())[0]) == tokens{1, 2, 3});
  const node_id filled = t.children(t.root())[1];
  CHECK(node_tokens(t, filled) == tokens{1, 2, 5, 6});
  REQUIRE(t.children(filled).size() == 1);
  CHECK(node_tokens(t, t.children(filled)[0]) == tokens{7});
  CHECK(t.node_count() == 3);
  CHECK(t.stored_ids() == 8);
  CHECK(t.used_bytes() == 3 * 10 + 8);
  CHECK(skipped(t, {1, 2, 5, 6, 7, 8}) == 5);
  CHECK(skipped(t, {1, 2, 5, 6, 8}) == 4);
}

TEST_CASE("block tree: a partly shared block is stored twice; the lookup needs whole blocks") {
  auto t = small_tree(1'000'000);
  t.insert(tokens{1, 2, 3, 4, 5, 6, 7, 8});
  t.insert(tokens{1, 2, 9, 9, 5});
  REQUIRE(t.children(t.root()).size() == 2);  // [1 2 3 4] and a duplicate-prefix [1 2 9 9]
  CHECK(t.stored_ids() == 13);
  CHECK(t.node_count() == 4);
  CHECK(skipped(t, {1, 2, 3, 4, 5, 6, 7, 8, 1}) == 8);
  CHECK(skipped(t, {1, 2, 3, 4, 5, 6, 7}) == 4);  // [5 6 7 8] is a full block: 3 ids agreeing are not enough
  CHECK(skipped(t, {1, 2, 9, 9, 5, 0}) == 5);
  CHECK(skipped(t, {1, 2}) == 0);
  // Re-inserting a cached sequence adds nothing.
  t.insert(tokens{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(t.stored_ids() == 13);
}

TEST_CASE("block tree: the estimate counts the root as a block, so the cache overshoots, then LRU evicts") {
  // Blocks of 2 ids; each node 12 B; capacity 36 B = three nodes.
  auto t = small_tree(36, 2);
  t.insert(tokens{1, 2});  // ticks 1-2 (insert, estimate walk): A stamped 2
  t.insert(tokens{3, 4});  // B: 4
  t.insert(tokens{5, 6});  // C: 6
  CHECK(t.used_bytes() == 36);
  CHECK(skipped(t, {1, 2, 0}) == 2);  // tick 7: A (a full block entered) stamped 7
  CHECK(t.last_access(t.children(t.root())[0]) == 7);
  // Estimate for [7 8]: 2 - 2·(0 + root) = 0 new ids -> no eviction; inserted anyway.
  t.insert(tokens{7, 8});
  CHECK(t.used_bytes() == 48);
  CHECK(t.counters().evictions == 0);
  // Next insert: 48 + 0 > 36 -> evict 12 B: the least recently used leaf, B.
  t.insert(tokens{9, 10});
  CHECK(t.counters().evictions == 1);
  CHECK(t.counters().checkpoints_evicted == 1);
  CHECK(t.used_bytes() == 48);
  CHECK(skipped(t, {3, 4}) == 0);
  CHECK(skipped(t, {1, 2}) == 2);
  CHECK(skipped(t, {5, 6}) == 2);
  CHECK(skipped(t, {7, 8}) == 2);
  CHECK(skipped(t, {9, 10}) == 2);
}

TEST_CASE("block tree: a parent whose last child goes is a candidate in the same round") {
  // Blocks of 2 ids, 12 B per node, capacity 12 B (one node).
  auto u = small_tree(12, 2);
  // Estimate 6 - 2 = 4 ids, 2 states: 24 B > 12 -> an eviction round on the empty tree pops
  // the root and ends; the chain of three nodes is inserted anyway (36 B).
  u.insert(tokens{1, 2, 3, 4, 5, 6});
  CHECK(u.used_bytes() == 36);
  CHECK(u.node_count() == 3);
  // [7 8]: estimate 0; used 36 > 12 -> evict 24 B: leaf [5 6], then its parent [3 4] (pushed when it became a leaf).
  u.insert(tokens{7, 8});
  CHECK(u.counters().checkpoints_evicted == 2);
  CHECK(skipped(u, {1, 2, 3, 4}) == 2);
  CHECK(skipped(u, {7, 8}) == 2);
  CHECK(u.node_count() == 2);
}

TEST_CASE("block tree: bad input throws and leaves the tree unchanged") {
  CHECK_THROWS_AS(small_tree(100, 0), invalid_argument);
  CHECK_THROWS_AS(sim::block_tree_reference({.block_ids = 4, .capacity_bytes = -1}), invalid_argument);
  auto t = small_tree(1'000);
  t.insert(tokens{1, 2, 3});
  const auto before = t.used_bytes();
  const auto ticks = t.now();
  const tokens seq{1, 2, 3, 4};
  CHECK_THROWS_AS(t.commit(seq, 5, match_result{}), invalid_argument);
  CHECK(t.used_bytes() == before);
  CHECK(t.now() == ticks);
  CHECK(t.stored_ids() == 3);
}

TEST_CASE("block tree: 2000 random sequences of lookups and inserts agree with the naive model") {
  std::mt19937_64 rng(20261122);
  std::int64_t evicted = 0, rounds_with_eviction = 0, hits = 0;
  for (int round = 0; round < 2000; ++round) {
    const std::int64_t block = 1 + static_cast<std::int64_t>(rng() % 5);
    const std::int64_t capacity = static_cast<std::int64_t>(rng() % 400);
    CAPTURE(round);
    CAPTURE(block);
    CAPTURE(capacity);
    auto t = small_tree(capacity, block);
    naive_block_tree naive(block, capacity, 10);
    // A few base sequences over a 3-token alphabet, so prefixes are shared, partly shared
    // and extended all the time.
    std::vector<tokens> bases(3);
    for (auto& b : bases)
      for (int i = 0; i < 24; ++i) b.push_back(static_cast<token_id>(1 + rng() % 3));
    const int ops = 4 + static_cast<int>(rng() % 40);
    for (int op = 0; op < ops; ++op) {
      tokens s;
      const auto& base = bases[rng() % bases.size()];
      s.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng() % (base.size() + 1)));
      for (std::uint64_t tail = rng() % 6; tail > 0; --tail) s.push_back(static_cast<token_id>(1 + rng() % 3));
      if (rng() % 2 == 0) {
        REQUIRE(t.match(s).reusable_tokens == naive.match(s));
      } else {
        t.insert(s);
        naive.insert(s);
        REQUIRE(t.used_bytes() == naive.used());
        REQUIRE(dump(t, t.root()) == naive.dump());  // structure, child order, last accesses
        // Every tick stamps one root path, so no two leaves share a last access: eviction
        // never meets a tie, and the heapq order is fixed by the stamps alone.
        std::vector<time_point> stamps;
        leaf_stamps(t, t.root(), stamps);
        std::sort(stamps.begin(), stamps.end());
        REQUIRE(std::adjacent_find(stamps.begin(), stamps.end()) == stamps.end());
      }
    }
    CHECK(dump(t, t.root()) == naive.dump());
    evicted += t.counters().checkpoints_evicted;
    rounds_with_eviction += t.counters().evictions > 0 ? 1 : 0;
    hits += t.counters().hits;
  }
  // The sequences exercise eviction and hits, not just inserts into an empty tree.
  CHECK(rounds_with_eviction > 1000);
  CHECK(evicted > 10'000);
  CHECK(hits > 10'000);
}

TEST_CASE("block tree on the fixture (chat, seed 7, 12 sessions, 5e8 B) reproduces the reference vLLM+ row") {
  const auto trace = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  const cost_model m(presets::marconi_7b());
  auto t = sim::block_tree_reference::from_costs(m, 500'000'000);
  const std::vector<std::int64_t> reference_row = {
      0, 0, 672, 0, 0, 736, 0, 0, 0, 736, 0, 0, 0, 0, 0, 0, 0, 0, 0, 672, 0, 736, 0, 0, 0, 0, 0, 0,
      0, 0, 0, 0, 672, 0, 0, 2788, 736, 0, 3317, 0, 0, 736, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0, 0, 0, 0, 672,
      672, 672, 0, 0, 0, 0, 0, 0, 0, 672, 0, 0, 0, 8161};
  const auto row = replay(t, trace);
  CHECK(row == reference_row);
  CHECK(std::accumulate(row.begin(), row.end(), std::int64_t{0}) == 27563);  // 12.1233 % of 227,356
}

TEST_CASE("block tree on chat seed 1 (100 sessions, 692 requests, 5e9 B) reproduces the reference row") {
  // Verified against radix_cache_vllm.py run side by side (docs/replay.md): every request equal.
  const auto trace = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000});
  REQUIRE(trace.size() == 692);
  const cost_model m(presets::marconi_7b());
  auto t = sim::block_tree_reference::from_costs(m, 5'000'000'000);
  const auto row = replay(t, trace);
  CHECK(std::accumulate(row.begin(), row.end(), std::int64_t{0}) == 172331);  // 6.9811 % of 2,468,524
  CHECK(row_hash(row) == 4714765332734285891ull);  // the reference's per-request row, hashed
}
