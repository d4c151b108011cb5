// hybridcache/sim/prefix_cache_replay.hpp
//
// A prefix_cache in the replay engine (replay.hpp), driven through the calls a runtime
// makes. hcbench, the benchmarks and the tests all replay through these adapters, so a
// number each of them reports comes from the same code path.
//
//   commit_adapter     match(input), then commit(input ++ output) after decode: the Marconi
//                      reference's model (its fidelity rows). A commit the store refuses
//                      (out_of_capacity under a strict capacity) is counted, not fatal, and
//                      its match released.
//   lifecycle_adapter  request_lifecycle (prefix/lifecycle.hpp): begin (match, plan, reserve
//                      the prompt's KV and its checkpoint slots before prefill), grow by the
//                      output's KV, finish with every planned state captured. A request that
//                      cannot be reserved or grown is refused and not cached.
//
//   auto store = sim::replay_store(costs, {.capacity_bytes = capacity, .tokens_per_id = tokens_per_id});
//   prefix::prefix_cache<cost_model, Admission, Scorer, stores::counting_store> cache(
//       costs, std::move(store), scorer, Admission{}, {.admit_oversized = true});
//   sim::run_metrics m = sim::replay_prefix_cache(cache, trace, costs, {.concurrency = 4});
//   // m.cache.refused_commits: requests the adapter refused
//
// Costs: each adapter adds O(1) per call to the cache's own, except that
// lifecycle_adapter finds a finishing request among those in flight by a linear scan
// (at most `concurrency` of them) and sorts its captured positions (the plan's sites).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/types.hpp"
#include "hybridcache/sim/metrics.hpp"
#include "hybridcache/sim/replay.hpp"
#include "hybridcache/stores/counting_store.hpp"

namespace hybridcache::sim {

/// What a replay's store is (`replay_store`).
struct replay_store_options {
  std::int64_t capacity_bytes = 0;  ///< shared by KV and SSM checkpoints
  /// Tokens each id stands for: KV is priced per id (a Mooncake block hash is a block).
  std::int64_t tokens_per_id = 1;
  /// Refuse what does not fit. Off: run over capacity as the Marconi reference does (a
  /// sequence larger than the cache is inserted anyway).
  bool strict_capacity = false;
};

/// The byte-counting store a replay runs on. @throws invalid_argument for a negative
/// capacity or tokens_per_id < 1, overflow_error when the KV bytes per id overflow int64.
[[nodiscard]] inline stores::counting_store replay_store(const cost_model& costs, const replay_store_options& o) {
  HYBRIDCACHE_EXPECTS(o.capacity_bytes >= 0 && o.tokens_per_id >= 1, invalid_argument,
                      "replay_store: capacity_bytes must be >= 0 and tokens_per_id >= 1");
  const std::int64_t kv = checked_mul(costs.kv_bytes_per_token(), o.tokens_per_id, "KV bytes per id");
  stores::counting_store s(o.capacity_bytes, kv, costs.ssm_checkpoint_bytes());
  s.allow_overflow(!o.strict_capacity);
  return s;
}

namespace detail {
/// What both adapters report to the engine: the cache's counters, alpha and bytes, and the
/// requests they refused.
template <class Cache>
class replay_adapter_base {
 public:
  explicit replay_adapter_base(Cache& c) : c_(c) {}
  [[nodiscard]] prefix::cache_counters counters() const { return c_.counters(); }
  [[nodiscard]] double alpha() const { return c_.alpha(); }
  [[nodiscard]] std::int64_t used_bytes() const { return c_.store().used_bytes(); }
  /// Requests not cached because the store had no room for them.
  [[nodiscard]] std::int64_t refused() const noexcept { return refused_; }

 protected:
  [[noreturn]] static void fail(const char* what, errc e) {
    throw invalid_argument("replay: " + std::string(what) + " failed (" + std::string(to_string(e)) + ")");
  }

  Cache& c_;
  std::int64_t refused_ = 0;
};
}  // namespace detail

/// match, then commit after decode, on a prefix_cache or an alpha_tuned_cache. Failures
/// other than a refused commit throw `invalid_argument` (a replay that hits one is a bug).
template <class Cache>
class commit_adapter : public detail::replay_adapter_base<Cache> {
  using base = detail::replay_adapter_base<Cache>;
  using base::c_;
  using base::refused_;

 public:
  explicit commit_adapter(Cache& c) : base(c) {}
  match_result match(std::span<const token_id> in) {
    auto m = c_.match(in);
    if (!m) base::fail("match", m.error());
    return *m;
  }
  void commit(std::span<const token_id> seq, std::int64_t input_ids, const match_result& m) {
    auto r = c_.commit(seq, input_ids, &m);
    if (r) return;
    if (r.error() != errc::out_of_capacity) base::fail("commit", r.error());
    // Refused with nothing changed: the match is still pinned; hand it back.
    if (auto released = c_.release(m); !released) base::fail("release after a refused commit", released.error());
    ++refused_;
  }
};

/// The request lifecycle on a prefix_cache: `match` begins the request, `commit` grows its
/// reservation by the output's KV and finishes it with every planned state captured (the
/// plan's sites and the end). A request refused at begin still counts its lookup (what the
/// lookup found, nothing pinned), as a refused commit's does.
template <class Cache>
class lifecycle_adapter : public detail::replay_adapter_base<Cache> {
  using base = detail::replay_adapter_base<Cache>;
  using base::c_;
  using base::refused_;

 public:
  explicit lifecycle_adapter(Cache& c) : base(c), requests_(c) {}
  match_result match(std::span<const token_id> in) {
    auto t = requests_.begin(in);
    if (!t) {
      if (t.error() != errc::out_of_capacity) base::fail("begin", t.error());
      ++refused_;
      match_result m = c_.last_match();
      m.pin = packed_handle{};
      m.at = 0;  // marks the request refused for commit()
      return m;
    }
    const auto& s = **requests_.state(*t);
    live_.push_back({s.match.at, *t});
    return s.match;
  }
  void commit(std::span<const token_id> seq, std::int64_t /*input_ids*/, const match_result& m) {
    if (m.at == 0) return;  // refused at begin
    // A request is found by its match's time stamp: unique per begin on the logical clock.
    const auto it = std::find_if(live_.begin(), live_.end(), [&](const auto& e) { return e.first == m.at; });
    if (it == live_.end()) throw invalid_argument("replay: commit of a request that did not begin");
    const prefix::request_ticket t = it->second;
    live_.erase(it);
    const auto& s = **requests_.state(t);
    const std::int64_t need = static_cast<std::int64_t>(seq.size()) - (s.kv_from + s.reserved_tokens);
    if (need > 0 && !requests_.grow(t, need)) {  // decode ran out of room: the runtime aborts
      (void)requests_.abort(t);
      ++refused_;
      return;
    }
    captured_.clear();
    for (const auto& site : s.plan.sites) captured_.push_back(site.position);
    captured_.push_back(static_cast<std::int64_t>(seq.size()));
    std::sort(captured_.begin(), captured_.end());
    captured_.erase(std::unique(captured_.begin(), captured_.end()), captured_.end());
    if (auto f = requests_.finish(t, seq, captured_); !f) base::fail("finish", f.error());
  }

 private:
  prefix::request_lifecycle<Cache> requests_;
  std::vector<std::pair<time_point, prefix::request_ticket>> live_;  // in flight (at most the concurrency)
  std::vector<std::int64_t> captured_;                                // reused between requests
};

/// Replays `trace` through `cache` with `Adapter` (commit_adapter or lifecycle_adapter)
/// and returns the engine's metrics with `cache.refused_commits` filled in.
/// `progress(done, total)` as replay() calls it. Costs: replay()'s plus the adapter's.
/// @throws invalid_argument (a failed cache call, concurrency < 1); what the cache throws.
template <template <class> class Adapter = commit_adapter, class Cache, class Progress = no_progress>
[[nodiscard]] run_metrics replay_prefix_cache(Cache& cache, const replay_trace& trace, const cost_model& costs,
                                              const replay_options& options = {}, Progress&& progress = {}) {
  Adapter<Cache> adapter(cache);
  run_metrics m = replay(adapter, trace, costs, options, marconi_reference_ttft{}, std::forward<Progress>(progress));
  m.cache.refused_commits = adapter.refused();
  return m;
}

}  // namespace hybridcache::sim
