// hybridcache/tiered/layer_pipeline.hpp
//
// Layer-wise pipelined loading (CaR §III-C1; SGLang HiCache's LayerDoneCounter): a prefix
// load is split per layer, and layer l's compute waits only for layer l's data, so the
// load of layer l+1 overlaps the compute of layer l.
//
// Two pieces:
//   pipeline_timeline()  the timeline model a simulator uses: loads run back to back on
//                        the copy stream (starting at `load_start`, possibly before compute
//                        may start — a prefetch); compute of layer l starts at
//                        max(end of compute l-1, end of load l). It reports how much of the
//                        load time stayed on the critical path.
//   layer_event_ring     the runtime side on the host: one event per layer, a small ring
//                        (3 by default) of event sets so a new load can start while the
//                        previous one is consumed; a set may be reused only once all its
//                        events have fired (checked, returns `busy`). The CUDA copy engine
//                        records real cudaEvents into the same protocol.
//
// Costs: the timeline is O(layers); ring operations are O(1) (wait blocks).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::tiered {

/// Result of the timeline model (milliseconds).
struct pipeline_times {
  double finish_ms = 0.0;        ///< when the last layer's compute ends
  double load_ms = 0.0;          ///< Σ per-layer load time
  double compute_ms = 0.0;       ///< Σ per-layer compute time
  double exposed_load_ms = 0.0;  ///< finish − (compute start + compute): load on the critical path
  /// Fraction of the load time that did not delay compute: 1 − exposed/load (1 when no load).
  [[nodiscard]] double hidden_fraction() const noexcept {
    return load_ms > 0.0 ? std::clamp(1.0 - exposed_load_ms / load_ms, 0.0, 1.0) : 1.0;
  }
};

/// Layer-wise pipelined timeline. `load_ms[l]` and `compute_ms[l]` per layer (same
/// length); loads start at `load_start_ms` back to back, compute may start at
/// `compute_start_ms`. With `pipelined == false` every layer waits for the whole load (the
/// non-pipelined baseline).
[[nodiscard]] inline pipeline_times pipeline_timeline(std::span<const double> load_ms, std::span<const double> compute_ms,
                                                      double compute_start_ms = 0.0, double load_start_ms = 0.0,
                                                      bool pipelined = true) {
  HYBRIDCACHE_EXPECTS(load_ms.size() == compute_ms.size(), invalid_argument,
                      "pipeline_timeline: load and compute need one entry per layer");
  pipeline_times r;
  for (double x : load_ms) r.load_ms += x;
  for (double x : compute_ms) r.compute_ms += x;
  const double all_loaded = load_start_ms + r.load_ms;
  double ready = load_start_ms, compute_end = compute_start_ms;
  for (std::size_t l = 0; l < load_ms.size(); ++l) {
    ready += load_ms[l];  // layer l's data is in once layers 0..l were copied
    compute_end = std::max(compute_end, pipelined ? ready : all_loaded) + compute_ms[l];
  }
  r.finish_ms = compute_end;
  r.exposed_load_ms = std::max(0.0, r.finish_ms - compute_start_ms - r.compute_ms);
  return r;
}

/// Host-side per-layer events in a ring of `sets` event sets (3 by default, as HiCache).
/// The loader `begin`s a set, `record`s layer l when its copy finished; the consumer
/// `wait`s for layer l before computing it and `end`s the set when done.
class layer_event_ring {
 public:
  /// @throws invalid_argument for layers <= 0 or sets <= 0.
  explicit layer_event_ring(std::int32_t layers, std::int32_t sets = 3)
      : layers_(layers), done_(static_cast<std::size_t>(std::max(0, layers) * std::max(0, sets)), 0),
        state_(static_cast<std::size_t>(std::max(0, sets)), slot::free) {
    HYBRIDCACHE_EXPECTS(layers > 0 && sets > 0, invalid_argument, "layer_event_ring: layers and sets must be > 0");
  }

  /// Claims the next set for a new load. `busy` when the ring's next set is still in use
  /// (its consumer has not ended it, or some layer has not fired) — never reused early.
  [[nodiscard]] expected<std::int32_t> begin() {
    std::lock_guard lock(mu_);
    const auto s = next_;
    if (state_[static_cast<std::size_t>(s)] != slot::free) return unexpected(errc::busy);
    state_[static_cast<std::size_t>(s)] = slot::loading;
    std::fill_n(done_.begin() + s * layers_, layers_, 0);
    next_ = (next_ + 1) % static_cast<std::int32_t>(state_.size());
    return s;
  }

  /// Marks layer `l` of set `s` loaded and wakes waiters.
  [[nodiscard]] expected<void> record(std::int32_t s, std::int32_t l) {
    {
      std::lock_guard lock(mu_);
      if (!valid(s, l) || state_[static_cast<std::size_t>(s)] != slot::loading) return unexpected(errc::invalid_argument);
      done_[static_cast<std::size_t>(s * layers_ + l)] = 1;
    }
    cv_.notify_all();
    return {};
  }

  /// True when layer `l` of set `s` has been recorded.
  [[nodiscard]] bool query(std::int32_t s, std::int32_t l) const {
    std::lock_guard lock(mu_);
    return valid(s, l) && done_[static_cast<std::size_t>(s * layers_ + l)] != 0;
  }

  /// Blocks until layer `l` of set `s` is loaded (only that layer: later layers may still
  /// be in flight).
  [[nodiscard]] expected<void> wait(std::int32_t s, std::int32_t l) {
    std::unique_lock lock(mu_);
    if (!valid(s, l) || state_[static_cast<std::size_t>(s)] != slot::loading) return unexpected(errc::invalid_argument);
    cv_.wait(lock, [&] { return done_[static_cast<std::size_t>(s * layers_ + l)] != 0; });
    return {};
  }

  /// The consumer is done with set `s`. `busy` if some layer never fired (the set stays
  /// claimed: reusing it would let a late copy overwrite a new load).
  [[nodiscard]] expected<void> end(std::int32_t s) {
    std::lock_guard lock(mu_);
    if (s < 0 || s >= static_cast<std::int32_t>(state_.size()) || state_[static_cast<std::size_t>(s)] != slot::loading)
      return unexpected(errc::invalid_argument);
    for (std::int32_t l = 0; l < layers_; ++l)
      if (!done_[static_cast<std::size_t>(s * layers_ + l)]) return unexpected(errc::busy);
    state_[static_cast<std::size_t>(s)] = slot::free;
    return {};
  }

  [[nodiscard]] std::int32_t layers() const noexcept { return layers_; }
  [[nodiscard]] std::int32_t sets() const noexcept { return static_cast<std::int32_t>(state_.size()); }

 private:
  enum class slot : std::uint8_t { free, loading };
  [[nodiscard]] bool valid(std::int32_t s, std::int32_t l) const noexcept {
    return s >= 0 && s < static_cast<std::int32_t>(state_.size()) && l >= 0 && l < layers_;
  }
  std::int32_t layers_;
  std::vector<std::uint8_t> done_;
  std::vector<slot> state_;
  std::int32_t next_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace hybridcache::tiered
