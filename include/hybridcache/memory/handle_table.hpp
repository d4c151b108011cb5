// hybridcache/memory/handle_table.hpp
//
// The virtual handle table of the memory pools: `packed_handle` (pool tag, index,
// generation) -> physical unit index, in O(1).
//
// Built on `generation_table` (core/handle.hpp): each live handle owns one slot, the slot
// stores the unit it currently names, and freeing bumps the slot's generation, so stale
// handles, double frees and handles of another table are reported instead of ignored
// (the AVMP reference silently skips all three). Because callers hold handles, never unit
// indices, a unit can move (compaction) by rewriting one table entry.
//
// Costs: insert, resolve, erase, relocate O(1), allocation-free after construction.
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

#include "hybridcache/concepts/handle_table.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache::memory {

/// Generation-checked table from handles to unit indices.
class unit_handle_table {
 public:
  /// Table issuing handles tagged `pool_tag` for at most `capacity` live units.
  /// @throws invalid_argument if pool_tag > 255 or capacity >= 2^32.
  unit_handle_table(std::uint32_t pool_tag, std::uint64_t capacity) : slots_(pool_tag, capacity) {
    unit_of_.assign(capacity, 0);
  }

  /// Issues a handle naming `unit`. O(1). errc::out_of_capacity when the table is full.
  [[nodiscard]] expected<packed_handle> insert(std::uint32_t unit) noexcept {
    auto h = slots_.acquire();
    if (h) unit_of_[h->index()] = unit;
    return h;
  }

  /// The unit `h` names. O(1). stale_handle / double_free / foreign_handle otherwise.
  [[nodiscard]] expected<std::uint32_t> resolve(packed_handle h) const noexcept {
    const errc e = slots_.validate(h);
    if (e != errc::ok) return unexpected(e);
    return unit_of_[h.index()];
  }

  /// Retires `h` and returns the unit it named. O(1). A bad handle changes nothing.
  [[nodiscard]] expected<std::uint32_t> erase(packed_handle h) noexcept {
    const errc e = slots_.validate(h);
    if (e != errc::ok) return unexpected(e);
    const std::uint32_t unit = unit_of_[h.index()];
    (void)slots_.release(h);
    return unit;
  }

  /// Checks `h` without changing anything. O(1).
  [[nodiscard]] errc validate(packed_handle h) const noexcept { return slots_.validate(h); }

  /// Points live slot `index` (a handle's index()) at `unit` (compaction). O(1).
  void relocate(std::uint32_t index, std::uint32_t unit) noexcept { unit_of_[index] = unit; }

  [[nodiscard]] std::uint64_t live_count() const noexcept { return slots_.live_count(); }
  [[nodiscard]] std::uint64_t capacity() const noexcept { return slots_.capacity(); }
  [[nodiscard]] std::uint32_t pool_tag() const noexcept { return slots_.pool_tag(); }

 private:
  generation_table slots_;
  std::vector<std::uint32_t> unit_of_;
};

static_assert(handle_table<unit_handle_table>);

}  // namespace hybridcache::memory
