// hybridcache/tiered/copy_plan.hpp
//
// Turning a move ticket into as few, as large copies as possible. A ticket lists source
// and destination pages (in the entry's logical order); pages adjacent in both lists merge into one
// transfer. Each copy call costs a fixed ~5-7 µs on a real link (anchors/multitier.md
// §4.1: 64 KiB pieces drop an H100's PCIe copy rate from ~50 to ~9 GB/s), so the page
// allocator hands out adjacent pages and this planner merges them; `min_transfer_bytes`
// (0.5 MiB by default, vLLM's block size after its re-layout) is the size below which a
// transfer counts as "small" in the statistics a caller reports.
//
// Shared by host_copy_engine.hpp and cuda/copy_engine.cuh. O(pages) time, one allocation.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/concepts/copy_engine.hpp"

namespace hybridcache::tiered {

/// The two copy streams of an engine: towards slower tiers (offload, D2H) and towards HBM
/// (onboard, H2D).
enum class copy_stream : std::uint8_t { offload = 0, onboard = 1 };

/// The stream a ticket's copies go on: offload when the destination is slower; onboard
/// otherwise, a copy inside one tier included (a joined load handed to a request). A group
/// (`grouped_copy_engine`) must keep to one.
[[nodiscard]] constexpr copy_stream stream_for(const move_ticket& t) noexcept {
  return t.dst.value > t.src.value ? copy_stream::offload : copy_stream::onboard;
}

/// One contiguous copy: byte offsets into the source and destination tiers' arenas.
struct copy_span {
  std::int64_t src_offset = 0;
  std::int64_t dst_offset = 0;
  std::int64_t bytes = 0;
};

/// The copy engine of a simulator: the store holds metadata only, so every move "copies"
/// nothing and succeeds at once.
struct metadata_only_copies {
  struct event {
    std::int32_t segments = 1;
  };
  [[nodiscard]] expected<event> submit(const move_ticket& t) noexcept { return event{t.segments}; }
  [[nodiscard]] bool query(event) const noexcept { return true; }
  [[nodiscard]] expected<void> wait(event) noexcept { return {}; }
  /// Every segment is in place at once (nothing is copied).
  [[nodiscard]] std::int32_t landed_segments(event e) const noexcept { return e.segments; }
  [[nodiscard]] expected<void> wait_segments(event e, std::int32_t n) noexcept {
    if (n < 0 || n > e.segments) return unexpected(errc::invalid_argument);
    return {};
  }
  /// A group: every ticket's event, all in place at once. invalid_argument for sizes that
  /// differ or tickets of both directions (nothing written).
  [[nodiscard]] expected<void> submit_group(std::span<const move_ticket> tickets, std::span<event> events) noexcept {
    if (tickets.size() != events.size()) return unexpected(errc::invalid_argument);
    for (const move_ticket& t : tickets)
      if (stream_for(t) != stream_for(tickets.front())) return unexpected(errc::invalid_argument);
    for (std::size_t k = 0; k < tickets.size(); ++k) events[k] = event{tickets[k].segments};
    return {};
  }
};
static_assert(grouped_copy_engine<metadata_only_copies> && !paged_copy_engine<metadata_only_copies>);

/// Transfers below this size count as small (per-call overhead dominates).
inline constexpr std::int64_t default_min_transfer_bytes = std::int64_t{512} * 1024;

/// Coalesces the logical pages [first, first + n) of a ticket into copies: pages adjacent
/// in both lists merge. Copies at most `limit` bytes from the front of that range.
[[nodiscard]] inline std::vector<copy_span> plan_page_range(const move_ticket& t, std::int64_t page_bytes,
                                                            std::int64_t first, std::int64_t n, std::int64_t limit) {
  std::vector<copy_span> out;
  const page_list src = t.src_pages.slice(first, n);
  const page_list dst = t.dst_pages.slice(first, n);
  const auto sr = src.runs();
  const auto dr = dst.runs();
  std::size_t i = 0, j = 0;
  std::int64_t si = 0, dj = 0;  // pages used of the current source / destination run
  while (i < sr.size() && j < dr.size() && limit > 0) {
    const std::int64_t k = std::min<std::int64_t>(sr[i].count - si, dr[j].count - dj);
    const std::int64_t b = std::min(limit, k * page_bytes);
    const std::int64_t s = (static_cast<std::int64_t>(sr[i].first) + si) * page_bytes;
    const std::int64_t d = (static_cast<std::int64_t>(dr[j].first) + dj) * page_bytes;
    if (!out.empty() && out.back().src_offset + out.back().bytes == s && out.back().dst_offset + out.back().bytes == d)
      out.back().bytes += b;
    else
      out.push_back({s, d, b});
    limit -= b;
    si += k;
    dj += k;
    if (si == sr[i].count) ++i, si = 0;
    if (dj == dr[j].count) ++j, dj = 0;
  }
  return out;
}

/// Coalesces a ticket's pages into copies. Moves `min(src_bytes, dst_bytes)` bytes: a
/// sparsifying mover that stores fewer bytes compacts first and copies the prefix.
[[nodiscard]] inline std::vector<copy_span> plan_copies(const move_ticket& t, std::int64_t page_bytes) {
  const std::int64_t bytes = t.dst_bytes < t.src_bytes ? t.dst_bytes : t.src_bytes;
  return plan_page_range(t, page_bytes, 0, t.dst_pages.size(), bytes);
}

/// The copies of layer segment `s` of a ticket (a full-size copy: segments split the pages
/// evenly), so an engine can copy and signal layer by layer.
[[nodiscard]] inline std::vector<copy_span> plan_segment_copies(const move_ticket& t, std::int64_t page_bytes,
                                                                std::int32_t s) {
  const std::int64_t per = t.dst_pages.size() / (t.segments > 0 ? t.segments : 1);
  return plan_page_range(t, page_bytes, s * per, per, per * page_bytes);
}

/// The copies of a ticket laid out layer by layer, for an engine that signals each layer:
/// every segment's copies (coalesced within it, never across), and after which span each
/// segment ends. Empty `ends` when the copy does not split into its segments (one segment, a
/// sparsified copy, pages that do not divide evenly): then `spans` is `plan_copies`.
struct layered_copies {
  std::vector<copy_span> spans;
  std::vector<std::size_t> ends;  ///< segment i ends after spans[ends[i] - 1]
};
/// Whether `ends` can mark the segment boundaries of `spans` copies: ascending, each at most
/// `spans`, the last one `spans` (empty: one segment, the whole job).
[[nodiscard]] inline bool valid_segment_ends(const std::vector<std::size_t>& ends, std::size_t spans) noexcept {
  for (std::size_t i = 0; i < ends.size(); ++i)
    if (ends[i] > spans || (i > 0 && ends[i] < ends[i - 1])) return false;
  return ends.empty() || ends.back() == spans;
}
[[nodiscard]] inline layered_copies plan_layered_copies(const move_ticket& t, std::int64_t page_bytes) {
  const auto pages = static_cast<std::int64_t>(t.dst_pages.size());
  const bool layered = t.segments > 1 && t.src_bytes == t.dst_bytes && t.dst_bytes == pages * page_bytes &&
                       static_cast<std::int64_t>(t.src_pages.size()) == pages && pages % t.segments == 0;
  layered_copies out;
  if (!layered) {
    out.spans = plan_copies(t, page_bytes);
    return out;
  }
  out.ends.reserve(static_cast<std::size_t>(t.segments));
  for (std::int32_t g = 0; g < t.segments; ++g) {
    const auto seg = plan_segment_copies(t, page_bytes, g);
    out.spans.insert(out.spans.end(), seg.begin(), seg.end());
    out.ends.push_back(out.spans.size());
  }
  return out;
}

/// One issued layer segment of one ticket of a group (`grouped_copy_engine`): ticket
/// `part`'s planned segment `segment` (a plan without `ends` has one, the whole copy).
struct group_step {
  std::uint32_t part = 0;
  std::int32_t segment = 0;
};
/// The order a grouped engine issues a group's segments in: by the fraction of its ticket
/// each one completes, (segment + 1) / segments, ties by ticket order. Tickets of equal
/// segment counts go layer-major (layer 0 of every ticket, then layer 1, ...); a ticket of
/// fewer segments (a checkpoint of R recurrent layers beside KV of A attention layers)
/// advances in proportion, so a model that interleaves its layers evenly gets its early
/// layers of every entry first; and each ticket's last segment comes in ticket order (its
/// job completes in submission order). O(N log N) in the N segments, one allocation.
[[nodiscard]] inline std::vector<group_step> interleave_segments(const std::vector<layered_copies>& plans) {
  std::vector<group_step> steps;
  std::size_t total = 0;
  for (const auto& p : plans) total += std::max<std::size_t>(p.ends.size(), 1);
  steps.reserve(total);
  for (std::size_t k = 0; k < plans.size(); ++k)
    for (std::size_t g = 0; g < std::max<std::size_t>(plans[k].ends.size(), 1); ++g)
      steps.push_back({static_cast<std::uint32_t>(k), static_cast<std::int32_t>(g)});
  auto count = [&](const group_step& x) { return static_cast<std::int64_t>(std::max<std::size_t>(plans[x.part].ends.size(), 1)); };
  std::sort(steps.begin(), steps.end(), [&](const group_step& a, const group_step& b) {
    const std::int64_t l = (a.segment + 1) * count(b), r = (b.segment + 1) * count(a);  // exact: no division
    return l != r ? l < r : a.part < b.part;
  });
  return steps;
}

/// The spans of step `g` of `plan` ([first, last) of plan.spans).
[[nodiscard]] inline std::pair<std::size_t, std::size_t> segment_span_range(const layered_copies& plan, std::int32_t g) noexcept {
  if (plan.ends.empty()) return {0, plan.spans.size()};
  const auto i = static_cast<std::size_t>(g);
  return {i == 0 ? 0 : plan.ends[i - 1], plan.ends[i]};
}

/// Modelled time of a list of copies over a link: Σ (per-copy overhead + bytes / bandwidth).
[[nodiscard]] inline double transfer_seconds(const std::vector<copy_span>& spans, double link_gbps,
                                             double per_copy_overhead_s = 6e-6) {
  double s = 0.0;
  for (const auto& c : spans) s += per_copy_overhead_s + static_cast<double>(c.bytes) / (link_gbps * 1e9);
  return s;
}

}  // namespace hybridcache::tiered
