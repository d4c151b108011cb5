// hybridcache/compose/detail/tiered_shadow.hpp
//
// The tier-aware shadow of the adaptive selector (compose/adaptive_scorer.hpp): one
// candidate rule's `prefix_cache` over a metadata-only replica of the live tiered store
// (`tiered_state_store::metadata_replica`: the same HBM budget and staging room, the same
// tiers below HBM, the same demotion order and sizer), driven through the request
// lifecycle as the live cache is. Its HBM evicts by the candidate's rule and what leaves
// HBM demotes to the tiers below, from where a later request of the shadow loads it back:
// the shadow credits a rule for what the whole tier stack saves, which is what the live
// tiered cache credits (the replay's FLOPs saved count the tokens up to where prefill
// resumes, host hits included).
//
// Why type-erased: the replica's type depends on the live store's (its host scorer and
// sizer), which the selector learns only in `attach_store`; one virtual call per request
// per shadow is noise beside the replay it makes.
//
// Costs: `replay` is one begin + finish of the lifecycle on the shadow (match, lookup
// below HBM, load, reservation, insert, settle: O(|sequence|) hashing + the tree's and the
// store's costs, see prefix/lifecycle.hpp and stores/tiered_state_store.hpp), then the
// watermark cleaner. Allocates as the shadow's tree and tables grow.
// Internal to adaptive_scorer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::compose::detail {

/// What the selector asks of a tier-aware shadow.
class tiered_shadow_base {
 public:
  tiered_shadow_base() = default;
  tiered_shadow_base(const tiered_shadow_base&) = delete;
  tiered_shadow_base& operator=(const tiered_shadow_base&) = delete;
  virtual ~tiered_shadow_base() = default;

  /// One request (`sequence` = input ++ output, `input_tokens` long input) through the
  /// shadow: returns the ids its prefill would skip (HBM hit + the hit loaded from below;
  /// 0 when the shadow refuses the request, which it then does not cache).
  virtual std::int64_t replay(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt) = 0;
  [[nodiscard]] virtual std::int64_t nodes() const = 0;
  [[nodiscard]] virtual std::int64_t tokens() const = 0;
  /// The shadow's memory: its object, its cache's memory_bytes and, estimated, ~64 B of
  /// table per findable entry of the lower tiers (the replica store's own tables).
  [[nodiscard]] virtual std::int64_t bytes() const = 0;
};

template <class Model, class Admission, class Scorer, class Store>
class tiered_shadow final : public tiered_shadow_base {
  using cache_type = prefix::prefix_cache<Model, Admission, Scorer, Store, prefix::no_lock>;

 public:
  tiered_shadow(const Model& model, Store&& store, Scorer&& scorer, const Admission& admission,
                const prefix::prefix_cache_config& cfg)
      : cache_(model, std::move(store), std::move(scorer), admission, cfg), requests_(cache_) {}

  std::int64_t replay(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt) override {
    const auto n = static_cast<std::int64_t>(sequence.size());
    const std::int64_t in = std::clamp<std::int64_t>(input_tokens, 1, n);
    const auto t = requests_.begin(sequence.first(static_cast<std::size_t>(in)), {.output_tokens = n - in, .salt = salt});
    if (!t) return 0;  // no room beside nothing: the live replay computes it, uncached
    const auto& st = **requests_.state(*t);
    const std::int64_t resumed = st.plan.prefill_start;
    // The checkpoints the live replay captures: the planned sites past the HBM hit, and
    // the state after the last token unless nothing was computed.
    captured_.clear();
    const std::int64_t from = st.match.reusable_tokens;
    for (const auto& site : st.plan.sites)
      if (site.position > from && site.position < n) captured_.push_back(site.position);
    if (n > from) captured_.push_back(n);
    if (!requests_.wait_loaded(*t)) {  // metadata-only copies do not fail; be safe anyway
      (void)requests_.abort(*t);
      return 0;
    }
    (void)requests_.finish(*t, sequence, captured_);  // a failure aborts it: not cached
    (void)cache_.store().offload();  // the cleaner, as the live replay runs it after a finish
    return resumed;
  }
  [[nodiscard]] std::int64_t nodes() const override { return static_cast<std::int64_t>(cache_.tree().size()); }
  [[nodiscard]] std::int64_t tokens() const override { return cache_.tokens_cached(); }
  [[nodiscard]] std::int64_t bytes() const override {
    return static_cast<std::int64_t>(sizeof(*this)) + cache_.memory_bytes() + prefix::detail::heap_bytes(captured_) +
           cache_.store().host_entries() * 64;
  }

 private:
  cache_type cache_;
  prefix::request_lifecycle<cache_type> requests_;
  std::vector<std::int64_t> captured_;
};

}  // namespace hybridcache::compose::detail
