// hybridcache/compose/alpha_tuner.hpp
//
// `alpha_tuned_cache<Cache>`: Marconi's online alpha tuning (§4.3, the reference's
// config_tuner.py) as a wrapper around a `prefix_cache`, so that the cache itself owns no
// request history and starts no threads.
//
// What it does, exactly as the reference does it:
//   - it records every committed request (the whole sequence and its input length);
//   - the first eviction of the cache fixes the bootstrap window: `bootstrap_multiplier` x
//     the requests seen until then (the cache reports it, `requests_before_first_eviction`);
//   - at the commit whose request count equals the window, before that commit inserts
//     anything, it replays the recorded window from an empty cache once per alpha of the
//     grid {0, step, ..., alpha_max} (each replay: a counting store with the live store's
//     capacity and byte costs, a fresh scorer `with_alpha(a)`), scores each replay over its
//     last `score_last` requests (FLOPs saved, or the token hit rate) and sets the best alpha
//     (the smallest on ties) on the live scorer;
//   - beyond the reference, `retune_every` > 0 re-tunes periodically over a sliding window.
// A one-shot tuning stops recording after it ran.
//
// Costs: match/plan/release as the wrapped cache. commit: the cache's commit plus one copy of
// the sequence into the history while recording (O(|s|), allocates), plus, at a tuning
// point, (grid size) replays of the window (O(window · replay cost)), spread over
// `threads` threads that are joined before commit returns.
//
// Thread safety: none beyond the wrapped cache's; call it from one thread at a time (the
// check-then-commit pair below is not atomic against other callers).
// Needs the thread library: link `hybridcache::threads`.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/prefix/lock_policy.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"

namespace hybridcache::compose {

/// What alpha tuning optimises in each replay of the window.
enum class tuning_objective : unsigned char {
  flops_saved,     ///< Σ FLOPs saved over the last `score_last` requests (the reference)
  token_hit_rate,  ///< Σ skipped / Σ input tokens over the same requests (the paper's text)
};

/// Online alpha tuning options (aggregate; validated by the `alpha_tuned_cache` constructor).
struct tuning_config {
  bool enabled = true;  ///< false: the wrapper only forwards (alpha stays as constructed)
  /// Bootstrap window = multiplier × requests seen at the first eviction (reference: 5;
  /// its LMSys sweep: 15). Alpha stays at the scorer's initial value until then.
  std::int64_t bootstrap_multiplier = 5;
  double alpha_step = 0.1;   ///< grid {0, step, 2·step, ..., alpha_max}, each k/10 exactly for step 0.1
  double alpha_max = 2.0;
  std::int64_t score_last = 500;  ///< replays are scored over their last N requests
  tuning_objective objective = tuning_objective::flops_saved;
  unsigned threads = 0;           ///< replay threads (0 = hardware concurrency)
  /// Beyond the reference: after the first tuning, re-tune every `retune_every` requests
  /// over the last `retune_window` requests replayed from an empty cache (0 = tune once).
  std::int64_t retune_every = 0;
  std::int64_t retune_window = 0;  ///< 0 = the bootstrap window's length
};

/// One tuning decision (for logs and tests).
struct tuning_event {
  std::int64_t at_request = 0;   ///< requests seen when it ran
  std::int64_t window = 0;       ///< requests replayed
  double alpha = 0.0;            ///< chosen alpha
  std::vector<double> alphas;    ///< grid
  std::vector<double> scores;    ///< objective per grid value
};

/// A scorer whose alpha the tuner can set, and that can make a fresh copy at another alpha.
template <class S>
concept alpha_tunable_scorer = requires(S& s, const S& cs, double a) {
  s.set_alpha(a);
  { cs.with_alpha(a) } -> std::same_as<S>;
};

/// A `prefix_cache` whose scorer's alpha is tuned online. See the file comment.
///
/// @tparam Cache  a `prefix_cache<Model, Admission, Scorer, Store, Lock>` whose `Scorer`
///                models `alpha_tunable_scorer` (flop_aware_scorer, reference_flop_scorer)
template <class Cache>
  requires alpha_tunable_scorer<typename Cache::scorer_type>
class alpha_tuned_cache {
 public:
  using cache_type = Cache;
  using model_type = typename Cache::model_type;
  using admission_type = typename Cache::admission_type;
  using scorer_type = typename Cache::scorer_type;
  using store_type = typename Cache::store_type;
  using tree_type = typename Cache::tree_type;

  /// Builds the wrapped cache from the same arguments as `prefix_cache`, plus the tuning.
  /// @throws invalid_argument on a bad tuning configuration (nothing is built);
  /// @throws capacity_error from the cache.
  alpha_tuned_cache(model_type model, store_type store, scorer_type scorer, admission_type admission = {},
                    prefix::prefix_cache_config cfg = {}, tuning_config tuning = {})
      : tuning_(validated(tuning)),
        cache_(std::move(model), std::move(store), std::move(scorer), std::move(admission), cfg) {}

  alpha_tuned_cache(const alpha_tuned_cache&) = delete;
  alpha_tuned_cache& operator=(const alpha_tuned_cache&) = delete;

  // --- the cache's request API ----------------------------------------------------------

  [[nodiscard]] expected<match_result> match(std::span<const token_id> input) { return cache_.match(input); }

  [[nodiscard]] expected<prefix::checkpoint_plan> plan(std::span<const token_id> input, const match_result& m,
                                               std::span<const std::int64_t> extra = {}) {
    return cache_.plan(input, m, extra);
  }

  /// `prefix_cache::commit`, with the request recorded and, at a tuning point, alpha re-set
  /// before the insert. A commit the cache would refuse (bad arguments, stale pin,
  /// oversized) is neither recorded nor a tuning point, as in the reference.
  [[nodiscard]] expected<prefix::commit_result> commit(std::span<const token_id> sequence, std::int64_t input_tokens,
                                               const match_result* m = nullptr,
                                               std::span<const std::int64_t> extra = {}) {
    if (tuning_.enabled) {
      if (const errc e = cache_.check_commit(sequence, input_tokens, m, extra); e != errc::ok) return unexpected(e);
      before_insert(sequence, input_tokens);
    }
    return cache_.commit(sequence, input_tokens, m, extra);
  }

  expected<void> release(const match_result& m) { return cache_.release(m); }

  // --- observers --------------------------------------------------------------------------

  [[nodiscard]] const Cache& cache() const noexcept { return cache_; }
  [[nodiscard]] Cache& cache() noexcept { return cache_; }
  [[nodiscard]] const tree_type& tree() const noexcept { return cache_.tree(); }
  [[nodiscard]] const store_type& store() const noexcept { return cache_.store(); }
  [[nodiscard]] const scorer_type& scorer() const noexcept { return cache_.scorer(); }
  [[nodiscard]] const prefix::cache_counters& counters() const noexcept { return cache_.counters(); }
  [[nodiscard]] double alpha() const noexcept { return cache_.alpha(); }
  [[nodiscard]] std::int64_t requests_before_first_eviction() const noexcept {
    return cache_.requests_before_first_eviction();
  }
  [[nodiscard]] const tuning_config& tuning() const noexcept { return tuning_; }
  /// Every tuning that ran, in order.
  [[nodiscard]] const std::vector<tuning_event>& tuning_history() const noexcept { return tunings_; }

 private:
  struct request_record {
    std::vector<token_id> sequence;
    std::int64_t input_tokens = 0;
  };

  static tuning_config validated(const tuning_config& t) {
    HYBRIDCACHE_EXPECTS(t.bootstrap_multiplier > 0, invalid_argument,
                        "alpha_tuned_cache: tuning.bootstrap_multiplier must be > 0");
    HYBRIDCACHE_EXPECTS(t.alpha_step > 0 && t.alpha_max >= 0, invalid_argument,
                        "alpha_tuned_cache: tuning alpha grid must have step > 0 and max >= 0");
    HYBRIDCACHE_EXPECTS(t.score_last > 0, invalid_argument, "alpha_tuned_cache: tuning.score_last must be > 0");
    HYBRIDCACHE_EXPECTS(t.retune_every >= 0 && t.retune_window >= 0, invalid_argument,
                        "alpha_tuned_cache: tuning.retune_every/retune_window must be >= 0");
    return t;
  }

  [[nodiscard]] std::int64_t window_length() const noexcept {
    return tuning_.retune_window > 0 ? tuning_.retune_window : bootstrap_window_;
  }

  void before_insert(std::span<const token_id> seq, std::int64_t input_tokens) {
    // The first eviction (during an earlier commit) fixes the bootstrap window.
    if (bootstrap_window_ == 0 && cache_.requests_before_first_eviction() >= 0)
      bootstrap_window_ = tuning_.bootstrap_multiplier * cache_.requests_before_first_eviction();
    // After a one-shot tuning nothing more is replayed: stop recording.
    if (!tunings_.empty() && tuning_.retune_every == 0) return;
    history_.push_back(request_record{std::vector<token_id>(seq.begin(), seq.end()), input_tokens});
    if (!tunings_.empty()) {  // periodic mode: keep only the sliding window
      const std::int64_t win = window_length();
      if (static_cast<std::int64_t>(history_.size()) > 2 * win) history_.erase(history_.begin(), history_.end() - win);
    }
    const auto seen = static_cast<std::int64_t>(cache_.counters().matches);
    if (bootstrap_window_ > 0 && tunings_.empty() && seen == bootstrap_window_) {
      run_tuning(0, seen);
      last_tune_at_ = seen;
    } else if (!tunings_.empty() && tuning_.retune_every > 0 && seen - last_tune_at_ >= tuning_.retune_every) {
      const std::int64_t from = std::max<std::int64_t>(0, static_cast<std::int64_t>(history_.size()) - window_length());
      run_tuning(from, seen);
      last_tune_at_ = seen;
    }
  }

  void run_tuning(std::int64_t from, std::int64_t seen) {
    tuning_event ev;
    ev.at_request = seen;
    ev.window = static_cast<std::int64_t>(history_.size()) - from;
    const auto steps = static_cast<std::int64_t>(tuning_.alpha_max / tuning_.alpha_step + 1e-9);
    for (std::int64_t k = 0; k <= steps; ++k) {
      // k/10 rounds exactly like the literals 0.1 ... 2.0 of the reference's grid.
      const double a = tuning_.alpha_step == 0.1 ? static_cast<double>(k) / 10.0
                                                 : static_cast<double>(k) * tuning_.alpha_step;
      ev.alphas.push_back(a);
    }
    ev.scores.assign(ev.alphas.size(), 0.0);
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const unsigned nthreads = tuning_.threads > 0 ? tuning_.threads : hw;
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i = next++; i < ev.alphas.size(); i = next++) ev.scores[i] = replay_score(ev.alphas[i], from);
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < std::min<std::size_t>(nthreads, ev.alphas.size()); ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    std::size_t best = 0;
    for (std::size_t i = 1; i < ev.scores.size(); ++i)
      if (ev.scores[i] > ev.scores[best]) best = i;  // strict: the smallest alpha wins ties
    ev.alpha = ev.alphas[best];
    cache_.set_alpha(ev.alpha);
    tunings_.push_back(std::move(ev));
  }

  /// Replays history_[from..] from an empty cache (a counting store with the live store's
  /// capacity and byte costs) at fixed alpha; returns the objective over the last
  /// `score_last` requests.
  double replay_score(double a, std::int64_t from) const {
    using replica = prefix::prefix_cache<model_type, admission_type, scorer_type, stores::counting_store, prefix::no_lock>;
    const store_type& live = cache_.store();
    stores::counting_store st(live.capacity_bytes(), live.kv_bytes(1), live.checkpoint_bytes());
    st.allow_overflow(cache_.config().admit_oversized);
    replica r(cache_.model(), std::move(st), cache_.scorer().with_alpha(a), cache_.admission(), cache_.config());
    const auto n = static_cast<std::int64_t>(history_.size());
    const std::int64_t score_from = std::max(from, n - tuning_.score_last);
    long double flops = 0;
    std::int64_t skipped = 0, inputs = 0;
    for (std::int64_t i = from; i < n; ++i) {
      const auto& rq = history_[static_cast<std::size_t>(i)];
      const std::span<const token_id> seq(rq.sequence);
      auto mr = r.match(seq.first(static_cast<std::size_t>(rq.input_tokens)));
      if (mr && i >= score_from) {
        flops += static_cast<long double>(mr->flops_saved);
        skipped += mr->reusable_tokens;
        inputs += rq.input_tokens;
      }
      if (mr) (void)r.commit(seq, rq.input_tokens, &*mr);
    }
    if (tuning_.objective == tuning_objective::flops_saved) return static_cast<double>(flops);
    return inputs > 0 ? static_cast<double>(skipped) / static_cast<double>(inputs) : 0.0;
  }

  tuning_config tuning_;
  Cache cache_;
  std::int64_t bootstrap_window_ = 0;
  std::int64_t last_tune_at_ = 0;
  std::vector<request_record> history_;
  std::vector<tuning_event> tunings_;
};

}  // namespace hybridcache::compose
