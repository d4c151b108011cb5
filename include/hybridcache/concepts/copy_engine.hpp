// hybridcache/concepts/copy_engine.hpp
//
// `tier_copy_engine`: what moves an entry's bytes between two tiers of the tiered store,
// and `move_ticket`, the move it is handed. Models: metadata_only_copies
// (tiered/copy_plan.hpp), host_copy_engine (tiered/host_copy_engine.hpp),
// tiered::copy_engine (tiered/cuda/copy_engine.cuh).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache {

/// A copy in flight: returned by `tiered_store::prepare_move` / `prepare_copy` /
/// `prepare_extract`, consumed by `complete_move`. It fills the copy of entry `id` in tier
/// `dst` from the copy of entry `src_id` in tier `src` (the same entry, except an extract).
/// Page lists are in logical order, layer-major: `segments` equal segments, segment s
/// being layer s, so an engine may copy (and signal) layer by layer.
struct move_ticket {
  entry_id id{};
  entry_id src_id{};
  tier_id src{};
  tier_id dst{};
  std::int64_t src_bytes = 0;  ///< bytes read from the source
  std::int64_t dst_bytes = 0;  ///< bytes stored at the destination (fewer when sparsified)
  page_list src_pages;         ///< the pages read, logical order
  page_list dst_pages;         ///< the pages written (fresh), logical order
  std::int32_t segments = 1;   ///< layer segments of both page lists
  std::uint64_t seq = 0;       ///< must match the destination copy's sequence number
  bool drop_source = false;    ///< a move: the source copy is dropped when the copy lands (if idle)
};

/// What copies an entry's bytes between tiers: `submit(ticket)` enqueues the copies of a
/// prepared move and returns an event or an error; `query(event)` says, without blocking,
/// whether they ran; `wait(event)` blocks until they ran and reports a failed copy.
/// Modelled by `host_copy_engine`, `tiered::copy_engine`, `metadata_only_copies` and the
/// simulator's timed engine (sim/timed_copy_engine.hpp).
template <class E>
concept tier_copy_engine = requires(E& e, const move_ticket& t) {
  { e.submit(t).has_value() } -> std::convertible_to<bool>;
  { e.query(*e.submit(t)) } -> std::convertible_to<bool>;
  { e.wait(*e.submit(t)) } -> std::same_as<expected<void>>;
};

/// A copy engine that also reports a job's progress layer by layer, so a runtime can
/// compute layer l while later layers are still being copied (layer-wise loading).
/// `landed_segments(event)` says, without blocking, how many leading layer segments of the
/// job's ticket are in place (all of them, `ticket.segments`, once the job ran successfully;
/// a failed job counts the segments that landed before the failure); `wait_segments(event,
/// n)` blocks until the first n segments are in place and reports `busy` when the job failed
/// before them, `invalid_argument` for n outside [0, event's segments]. An engine may land a
/// job's segments all at once (a copy that is not segment-aligned, such as a sparsified one,
/// always does).
template <class E>
concept layered_copy_engine = tier_copy_engine<E> && requires(E& e, const move_ticket& t, std::int32_t n) {
  { e.landed_segments(*e.submit(t)) } -> std::convertible_to<std::int32_t>;
  { e.wait_segments(*e.submit(t), n) } -> std::same_as<expected<void>>;
};

/// A layered engine that also takes several tickets as one group and lands their layer
/// segments interleaved (layer 0 of every ticket before layer 1 of any, in proportion when
/// segment counts differ: `interleave_segments` in tiered/copy_plan.hpp), so that a hit
/// made of several entries has its first layers complete early, not the whole of the first
/// entry first. `submit_group(tickets, events)` writes ticket k's event to events[k] (each
/// event as from `submit`: its own `query`, `wait`, `landed_segments`, `wait_segments`);
/// every ticket of a group goes the same direction (all towards HBM, or all away), else
/// `invalid_argument`. All or nothing: on an error nothing was submitted and `events` is
/// as it was. `events.size()` must equal `tickets.size()`. `copy_event_of<E>`: the event type.
template <class E>
using copy_event_of = std::remove_cvref_t<decltype(*std::declval<E&>().submit(std::declval<const move_ticket&>()))>;
template <class E>
concept grouped_copy_engine =
    layered_copy_engine<E> && requires(E& e, std::span<const move_ticket> tickets, std::span<copy_event_of<E>> events) {
      { e.submit_group(tickets, events) } -> std::same_as<expected<void>>;
    };

/// An engine laid out for a store's pages: `page_bytes()` is the page size its copies
/// address; the tiered state store refuses an engine whose page is not its own.
template <class E>
concept paged_copy_engine = tier_copy_engine<E> && requires(const E& ce) {
  { ce.page_bytes() } -> std::convertible_to<std::int64_t>;
};

/// A paged engine that owns each tier's memory (an arena per tier): `arena_bytes(tier)` is
/// that arena's size; the tiered state store refuses an engine whose arena is smaller than
/// the tier (host_copy_engine, tiered::copy_engine).
template <class E>
concept arena_copy_engine = paged_copy_engine<E> && requires(const E& ce, tier_id t) {
  { ce.arena_bytes(t) } -> std::convertible_to<std::int64_t>;
};

}  // namespace hybridcache
