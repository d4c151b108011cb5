// hybridcache/tiered/page_state.hpp
//
// The state machine of a cache-table entry. Every transition an entry may take is listed
// in one table (`next_state`); the store refuses any other, so the races the TensorRT-LLM
// transfer manager fixed by hand ("two blocks offloaded to the same secondary block in a
// single step", "partial reuse copying from a block that is being onboarded") cannot be
// expressed: an entry whose copy is in flight is neither evicted, nor pinned, nor moved
// again until the copy completes (successfully or not).
//
//   insert(writing) ─► writing ─publish─┐
//        insert                 ▼     prepare_move                complete_move(ok)
//   ───────────► resident ─────────────────────► moving ───────────────────────► resident
//                 │  ▲  ▲                          │        (home = destination)   (new tier)
//          pin    │  │  │   complete_move(failed)  │
//                 ▼  │  └──────────────────────────┘  (home unchanged, reservation freed)
//                pinned  (pin count > 0; unpin to 0 returns to resident)
//
//   writing: the node's request is still producing its bytes; nobody may pin, copy or
//   pick it until `publish`. erase: from resident, or from writing (the writer aborts).
//
// All functions are constexpr and O(1).
#pragma once

#include <cstdint>
#include <string_view>

#include "hybridcache/concepts/tier_entry.hpp"

namespace hybridcache::tiered {

/// Events that drive the state machine.
enum class page_event : std::uint8_t {
  pin,            ///< a request starts using the entry (pin count + 1)
  unpin_last,     ///< the last pin is released (pin count 1 -> 0)
  unpin_more,     ///< a pin is released and others remain (pin count > 1)
  prepare_move,   ///< a copy to another tier is issued (destination reserved)
  complete_ok,    ///< the copy finished; the entry now lives at the destination
  complete_fail,  ///< the copy failed; destination released, the entry stays at its source
  erase,          ///< the entry is dropped from the cache
  publish,        ///< the writer finished: the entry becomes usable
};

[[nodiscard]] constexpr std::string_view to_string(page_state s) noexcept {
  switch (s) {
    case page_state::resident: return "resident";
    case page_state::pinned: return "pinned";
    case page_state::moving: return "moving";
    case page_state::writing: return "writing";
  }
  return "unknown";
}

[[nodiscard]] constexpr std::string_view to_string(page_event e) noexcept {
  switch (e) {
    case page_event::pin: return "pin";
    case page_event::unpin_last: return "unpin_last";
    case page_event::unpin_more: return "unpin_more";
    case page_event::prepare_move: return "prepare_move";
    case page_event::complete_ok: return "complete_ok";
    case page_event::complete_fail: return "complete_fail";
    case page_event::erase: return "erase";
    case page_event::publish: return "publish";
  }
  return "unknown";
}

/// Result of applying an event: whether it is allowed, and the state after it. `erase`
/// leaves `to` unspecified (the entry no longer exists).
struct page_transition {
  bool allowed = false;
  page_state to = page_state::resident;
};

/// The complete transition table. Anything not listed is refused.
[[nodiscard]] constexpr page_transition next_state(page_state from, page_event ev) noexcept {
  switch (from) {
    case page_state::resident:
      switch (ev) {
        case page_event::pin: return {true, page_state::pinned};
        case page_event::prepare_move: return {true, page_state::moving};
        case page_event::erase: return {true, page_state::resident};
        default: return {};
      }
    case page_state::pinned:
      switch (ev) {
        case page_event::pin: return {true, page_state::pinned};
        case page_event::unpin_more: return {true, page_state::pinned};
        case page_event::unpin_last: return {true, page_state::resident};
        default: return {};
      }
    case page_state::moving:
      switch (ev) {
        case page_event::complete_ok: return {true, page_state::resident};
        case page_event::complete_fail: return {true, page_state::resident};
        default: return {};
      }
    case page_state::writing:
      switch (ev) {
        case page_event::publish: return {true, page_state::resident};
        case page_event::erase: return {true, page_state::writing};
        default: return {};
      }
  }
  return {};
}

/// True when an entry in state `s` may be chosen as an eviction/demotion victim.
[[nodiscard]] constexpr bool evictable(page_state s) noexcept { return s == page_state::resident; }

}  // namespace hybridcache::tiered
