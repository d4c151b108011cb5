// hybridcache/tiered/page_state.hpp
//
// The state machine of one copy of a cache-table entry. Every transition a copy may take
// is listed in one table (`next_state`); the store refuses any other, so the races the
// TensorRT-LLM transfer manager fixed by hand ("two blocks offloaded to the same secondary
// block in a single step", "partial reuse copying from a block that is being onboarded")
// cannot be expressed:
//
//   insert(writing) ─► writing ──publish──┐
//        insert                          ▼         pin / unpin, read_begin / read_end
//   ──────────────────────────────────► valid ◄──────────────────────────────────┐
//                                        │ └──────────────────────────────────────┘
//   prepare_* (a copy into a new tier) ─► filling ──complete_ok──► valid
//                                        └──complete_fail──► (gone: pages freed)
//   drop: a valid copy with no pin and no reader goes (the entry goes with its last copy)
//
// What the table encodes:
// - A copy in flight leaves its source `valid`: the source stays readable and pinnable
//   (a hit on an entry being offloaded is not lost); only `drop` waits for its readers.
// - A `filling` copy is invisible: it cannot be pinned, read, dropped or copied from until
//   its copy completes; a second copy into the same tier is refused (join the first).
// - `writing`: the request is still producing the bytes; nobody may pin, copy or pick it.
//
// Counts (pins, readers) are checked by the store next to the table: `drop` needs both 0.
// All functions are constexpr and O(1).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/enum_names.hpp"

namespace hybridcache::tiered {

/// Events that drive a copy's state machine.
enum class page_event : std::uint8_t {
  pin,            ///< a request starts reading the copy (pins + 1)
  unpin,          ///< a request stops reading it (pins - 1)
  read_begin,     ///< a copy into another tier starts reading it (readers + 1)
  read_end,       ///< that copy landed or failed (readers - 1)
  complete_ok,    ///< the copy filling it landed: it is valid
  complete_fail,  ///< the copy filling it failed: it goes, its pages are freed
  drop,           ///< the copy leaves its tier (needs no pin and no reader)
  publish,        ///< the writer finished: the copy becomes valid
};

[[nodiscard]] constexpr std::string_view to_string(copy_state s) noexcept {
  constexpr std::array<std::string_view, 3> names{"valid", "filling", "writing"};
  static_assert(names_every_enumerator(names, copy_state::writing));
  return enum_name(s, names);
}

[[nodiscard]] constexpr std::string_view to_string(page_event e) noexcept {
  constexpr std::array<std::string_view, 8> names{"pin", "unpin", "read_begin", "read_end", "complete_ok",
    "complete_fail", "drop", "publish"};
  static_assert(names_every_enumerator(names, page_event::publish));
  return enum_name(e, names);
}

/// Result of applying an event: whether it is allowed, and the state after it. `drop` and
/// `complete_fail` leave `to` unspecified (the copy no longer exists).
struct page_transition {
  bool allowed = false;
  copy_state to = copy_state::valid;
};

/// The complete transition table. Anything not listed is refused.
[[nodiscard]] constexpr page_transition next_state(copy_state from, page_event ev) noexcept {
  switch (from) {
    case copy_state::valid:
      switch (ev) {
        case page_event::pin:
        case page_event::unpin:
        case page_event::read_begin:
        case page_event::read_end:
        case page_event::drop: return {true, copy_state::valid};
        default: return {};
      }
    case copy_state::filling:
      switch (ev) {
        case page_event::complete_ok: return {true, copy_state::valid};
        case page_event::complete_fail: return {true, copy_state::filling};
        default: return {};
      }
    case copy_state::writing:
      switch (ev) {
        case page_event::publish: return {true, copy_state::valid};
        case page_event::drop: return {true, copy_state::writing};  // the writer aborts
        default: return {};
      }
  }
  return {};
}

}  // namespace hybridcache::tiered
