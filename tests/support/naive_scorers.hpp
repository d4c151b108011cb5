// tests/support/naive_scorers.hpp
//
// Obviously-right O(n) models of the library's scorers, for differential tests: each keeps
// the same bookkeeping as the real scorer in plain maps and finds every victim by scanning
// the whole tree. They read last-access times through `tree.last_access(n)` and stamp with
// `tree.touch`, so they also run as parts of a `switching_scorer` (each with its own times).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <span>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"

namespace hybridcache::test {

using hybridcache::evict_action;
using hybridcache::no_node;
using hybridcache::node_id;
using hybridcache::time_point;

/// SGLang+'s leaf LRU: a lookup stamps the whole matched path and the partly matched child,
/// a commit its path; the victim is the unpinned leaf with the oldest time (ties: lowest id).
class naive_lru {
 public:
  template <class Tree>
  void on_match(Tree& t, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    for (node_id n : path) t.touch(n, now);
    if (partial != no_node) t.touch(partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& t, std::span<const node_id> path, time_point now) noexcept {
    for (node_id n : path) t.touch(n, now);
  }
  template <class Tree>
  void on_update(const Tree&, node_id) noexcept {}
  template <class Tree>
  void on_erase(const Tree&, node_id) noexcept {}
  template <class Tree>
  node_id select_victim(const Tree& t, time_point) noexcept {
    node_id best = no_node;
    for (node_id n = 1; n < t.id_bound(); ++n) {
      if (!t.live(n) || t.at(n).children != 0 || t.at(n).pins != 0) continue;
      if (best == no_node || t.last_access(n) < t.last_access(best)) best = n;
    }
    return best;
  }
  template <class Tree>
  evict_action action(const Tree&, node_id) const noexcept {
    return evict_action::remove_leaf;
  }
  double alpha() const noexcept { return 0.0; }
};

/// The naive GDSF: a map of per-node frequency and L, a full scan per victim.
class naive_gdsf {
 public:
  static constexpr bool evicts_inner_nodes = true;
  explicit naive_gdsf(cost_model m, prefix::gdsf_config cfg = {}) : model_(std::move(m)), cfg_(cfg) {}
  [[nodiscard]] double alpha() const noexcept { return 0.0; }
  [[nodiscard]] bool protects_branches() const noexcept { return cfg_.candidates == prefix::flop_candidates::protect_branches; }
  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id, time_point now) noexcept {
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (!tree.at(*it).has_checkpoint) continue;
      tree.touch(*it, now);
      auto& s = seen_[*it];
      s.freq = s.freq == 0 ? 1 : s.freq + 1;
      s.base = l_;
      return;
    }
  }
  template <class Tree>
  void on_insert_path(Tree&, std::span<const node_id>, time_point) noexcept {}
  template <class Tree>
  void on_update(const Tree&, node_id n) noexcept {
    auto& s = seen_[n];
    if (s.freq == 0) {
      s.freq = 1;
      s.base = l_;
    }
  }
  template <class Tree>
  void on_erase(const Tree&, node_id n) noexcept {
    seen_.erase(n);
  }
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point) noexcept {
    node_id best = no_node;
    double best_h = 0;
    tree.preorder([&](node_id n) {
      if (!prefix::detail::flop_candidate(tree, n, protects_branches())) return;
      const auto& s = seen_.at(n);
      const double h = s.base + static_cast<double>(s.freq) * prefix::detail::node_efficiency(model_, tree, n);
      if (best == no_node || h < best_h || (h == best_h && n < best)) {
        best = n;
        best_h = h;
      }
    });
    if (best != no_node) l_ = std::max(l_, best_h);
    return best;
  }
  /// Another rule evicted: L becomes the lowest priority among the candidates (gdsf_scorer's
  /// observe_victim).
  template <class Tree>
  void observe_victim(const Tree& tree, node_id) noexcept {
    bool any = false;
    double lo = 0;
    tree.preorder([&](node_id n) {
      if (!prefix::detail::flop_candidate(tree, n, protects_branches())) return;
      const auto& s = seen_.at(n);
      const double h = s.base + static_cast<double>(s.freq) * prefix::detail::node_efficiency(model_, tree, n);
      lo = any ? std::min(lo, h) : h;
      any = true;
    });
    if (any) l_ = std::max(l_, lo);
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    return prefix::detail::flop_action(tree, n, cfg_.intermediate);
  }
  /// H(n) of candidate `n`, computed afresh (NaN when it is not a candidate): what
  /// gdsf_scorer::priority must hold, bit for bit.
  template <class Tree>
  [[nodiscard]] double priority(const Tree& tree, node_id n) const {
    if (!prefix::detail::flop_candidate(tree, n, protects_branches())) return std::numeric_limits<double>::quiet_NaN();
    const auto& s = seen_.at(n);
    return s.base + static_cast<double>(s.freq) * prefix::detail::node_efficiency(model_, tree, n);
  }

 private:
  struct state {
    std::uint64_t freq = 0;
    double base = 0;
  };
  cost_model model_;
  prefix::gdsf_config cfg_;
  std::map<node_id, state> seen_;
  double l_ = 0;
};

}  // namespace hybridcache::test
