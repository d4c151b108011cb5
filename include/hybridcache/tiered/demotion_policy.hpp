// hybridcache/tiered/demotion_policy.hpp
//
// Which HBM entry leaves first. A `demotion_scorer` maps a cache-table row to a key; the
// store demotes (or, in the last tier, drops) the evictable entry with the smallest key.
// Keys are computed when a row changes (insert, touch, score update), so picking a victim
// is O(log n) through an ordered index, never a scan.
//
// Models:
//   lru_demotion         least recently touched first (the reference behaviour of every
//                        peer system: TensorRT-LLM, HiCache, vLLM's offload LRU)
//   car_score_demotion   CaR's score (papers/003 §III-B3): +1 when a request using the
//                        node enters the shuffled window, +1 on dispatch, -2 on completion;
//                        smallest score first, LRU among equal scores
//   flop_aware_demotion  keep in HBM what saves the most prefill compute per byte:
//                        `cost_model::node_flop_efficiency(p, L, has_checkpoint)` (Marconi's
//                        FLOP-aware utility applied across tiers), LRU among ties
//
// The CaR score deltas are constants here (`car_score`) so the scheduler and the replay
// apply exactly the paper's arithmetic.
#pragma once

#include <concepts>
#include <cstdint>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/concepts/demotion.hpp"

namespace hybridcache::tiered {

/// CaR's score deltas (papers/003 §III-B3).
struct car_score {
  static constexpr double enter_window = +1.0;  ///< a request using the node enters the window
  static constexpr double dispatch = +1.0;      ///< the request is sent to the GPU
  static constexpr double complete = -2.0;      ///< the request finished generating
};

/// Least recently used first.
struct lru_demotion {
  [[nodiscard]] demotion_key key(const cache_entry& e) const noexcept {
    return {static_cast<double>(e.last_access), 0.0};
  }
};
static_assert(demotion_scorer<lru_demotion>);

/// Smallest CaR score first; least recently used among equal scores.
struct car_score_demotion {
  [[nodiscard]] demotion_key key(const cache_entry& e) const noexcept {
    return {e.score, static_cast<double>(e.last_access)};
  }
};
static_assert(demotion_scorer<car_score_demotion>);

/// Least saved FLOPs per stored byte first (node span from `cache_entry::info`); least
/// recently used among equal efficiencies. A node whose span is empty scores 0.
class flop_aware_demotion {
 public:
  explicit flop_aware_demotion(const cost_model& model) : model_(&model) {}

  [[nodiscard]] demotion_key key(const cache_entry& e) const {
    const auto& i = e.info;
    const double eff = i.prefix_end > i.prefix_begin && i.prefix_begin >= 0
                           ? model_->node_flop_efficiency(i.prefix_begin, i.prefix_end, i.has_checkpoint)
                           : 0.0;
    return {eff, static_cast<double>(e.last_access)};
  }

 private:
  const cost_model* model_;  // not owned; must outlive the scorer
};
static_assert(demotion_scorer<flop_aware_demotion>);

}  // namespace hybridcache::tiered
