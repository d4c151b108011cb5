// hybridcache/core/logical_clock.hpp
//
// A deterministic logical clock. Simulations and replays use it instead of wall time so
// that every run of the same trace makes the same decisions (the Marconi reference ticks
// once per match, insert and evict; AVMP's reference counts allocator operations).
#pragma once

#include <concepts>
#include <cstdint>

namespace hybridcache {

/// Monotone counter. `tick()` advances and returns the new time; `now()` reads it.
/// Cost: O(1), no allocation, not thread-safe (wrap it in the cache's lock policy).
class logical_clock {
 public:
  using time_point = std::uint64_t;

  constexpr logical_clock() noexcept = default;
  constexpr explicit logical_clock(time_point start) noexcept : now_(start) {}

  [[nodiscard]] constexpr time_point now() const noexcept { return now_; }
  constexpr time_point tick() noexcept { return ++now_; }
  /// Advance by `n` steps (used when one external event stands for several).
  constexpr time_point advance(time_point n) noexcept { return now_ += n; }

 private:
  time_point now_ = 0;
};

/// A clock the caches can read: `now()` and `tick()` returning an unsigned time point.
template <class C>
concept clock_source = requires(C c, const C cc) {
  { cc.now() } -> std::convertible_to<std::uint64_t>;
  { c.tick() } -> std::convertible_to<std::uint64_t>;
};

static_assert(clock_source<logical_clock>);

}  // namespace hybridcache
