// hybridcache/tiered/offload_engine.hpp
//
// Asynchronous offload with watermarks (CaR §III-C2): once HBM use reaches the high
// watermark (90 % by default, CaR's and Mooncake's number), demote victims — chosen by the
// store's demotion scorer — to the next tier until use falls to the low watermark (80 %;
// the hysteresis the anchors ask for: a 90 %-only trigger thrashes). Room in a full
// lower tier is made by moving its own victims one tier further down, or dropping them
// from the last tier, and only once the tier is known to be able to take the entry
// (`would_fit`: free + evictable pages), so nothing is dropped for a victim that cannot
// go down anyway (larger than the tier, or the tier's other entries pinned). A victim
// that cannot go down, or whose copy fails, is skipped for the rest of the pass: the
// pass goes on with the next one instead of retrying it.
//
// It runs off the request path: `start()` launches a background thread that wakes on
// `notify()` (cheap: the request path calls it after inserting) or every `poll`; or a
// simulator calls `run_once()` at the points it chooses. Moves go through the two-phase
// protocol (`move_entry`), so a failed copy leaves the entry where it was. The `Sizer`
// (sparsify.hpp) says how many bytes a demoted entry keeps: whole (`keep_size`) or
// sparsified KV (`sparsify_on_demotion`, CaR §III-D).
//
// Costs: one pass demotes k entries in O(k · (pages + log n)) plus the copies; each of the
// s victims it skips makes every later pick walk past it (O(s²) more over the pass).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/tiered/detail/background_pass.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

/// Offload thresholds as fractions of HBM capacity.
struct watermarks {
  double high = 0.90;  ///< start demoting at or above this use
  double low = 0.80;   ///< stop when use is at or below this

  /// @throws invalid_argument unless 0 <= low < high <= 1.
  void validate() const {
    HYBRIDCACHE_EXPECTS(low >= 0.0 && low < high && high <= 1.0, invalid_argument,
                        "watermarks: need 0 <= low < high <= 1");
  }
};

/// Counters of an offload engine.
struct offload_stats {
  std::int64_t passes = 0;
  std::int64_t demoted_entries = 0;
  std::int64_t demoted_bytes = 0;   ///< bytes written to lower tiers
  std::int64_t sparsified_bytes = 0;///< bytes not written thanks to the sizer (sparsification)
  std::int64_t dropped_entries = 0; ///< entries gone (last copy dropped from the last tier) to make room
  std::int64_t dropped_clean = 0;   ///< HBM copies dropped for free (a valid copy below)
  std::int64_t failed_moves = 0;
};

/// Watermark-driven demotion from HBM, synchronous (`run_once`) or in a background thread.
/// `start()` runs `run_once` in a background thread whenever notified (`notify()`, cheap:
/// call it after inserting into HBM) or every `poll`; it only acts above the high
/// watermark. `stop()` joins it (idempotent).
template <class Store, class Engine, demotion_sizer Sizer = keep_size>
class offload_engine : public detail::background_passes<offload_engine<Store, Engine, Sizer>> {
 public:
  offload_engine(Store& store, Engine& engine, watermarks marks = {}, Sizer sizer = Sizer{})
      : store_(store), engine_(engine), marks_(marks), sizer_(std::move(sizer)) {
    marks_.validate();
    HYBRIDCACHE_EXPECTS(store.tier_count() >= 2, invalid_argument, "offload_engine: needs at least two tiers");
  }
  ~offload_engine() { this->stop(); }
  offload_engine(const offload_engine&) = delete;
  offload_engine& operator=(const offload_engine&) = delete;

  /// True when HBM use is at or above the high watermark.
  [[nodiscard]] bool above_high() const {
    const auto u = store_.usage(hbm_tier);
    return static_cast<double>(u.used_bytes) >= marks_.high * static_cast<double>(u.capacity_bytes);
  }

  /// One pass: if HBM use >= high, demote until use <= low (or no victim left can go
  /// down). A victim that finds no room below or whose move fails is skipped for the rest
  /// of the pass. Returns the bytes demoted. Thread-safe against concurrent store users.
  std::int64_t run_once() {
    std::lock_guard pass(pass_mu_);
    if (!above_high()) return 0;
    std::int64_t moved = 0;
    std::vector<entry_id> skipped;  // tried this pass; a failed move re-indexes under the same key
    stats_.passes += 1;
    for (;;) {
      const auto u = store_.usage(hbm_tier);
      if (static_cast<double>(u.used_bytes) <= marks_.low * static_cast<double>(u.capacity_bytes)) break;
      // Not even one page fits below: no victim can go down, skipping them all is wasted work.
      if (!store_.would_fit(tier_id{1}, 1)) break;
      const auto v = store_.victim(hbm_tier, skipped);
      if (!v) break;
      const auto e = store_.find(*v);
      if (!e) continue;  // raced with an erase: no longer a victim
      // A clean HBM copy (a valid copy below already): dropping it frees the room.
      if (e->clean_below(hbm_tier)) {
        if (store_.drop_copy(*v, hbm_tier)) stats_.dropped_clean += 1;
        else skipped.push_back(*v);  // pinned since it was picked
        continue;
      }
      const std::int64_t keep = std::clamp<std::int64_t>(sizer_.stored_bytes(*e), 1, e->bytes());
      if (!make_room(tier_id{1}, keep)) {
        skipped.push_back(*v);
        continue;
      }
      const auto r = move_entry(store_, engine_, *v, tier_id{1}, keep);
      if (r) {
        moved += keep;
        stats_.demoted_entries += 1;
        stats_.demoted_bytes += keep;
        stats_.sparsified_bytes += e->bytes() - keep;
      } else {
        stats_.failed_moves += 1;
        skipped.push_back(*v);  // copy failed, pinned meanwhile, ...: go on with the next victim
      }
    }
    return moved;
  }

  [[nodiscard]] offload_stats stats() const {
    std::lock_guard pass(pass_mu_);
    return stats_;
  }

 private:
  // Frees room for `bytes` in tier t by pushing its victims one tier down (dropping them
  // from the last tier). False when it cannot. It first checks that t can take `bytes` at
  // all (free + evictable pages): without that check a victim larger than the tier, or a
  // tier whose other entries are pinned, had the last tier emptied for nothing. In the
  // last tier the check is exact (barring pins taken meanwhile); above it, a victim that
  // cannot go down is skipped and the next one tried, so moves may happen for a room that
  // is not made in the end, but nothing is dropped from t itself.
  bool make_room(tier_id t, std::int64_t bytes) {
    if (!store_.would_fit(t, bytes)) return false;
    const std::int64_t need = store_.pages_for(bytes) * store_.page_bytes();  // <= capacity: fits
    const bool last = t.value + 1u >= store_.tier_count();
    std::vector<entry_id> stuck;  // victims of t that could not go down in this call
    for (int guard = 0; guard < 1 << 20; ++guard) {
      const auto u = store_.usage(t);
      if (u.capacity_bytes - u.used_bytes >= need) return true;
      const auto v = store_.victim(t, stuck);
      if (!v) return false;
      const auto e = store_.find(*v);
      if (!e) continue;
      if (last || e->clean_below(t)) {  // the last tier drops; a clean copy goes for free
        // Counted only when the entry went: a demotion whose source was pinned meanwhile
        // left a copy above, which the snapshot `e` may not show.
        if (const auto gone = store_.drop_copy(*v, t)) stats_.dropped_entries += *gone ? 1 : 0;
        else stuck.push_back(*v);  // pinned meanwhile
        continue;
      }
      const tier_id next{static_cast<std::uint8_t>(t.value + 1)};
      if (!make_room(next, e->bytes())) {
        stuck.push_back(*v);
        continue;
      }
      if (move_entry(store_, engine_, *v, next)) {
        stats_.demoted_entries += 1;
        stats_.demoted_bytes += e->bytes();
      } else {
        stats_.failed_moves += 1;
        stuck.push_back(*v);
      }
    }
    return false;
  }

  Store& store_;
  Engine& engine_;
  watermarks marks_;
  Sizer sizer_;
  mutable std::mutex pass_mu_;
  offload_stats stats_;
};

}  // namespace hybridcache::tiered
