// hybridcache/memory/rebalancer.hpp
//
// Rebalancers: when capacity should move between the KV and the SSM pool, and how much.
//
// A rebalancer only decides; the pool moves whole chunks. The pressure state machine of
// the AVMP paper (arXiv 2605.22416, section 3):
//
//   BALANCED       neither pool is pressured
//   KV_PRESSURED   kv free fraction < threshold_low and ssm free fraction > threshold_high
//   SSM_PRESSURED  the mirror image
//   REBALANCING    while the pool is moving chunks (set by the pool)
//
// `threshold_rebalancer` moves `migration_batch_size` donor units toward a pool whose
// allocation failed, but only if the donor's free fraction exceeds `threshold_high` (so
// the donor is not starved) and at least `min_rebalance_interval_ops` logical operations
// passed since the last rebalance (no thrashing). Unlike the reference, where only a
// forced path that skips both checks is live, the thresholds and the throttle here decide
// (tests pin that changing them changes the outcome). Optional proactive rebalancing uses
// the low/high watermarks with hysteresis: it starts when a pool's free fraction drops
// below threshold_low while the other's exceeds threshold_high, keeps going (one batch per
// `maintain()` call, throttled) until the recipient's free fraction is back above the
// midpoint of the two thresholds, and is meant to run off the allocation path.
//
// Every call is O(1), noexcept and allocation-free.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/memory/units.hpp"

namespace hybridcache::memory {

/// The pool's pressure state (values as in the reference's IntEnum).
enum class pressure_state : std::uint8_t { balanced = 0, kv_pressured = 1, ssm_pressured = 2, rebalancing = 3 };

[[nodiscard]] constexpr std::string_view to_string(pressure_state s) noexcept {
  switch (s) {
    case pressure_state::balanced: return "BALANCED";
    case pressure_state::kv_pressured: return "KV_PRESSURED";
    case pressure_state::ssm_pressured: return "SSM_PRESSURED";
    case pressure_state::rebalancing: return "REBALANCING";
  }
  return "UNKNOWN";
}

/// What a rebalancer sees of the pool.
struct pool_occupancy {
  double kv_free_fraction = 0;   ///< free / total units of the KV pool (0 when empty)
  double ssm_free_fraction = 0;  ///< same for the SSM pool
  std::uint64_t kv_unit_bytes = 0;
  std::uint64_t ssm_unit_bytes = 0;

  [[nodiscard]] double free_fraction(pool_kind k) const noexcept {
    return k == pool_kind::kv ? kv_free_fraction : ssm_free_fraction;
  }
  [[nodiscard]] std::uint64_t unit_bytes(pool_kind k) const noexcept {
    return k == pool_kind::kv ? kv_unit_bytes : ssm_unit_bytes;
  }
};

/// Why a migration was not planned.
enum class refusal : std::uint8_t {
  none = 0,        ///< planned
  disabled,        ///< the rebalancer never migrates
  throttled,       ///< fewer than min_rebalance_interval_ops operations since the last one
  donor_busy,      ///< the donor's free fraction is not above threshold_high
  not_pressured,   ///< proactive: no pool is under its low watermark
  no_gain,         ///< the pool found nothing to move (no free chunk, recipient full)
};

[[nodiscard]] constexpr std::string_view to_string(refusal r) noexcept {
  constexpr std::array<std::string_view, 6> names{"none", "disabled", "throttled", "donor_busy", "not_pressured", "no_gain"};
  static_assert(names_every_enumerator(names, refusal::no_gain));
  return enum_name(r, names);
}

/// A rebalancer's decision: move `donor_units` units' worth of the other pool's capacity
/// to `recipient` (rounded up to whole chunks by the pool), or refuse with a reason.
struct migration_plan {
  pool_kind recipient = pool_kind::kv;
  std::uint64_t donor_units = 0;
  refusal why = refusal::none;
  [[nodiscard]] constexpr explicit operator bool() const noexcept { return why == refusal::none && donor_units > 0; }
};

/// What a pool needs from a rebalancer.
template <class R>
concept rebalancer = requires(R& r, const R& cr, pool_kind k, std::uint64_t n, const pool_occupancy& o,
                              pressure_state s) {
  { r.on_operation() } noexcept;
  { r.observe(o) } noexcept -> std::same_as<pressure_state>;
  { r.on_failure(k, n, o) } noexcept -> std::same_as<migration_plan>;
  { r.proactive(o) } noexcept -> std::same_as<migration_plan>;
  { r.on_committed() } noexcept;
  { r.set_state(s) } noexcept;
  { cr.state() } noexcept -> std::same_as<pressure_state>;
  { cr.operations() } noexcept -> std::same_as<std::uint64_t>;
};

/// Settings of `threshold_rebalancer` (defaults: the AVMP paper's configuration).
struct rebalancer_config {
  double threshold_low = 0.05;                    ///< a pool is pressured below this free fraction
  double threshold_high = 0.30;                   ///< a donor must keep more than this free
  std::uint64_t migration_batch_size = 128;       ///< donor units per rebalance
  std::uint64_t min_rebalance_interval_ops = 1000;  ///< logical operations between rebalances
  bool proactive = false;                         ///< watermark rebalancing in maintain()
  /// On an allocation failure, move at least the donor units that cover the request
  /// (beyond the paper: one failed 700-page prefill needs more than one batch).
  bool size_to_demand = false;

  /// @throws invalid_argument naming the bad field.
  void validate() const {
    HYBRIDCACHE_EXPECTS(threshold_low >= 0 && threshold_low <= 1, invalid_argument,
                        "rebalancer_config: threshold_low must be in [0, 1], got " + std::to_string(threshold_low));
    HYBRIDCACHE_EXPECTS(threshold_high >= 0 && threshold_high <= 1, invalid_argument,
                        "rebalancer_config: threshold_high must be in [0, 1], got " + std::to_string(threshold_high));
    HYBRIDCACHE_EXPECTS(threshold_low < threshold_high, invalid_argument,
                        "rebalancer_config: threshold_low (" + std::to_string(threshold_low) +
                            ") must be < threshold_high (" + std::to_string(threshold_high) + ")");
    HYBRIDCACHE_EXPECTS(migration_batch_size > 0, invalid_argument,
                        "rebalancer_config: migration_batch_size must be > 0");
  }
};

/// Threshold-gated, throttled rebalancing on allocation failure (+ optional watermarks).
class threshold_rebalancer {
 public:
  /// @throws invalid_argument if the config is invalid (e.g. threshold_low >= threshold_high).
  explicit threshold_rebalancer(rebalancer_config cfg = {}) : cfg_(cfg) { cfg_.validate(); }

  void on_operation() noexcept { ++ops_; }

  pressure_state observe(const pool_occupancy& o) noexcept {
    if (state_ == pressure_state::rebalancing) return state_;
    state_ = classify(o);
    return state_;
  }

  migration_plan on_failure(pool_kind failing, std::uint64_t units_needed, const pool_occupancy& o) noexcept {
    migration_plan p{failing, 0, gate(other(failing), o)};
    if (p.why != refusal::none) return p;
    p.donor_units = cfg_.migration_batch_size;
    if (cfg_.size_to_demand) {
      const std::uint64_t need_bytes = units_needed * o.unit_bytes(failing);
      const std::uint64_t donor_unit = o.unit_bytes(other(failing));
      const std::uint64_t need_donor_units = donor_unit ? (need_bytes + donor_unit - 1) / donor_unit : 0;
      if (need_donor_units > p.donor_units) p.donor_units = need_donor_units;
    }
    return p;
  }

  migration_plan proactive(const pool_occupancy& o) noexcept {
    if (!cfg_.proactive) return {pool_kind::kv, 0, refusal::disabled};
    const double mid = (cfg_.threshold_low + cfg_.threshold_high) / 2;
    // Hysteresis: a started episode continues until the recipient is back above `mid`.
    if (episode_active_ && o.free_fraction(episode_recipient_) >= mid) episode_active_ = false;
    if (!episode_active_) {
      const pressure_state s = classify(o);
      if (s == pressure_state::balanced) return {pool_kind::kv, 0, refusal::not_pressured};
      episode_active_ = true;
      episode_recipient_ = s == pressure_state::kv_pressured ? pool_kind::kv : pool_kind::ssm;
    }
    migration_plan p{episode_recipient_, cfg_.migration_batch_size, gate(other(episode_recipient_), o)};
    if (p.why == refusal::donor_busy) episode_active_ = false;
    return p;
  }

  void on_committed() noexcept {
    last_rebalance_op_ = ops_;
    has_rebalanced_ = true;
  }
  void set_state(pressure_state s) noexcept { state_ = s; }
  [[nodiscard]] pressure_state state() const noexcept { return state_; }
  [[nodiscard]] std::uint64_t operations() const noexcept { return ops_; }
  [[nodiscard]] const rebalancer_config& config() const noexcept { return cfg_; }

 private:
  [[nodiscard]] pressure_state classify(const pool_occupancy& o) const noexcept {
    if (o.kv_free_fraction < cfg_.threshold_low && o.ssm_free_fraction > cfg_.threshold_high)
      return pressure_state::kv_pressured;
    if (o.ssm_free_fraction < cfg_.threshold_low && o.kv_free_fraction > cfg_.threshold_high)
      return pressure_state::ssm_pressured;
    return pressure_state::balanced;
  }

  [[nodiscard]] refusal gate(pool_kind donor, const pool_occupancy& o) const noexcept {
    if (has_rebalanced_ && ops_ - last_rebalance_op_ < cfg_.min_rebalance_interval_ops) return refusal::throttled;
    if (!(o.free_fraction(donor) > cfg_.threshold_high)) return refusal::donor_busy;
    return refusal::none;
  }

  rebalancer_config cfg_;
  std::uint64_t ops_ = 0;
  std::uint64_t last_rebalance_op_ = 0;
  bool has_rebalanced_ = false;
  bool episode_active_ = false;
  pool_kind episode_recipient_ = pool_kind::kv;
  pressure_state state_ = pressure_state::balanced;
};

static_assert(rebalancer<threshold_rebalancer>);

/// Never moves capacity: a static split (the reference's avmp_static).
class no_rebalancer {
 public:
  void on_operation() noexcept { ++ops_; }
  pressure_state observe(const pool_occupancy&) noexcept { return state_; }
  migration_plan on_failure(pool_kind k, std::uint64_t, const pool_occupancy&) noexcept {
    return {k, 0, refusal::disabled};
  }
  migration_plan proactive(const pool_occupancy&) noexcept { return {pool_kind::kv, 0, refusal::disabled}; }
  void on_committed() noexcept {}
  void set_state(pressure_state s) noexcept { state_ = s; }
  [[nodiscard]] pressure_state state() const noexcept { return state_; }
  [[nodiscard]] std::uint64_t operations() const noexcept { return ops_; }

 private:
  std::uint64_t ops_ = 0;
  pressure_state state_ = pressure_state::balanced;
};

static_assert(rebalancer<no_rebalancer>);

}  // namespace hybridcache::memory
