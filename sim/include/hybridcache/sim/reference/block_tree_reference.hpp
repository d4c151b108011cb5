// hybridcache/sim/reference/block_tree_reference.hpp
//
// `block_tree_reference`: a model of the Marconi reference simulator's vLLM+ block tree
// (ruipeterpan/marconi, radix_cache_vllm.py, as observed at commit 08016617), for
// reproducing its vLLM+ hit rates request for request. It is NOT the vLLM+ policy we
// recommend: the default vLLM+ composition (prefix_cache + every_block_admission + LRU)
// accounts bytes exactly and never runs over capacity. This type reproduces three
// behaviours of the reference that make its rows differ from the correct policy:
//
//  1. Byte estimate before insert. Before inserting a sequence of L tokens the reference
//     walks the tree as a lookup does, counts the nodes it reached *including the root*
//     (k), and estimates the bytes the insert adds as if E = L - block·k tokens were new,
//     with E / block SSM states (a fractional count, in double precision; E may be
//     negative). It evicts only when used + estimate exceeds the capacity, and then
//     exactly that excess; the insert itself always happens, so the cache may overshoot.
//  2. Partial last blocks fill in place. Every node holds at most `block` tokens and one
//     SSM state. A node with fewer tokens (the tail of some sequence) has no children;
//     when a later insert fully matches it and goes on, the node's tokens are extended up
//     to a full block (it moves to the end of its parent's child order), and the rest
//     continues below it.
//  3. Partly shared blocks are duplicated. When no child of a node is matched entirely
//     (only a proper prefix of some child's block agrees), the insert creates a new child
//     holding the next `block` tokens, so the shared tokens' KV is stored twice.
//
// Rules, in our words:
//  - Clock: one logical tick per lookup, one per insert, one more for the insert's own
//    estimate walk, one per eviction round. A node's last access is the tick of the latest
//    walk that entered it.
//  - Lookup: from the root, enter the child whose whole full block agrees with the next
//    `block` tokens; stop when none does. If no full block agrees but some child's
//    (shorter, partial) block agrees entirely, the first such child in child order ends the
//    match and counts its tokens, but is not stamped. Skipped tokens = the tokens of the
//    entered and ending nodes.
//  - Insert: enter a child when its whole block agrees and no other child agrees on more
//    tokens; otherwise stop there and store the remaining tokens as in 2/3 above. Every
//    node entered or created is stamped.
//  - Eviction round: collect the leaves (the root too, if childless) in depth-first
//    preorder following child order, heapify them by last access (CPython heapq order:
//    only `<` on last access decides, ties fall where heapify/heappop/heappush leave
//    them), pop victims (each frees one SSM state plus its tokens' KV) until the freed bytes
//    reach the request; a parent whose last child goes is pushed; popping the root ends
//    the round.
//    Every tick stamps a single root path, so two leaves never share a last access: the
//    heapq order reduces to ascending last access (the tests check the distinct stamps); we
//    keep the reference's round structure anyway, as the model of record.
//  - Bytes: every non-root node holds one SSM state plus KV for its tokens.
//
// Costs: match and insert O(depth · children · block); an eviction round O(n) (the leaf
// collection and heapify, like the reference) plus O(log n) per victim. Nodes live in a
// slot vector with a free list; child lists are insertion-ordered vectors. This is a
// fidelity model for `hcbench replay --policy vllm+ --reference-quirks`, not a hot path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/python_heapq.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::sim {

/// Sizes and capacity of a `block_tree_reference`.
struct block_tree_reference_config {
  std::int64_t block_ids = 32;                  ///< ids per block (one SSM state per block)
  std::int64_t capacity_bytes = 0;              ///< byte budget the estimate is checked against
  std::int64_t kv_bytes_per_id = 0;             ///< KV bytes of one id over all attention layers
  std::int64_t recurrent_layers = 0;            ///< SSM layers (the estimate multiplies by them in this order)
  std::int64_t state_bytes_per_layer = 0;       ///< one SSM (+conv) state of one layer
};

/// The reference simulator's vLLM+ block tree (see the file comment for its rules).
/// Satisfies sim::replayable_cache (match / commit / counters / alpha / used_bytes).
class block_tree_reference {
 public:
  /// @throws invalid_argument when block_ids < 1 or any size or the capacity is negative.
  explicit block_tree_reference(const block_tree_reference_config& cfg) : cfg_(cfg) {
    HYBRIDCACHE_EXPECTS(cfg.block_ids >= 1, invalid_argument, "block_tree_reference: block_ids must be >= 1");
    HYBRIDCACHE_EXPECTS(cfg.capacity_bytes >= 0 && cfg.kv_bytes_per_id >= 0 && cfg.recurrent_layers >= 0 &&
                            cfg.state_bytes_per_layer >= 0,
                        invalid_argument, "block_tree_reference: sizes and capacity must be >= 0");
    state_bytes_ = checked_mul(cfg.recurrent_layers, cfg.state_bytes_per_layer, "block_tree_reference state bytes");
    nodes_.push_back(node{});  // the root: no tokens, no state
  }

  /// Sizes from `costs`: ids of `tokens_per_id` tokens, blocks of `block_tokens` tokens
  /// (at least one id). @throws invalid_argument as the constructor, or tokens_per_id < 1.
  [[nodiscard]] static block_tree_reference from_costs(const cost_model& costs, std::int64_t capacity_bytes,
                                                       std::int64_t block_tokens = 32, std::int64_t tokens_per_id = 1) {
    HYBRIDCACHE_EXPECTS(tokens_per_id >= 1, invalid_argument, "block_tree_reference: tokens_per_id must be >= 1");
    return block_tree_reference({.block_ids = std::max<std::int64_t>(1, block_tokens / tokens_per_id),
                                 .capacity_bytes = capacity_bytes,
                                 .kv_bytes_per_id = checked_mul(costs.kv_bytes_per_token(), tokens_per_id, "KV bytes per id"),
                                 .recurrent_layers = costs.recurrent_layers(),
                                 .state_bytes_per_layer = costs.ssm_checkpoint_bytes_per_layer()});
  }

  /// Lookup (one tick): the tokens a request with this input skips. `node` is the deepest
  /// node reached, `at` the tick. Nothing is pinned (the reference never pins).
  [[nodiscard]] match_result match(std::span<const token_id> input) {
    ++clock_;
    const walk w = lookup_walk(input);
    match_result m;
    m.input_tokens = static_cast<std::int64_t>(input.size());
    m.reusable_tokens = w.tokens;
    m.common_prefix = w.tokens;
    m.node = w.nodes > 0 ? w.last : no_node;
    m.at = clock_;
    ++counters_.matches;
    counters_.tokens_matched += m.input_tokens;
    counters_.tokens_skipped += m.reusable_tokens;
    if (m.hit()) {
      ++counters_.hits;
      ++counters_.checkpoints_reused;
    }
    return m;
  }

  /// The replay engine's commit: inserts `sequence` (input ++ output). The match is not
  /// needed (nothing was pinned). @throws invalid_argument when input_ids > sequence size.
  void commit(std::span<const token_id> sequence, std::int64_t input_ids, const match_result& /*m*/) {
    HYBRIDCACHE_EXPECTS(input_ids >= 0 && input_ids <= static_cast<std::int64_t>(sequence.size()), invalid_argument,
                        "block_tree_reference: input_ids exceeds the sequence length");
    insert(sequence);
  }

  /// Insert with the reference's estimate-then-evict step (rules 1-3 of the file comment).
  void insert(std::span<const token_id> sequence) {
    ++clock_;
    ++counters_.commits;
    ++clock_;  // the estimate walk is a lookup of its own
    const walk w = lookup_walk(sequence);
    const std::int64_t extra = static_cast<std::int64_t>(sequence.size()) - cfg_.block_ids * (w.nodes + 1);
    // Same operation order as the reference, in doubles: (E / block · layers) · state + KV(E).
    const double estimate = static_cast<double>(extra) / static_cast<double>(cfg_.block_ids) *
                                static_cast<double>(cfg_.recurrent_layers) * static_cast<double>(cfg_.state_bytes_per_layer) +
                            static_cast<double>(extra * cfg_.kv_bytes_per_id);
    const double after = static_cast<double>(used_bytes()) + estimate;
    if (after > static_cast<double>(cfg_.capacity_bytes)) evict(after - static_cast<double>(cfg_.capacity_bytes));
    store(sequence);
  }

  /// Bytes held: one state per non-root node plus the KV of every stored id.
  [[nodiscard]] std::int64_t used_bytes() const noexcept {
    return live_nodes_ * state_bytes_ + stored_ids_ * cfg_.kv_bytes_per_id;
  }
  /// Running totals (checkpoints = nodes, each holds one state).
  [[nodiscard]] prefix::cache_counters counters() const noexcept { return counters_; }
  /// Recency only: no FLOP weight.
  [[nodiscard]] double alpha() const noexcept { return 0.0; }
  /// Non-root nodes.
  [[nodiscard]] std::int64_t node_count() const noexcept { return live_nodes_; }
  /// Ids stored over all nodes (duplicates of partly shared blocks counted twice).
  [[nodiscard]] std::int64_t stored_ids() const noexcept { return stored_ids_; }
  /// The logical clock's current tick.
  [[nodiscard]] time_point now() const noexcept { return clock_; }
  /// The configuration.
  [[nodiscard]] const block_tree_reference_config& config() const noexcept { return cfg_; }

  /// The root's id (holds no tokens).
  [[nodiscard]] static constexpr node_id root() noexcept { return 0; }
  /// Children of `n` in child order (insertion order; a filled-in node moves last).
  [[nodiscard]] std::span<const node_id> children(node_id n) const { return nodes_.at(n).children; }
  /// Tokens held by `n` (at most block_ids).
  [[nodiscard]] std::span<const token_id> tokens(node_id n) const { return nodes_.at(n).key; }
  /// Tick of the latest walk that entered `n`.
  [[nodiscard]] time_point last_access(node_id n) const { return nodes_.at(n).last_access; }

 private:
  struct node {
    std::vector<token_id> key;
    std::vector<node_id> children;
    node_id parent = no_node;
    time_point last_access = 0;
  };

  struct walk {
    std::int64_t nodes = 0;   // non-root nodes reached (entered, plus an ending partial block)
    std::int64_t tokens = 0;  // their tokens
    node_id last = no_node;
  };

  static std::int64_t agree(std::span<const token_id> a, std::span<const token_id> b) noexcept {
    const std::size_t n = std::min(a.size(), b.size());
    std::size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return static_cast<std::int64_t>(i);
  }

  // The lookup rule; stamps the root and every full block entered.
  walk lookup_walk(std::span<const token_id> input) {
    walk w;
    node_id at = root();
    nodes_[at].last_access = clock_;
    std::size_t offset = 0;
    for (;;) {
      const auto rest = input.subspan(offset);
      const auto& kids = nodes_[at].children;
      if (kids.empty()) break;
      std::int64_t best = 0;
      for (node_id c : kids) best = std::max(best, agree(nodes_[c].key, rest));
      if (best == cfg_.block_ids) {
        node_id next = no_node;
        for (node_id c : kids)
          if (agree(nodes_[c].key, rest) == best) {
            next = c;
            break;
          }
        ++w.nodes;
        w.tokens += best;
        w.last = next;
        offset += static_cast<std::size_t>(best);
        at = next;
        nodes_[at].last_access = clock_;
        continue;
      }
      if (best > 0) {
        for (node_id c : kids) {
          const auto len = static_cast<std::int64_t>(nodes_[c].key.size());
          if (agree(nodes_[c].key, rest) == len) {  // a partial block agreeing entirely; not stamped
            ++w.nodes;
            w.tokens += len;
            w.last = c;
            break;
          }
        }
      }
      break;
    }
    return w;
  }

  node_id new_node(node_id parent, std::span<const token_id> key) {
    node_id id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<node_id>(nodes_.size());
      nodes_.push_back(node{});
    }
    node& n = nodes_[id];
    n.key.assign(key.begin(), key.end());
    n.children.clear();
    n.parent = parent;
    n.last_access = clock_;
    nodes_[parent].children.push_back(id);
    ++live_nodes_;
    stored_ids_ += static_cast<std::int64_t>(key.size());
    ++counters_.checkpoints_admitted;
    counters_.kv_bytes_admitted += static_cast<std::int64_t>(key.size()) * cfg_.kv_bytes_per_id;
    return id;
  }

  // The insert rule (no eviction here).
  void store(std::span<const token_id> seq) {
    const auto block = static_cast<std::size_t>(cfg_.block_ids);
    node_id at = root();
    std::size_t offset = 0;
    for (;;) {
      nodes_[at].last_access = clock_;
      const auto rest = seq.subspan(offset);
      const auto& kids = nodes_[at].children;
      if (!kids.empty()) {
        std::int64_t best = 0;
        for (node_id c : kids) best = std::max(best, agree(nodes_[c].key, rest));
        node_id into = no_node;
        for (node_id c : kids) {
          const auto len = static_cast<std::int64_t>(nodes_[c].key.size());
          if (len == best && agree(nodes_[c].key, rest) == len) {
            into = c;
            break;
          }
        }
        if (into != no_node) {
          offset += nodes_[into].key.size();
          at = into;
          continue;
        }
      }
      if (rest.empty()) return;
      if (at == root() || nodes_[at].key.size() == block) {
        const std::size_t take = std::min(block, rest.size());
        at = new_node(at, rest.first(take));
        offset += take;
        continue;
      }
      // A partial block (always childless): fill it up and move it last among its siblings.
      HYBRIDCACHE_ASSERT(nodes_[at].children.empty());
      const std::size_t take = std::min(block - nodes_[at].key.size(), rest.size());
      auto& key = nodes_[at].key;
      key.insert(key.end(), rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(take));
      stored_ids_ += static_cast<std::int64_t>(take);
      counters_.kv_bytes_admitted += static_cast<std::int64_t>(take) * cfg_.kv_bytes_per_id;
      auto& siblings = nodes_[nodes_[at].parent].children;
      siblings.erase(std::find(siblings.begin(), siblings.end(), at));
      siblings.push_back(at);
      offset += take;
    }
  }

  // CPython's `<` on the heap items: last-access times only.
  auto earlier() const noexcept {
    return [this](node_id a, node_id b) noexcept { return nodes_[a].last_access < nodes_[b].last_access; };
  }

  void collect_leaves() {
    heap_.clear();
    stack_.clear();
    stack_.push_back(root());
    while (!stack_.empty()) {
      const node_id n = stack_.back();
      stack_.pop_back();
      const auto& kids = nodes_[n].children;
      if (kids.empty()) heap_.push_back(n);
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack_.push_back(*it);
    }
  }

  // One eviction round freeing at least `bytes` (a double, as the reference compares).
  void evict(double bytes) {
    ++clock_;
    ++counters_.evictions;
    collect_leaves();
    python_heapq::heapify(heap_, earlier());
    std::int64_t freed = 0;
    while (static_cast<double>(freed) < bytes && !heap_.empty()) {
      const node_id victim = python_heapq::heappop(heap_, earlier());
      if (victim == root()) break;
      node& v = nodes_[victim];
      const auto ids = static_cast<std::int64_t>(v.key.size());
      const std::int64_t b = state_bytes_ + ids * cfg_.kv_bytes_per_id;
      freed += b;
      const node_id parent = v.parent;
      auto& siblings = nodes_[parent].children;
      siblings.erase(std::find(siblings.begin(), siblings.end(), victim));
      v.key.clear();
      v.parent = no_node;
      free_.push_back(victim);
      --live_nodes_;
      stored_ids_ -= ids;
      ++counters_.checkpoints_evicted;
      counters_.bytes_evicted += b;
      if (siblings.empty()) python_heapq::heappush(heap_, parent, earlier());
    }
  }

  block_tree_reference_config cfg_;
  std::int64_t state_bytes_ = 0;
  std::vector<node> nodes_;
  std::vector<node_id> free_;
  std::vector<node_id> heap_;
  std::vector<node_id> stack_;
  std::int64_t live_nodes_ = 0;
  std::int64_t stored_ids_ = 0;
  time_point clock_ = 0;
  prefix::cache_counters counters_{};
};

}  // namespace hybridcache::sim
