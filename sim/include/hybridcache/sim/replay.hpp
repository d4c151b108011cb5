// hybridcache/sim/replay.hpp
//
// The trace-replay engine: requests in arrival order through one prefix-cache composition,
// measured by a `metrics_recorder`.
//
//   sim::replay_trace trace(requests);              // flattens input ++ output once
//   sim::run_metrics m = sim::replay(cache, trace, cost_model(spec));  // a replayable_cache
//
// A prefix_cache replays through prefix_cache_replay.hpp (replay_prefix_cache), which
// adapts its `expected` results the way a runtime handles them.
//
// Per request (single stream, `concurrency = 1`, the Marconi reference's model):
//
//   m = cache.match(input)              lookup: tokens skipped (joint-min rule); pins
//   record(input_tokens, skipped)       metrics
//   cache.commit(input ++ output, m)    unpins m, then inserts; admission and eviction
//                                       happen here (the reference pins nothing across
//                                       its insert, so neither do we)
//
// With `concurrency = N > 1` a request stays in flight until N more requests have arrived
// (FIFO completion): its match stays pinned, so eviction cannot take the prefix it is
// using, and its commit happens only when it finishes. This is the simplest model of a
// batch of N running requests; it measures how pinning under load changes hit rates.
//
// `replay_trace` does all copying before the clock starts: `run_metrics::wall_seconds`
// covers the loop only (cache calls and metric updates), so it compares with the
// reference's loop time; `cpu_seconds` is the process CPU time over the same span.
//
// Token vs id granularity: a request whose ids stand for B tokens each (Mooncake block
// hashes, `request::tokens_per_id`) is replayed id by id; skipped real tokens are
// min(reusable ids · B, input_tokens), so a partial last block is not over-counted.
//
// Costs: `replay_trace` O(total ids) time and memory; `replay` O(requests) on top of the
// cache's own costs, allocation-free inside the loop apart from the recorder's
// reserved-ahead vectors.
#pragma once

#include <chrono>
#include <ctime>
#include <concepts>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/prefix/types.hpp"
#include "hybridcache/sim/metrics.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// A trace prepared for replay: every request's input ++ output in one flat buffer.
class replay_trace {
 public:
  /// One request as the engine sees it.
  struct entry {
    std::size_t offset = 0;            ///< start of input ++ output in the flat buffer
    std::int64_t input_ids = 0;        ///< ids of the input
    std::int64_t total_ids = 0;        ///< ids of input ++ output
    std::int64_t input_tokens = 0;     ///< real input tokens (for metrics)
    std::int32_t tokens_per_id = 1;
  };

  replay_trace() = default;

  /// Copies `requests` (in the given order, which must be arrival order).
  /// @throws invalid_argument for a request without ids (a length-only format) or with
  ///         tokens_per_id < 1.
  explicit replay_trace(std::span<const request> requests) {
    std::size_t total = 0;
    for (const request& r : requests) total += r.input.size() + r.output.size();
    tokens_.reserve(total);
    entries_.reserve(requests.size());
    for (const request& r : requests) append(r);
  }

  /// Streams a whole `request_source` in, one request at a time, so a large trace is never
  /// held twice. @throws as the source does, and as `append`.
  template <request_source Source>
  [[nodiscard]] static replay_trace read_all(Source& source) {
    replay_trace t;
    request r;
    while (source.next(r)) t.append(r);
    return t;
  }

  /// Appends one request (arrival order is the caller's responsibility).
  /// @throws invalid_argument for a request without ids or with tokens_per_id < 1; the
  ///         trace is unchanged then.
  void append(const request& r) {
    HYBRIDCACHE_EXPECTS(r.tokens_per_id >= 1, invalid_argument, "replay_trace: tokens_per_id must be >= 1");
    HYBRIDCACHE_EXPECTS(!r.input.empty() || r.input_tokens == 0, invalid_argument,
                        "replay_trace: request at line " + std::to_string(r.source_line) +
                            " has no token ids (a length-only trace cannot be replayed through a prefix cache)");
    entry e;
    e.offset = tokens_.size();
    e.input_ids = static_cast<std::int64_t>(r.input.size());
    e.total_ids = static_cast<std::int64_t>(r.input.size() + r.output.size());
    e.input_tokens = r.input_tokens;
    e.tokens_per_id = r.tokens_per_id;
    entries_.reserve(entries_.size() + 1);  // may throw before anything changes
    try {
      tokens_.insert(tokens_.end(), r.input.begin(), r.input.end());
      tokens_.insert(tokens_.end(), r.output.begin(), r.output.end());
    } catch (...) {
      tokens_.resize(e.offset);
      throw;
    }
    entries_.push_back(e);  // cannot throw: reserved
  }

  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const entry& operator[](std::size_t i) const noexcept { return entries_[i]; }
  /// input ++ output of request `i`.
  [[nodiscard]] std::span<const token_id> sequence(std::size_t i) const noexcept {
    return {tokens_.data() + entries_[i].offset, static_cast<std::size_t>(entries_[i].total_ids)};
  }
  /// The input of request `i`.
  [[nodiscard]] std::span<const token_id> input(std::size_t i) const noexcept {
    return {tokens_.data() + entries_[i].offset, static_cast<std::size_t>(entries_[i].input_ids)};
  }
  /// Σ input tokens (real tokens).
  [[nodiscard]] std::int64_t input_tokens() const noexcept {
    std::int64_t s = 0;
    for (const auto& e : entries_) s += e.input_tokens;
    return s;
  }

 private:
  std::vector<token_id> tokens_;
  std::vector<entry> entries_;
};

/// What the engine needs from a cache: `match(input)` → `match_result` (pinned),
/// `commit(sequence, input_ids, match)` (unpin the match, insert input ++ output; admission
/// and eviction inside), and `counters()` → `prefix::cache_counters`, `alpha()`,
/// `used_bytes()`. `prefix_cache` returns `expected` results; prefix_cache_replay.hpp adapts them.
template <class C>
concept replayable_cache = requires(C& c, const C& cc, std::span<const token_id> tokens, std::int64_t n,
                                    const match_result& m) {
  { c.match(tokens) } -> std::same_as<match_result>;
  c.commit(tokens, n, m);
  { cc.counters() } -> std::convertible_to<prefix::cache_counters>;
  { cc.alpha() } -> std::convertible_to<double>;
  { cc.used_bytes() } -> std::convertible_to<std::int64_t>;
};

/// Engine options.
struct replay_options {
  /// Requests in flight; >= 1. 1 = the reference's single stream.
  std::int64_t concurrency = 1;
  /// Fill `run_metrics::skipped_per_request` (one int64 per request).
  bool keep_per_request = false;
};

/// A progress callback that does nothing.
struct no_progress {
  void operator()(std::size_t /*done*/, std::size_t /*total*/) const noexcept {}
};

/// Replays `trace` through `cache` and returns the run's metrics (cache counters copied
/// in, `wall_seconds` = loop time). `progress(done, total)` is called every 4096 requests
/// and at the end.
/// @throws invalid_argument when concurrency < 1; whatever the cache throws.
template <class Cache, prefill_time_model PrefillTime = marconi_reference_ttft, class Progress = no_progress>
  requires replayable_cache<Cache>
[[nodiscard]] run_metrics replay(Cache& cache, const replay_trace& trace, const cost_model& costs,
                                 const replay_options& options = {}, PrefillTime ttft = {},
                                 Progress&& progress = {}) {
  HYBRIDCACHE_EXPECTS(options.concurrency >= 1, invalid_argument, "replay: concurrency must be >= 1");
  metrics_recorder<PrefillTime> rec(costs, ttft, trace.size());
  const std::size_t n = trace.size();
  std::int64_t peak = cache.used_bytes();

  struct in_flight {
    std::size_t index;
    match_result match;
  };
  std::deque<in_flight> running;
  auto finish_oldest = [&] {
    const in_flight& f = running.front();
    cache.commit(trace.sequence(f.index), trace[f.index].input_ids, f.match);
    peak = std::max<std::int64_t>(peak, cache.used_bytes());
    running.pop_front();
  };

  std::vector<std::int64_t> per_request;
  if (options.keep_per_request) per_request.reserve(n);
  const std::clock_t cpu_start = std::clock();
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const auto& e = trace[i];
    match_result m = cache.match(trace.input(i));
    const std::int64_t skipped = std::min<std::int64_t>(m.reusable_tokens * e.tokens_per_id, e.input_tokens);
    rec.record(e.input_tokens, skipped);
    if (options.keep_per_request) per_request.push_back(skipped);
    if (options.concurrency == 1) {
      cache.commit(trace.sequence(i), e.input_ids, m);
      peak = std::max<std::int64_t>(peak, cache.used_bytes());
    } else {
      running.push_back({i, m});
      if (static_cast<std::int64_t>(running.size()) >= options.concurrency) finish_oldest();
    }
    if ((i & 4095) == 4095) progress(i + 1, n);
  }
  while (!running.empty()) finish_oldest();
  const auto stop = std::chrono::steady_clock::now();
  const std::clock_t cpu_stop = std::clock();
  progress(n, n);

  run_metrics out = rec.finish();
  out.wall_seconds = std::chrono::duration<double>(stop - start).count();
  out.cpu_seconds = static_cast<double>(cpu_stop - cpu_start) / CLOCKS_PER_SEC;
  out.skipped_per_request = std::move(per_request);
  const prefix::cache_counters c = cache.counters();
  out.cache.checkpoints_admitted = c.checkpoints_admitted;
  out.cache.checkpoints_reused = c.checkpoints_reused;
  out.cache.checkpoints_evicted = c.checkpoints_evicted;
  out.cache.kv_bytes_admitted = c.kv_bytes_admitted;
  out.cache.evictions = c.evictions;
  out.cache.alpha = static_cast<double>(cache.alpha());
  out.cache.peak_bytes = peak;
  return out;
}

}  // namespace hybridcache::sim
