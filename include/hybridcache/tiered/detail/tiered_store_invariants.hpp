// hybridcache/tiered/detail/tiered_store_invariants.hpp
//
// `tiered_store::check_invariants` (tiered/tiered_store.hpp), kept apart from the table's
// hot paths: O(total pages + entries), allocates; for tests and debugging. Included at the
// end of the table's header; not for direct use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

template <demotion_scorer Scorer>
std::string tiered_store<Scorer>::check_invariants() const {
  std::lock_guard lock(mu_);
  std::vector<std::vector<std::uint8_t>> owner(tiers_.size());
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    owner[t].assign(static_cast<std::size_t>(tiers_[t].alloc.capacity()), 0);
    std::int64_t free = 0;
    bool overlap = false;
    tiers_[t].alloc.for_each_free_run([&](page_run r) {
      free += r.count;
      for (std::uint32_t p = 0; p < r.count; ++p) overlap |= owner[t][r.first + p]++ != 0;
    });
    if (overlap) return "tier " + std::to_string(t) + ": free runs overlap";
    if (free != tiers_[t].alloc.free_pages()) return "tier " + std::to_string(t) + ": free page count mismatch";
  }
  std::vector<std::int64_t> evictable(tiers_.size(), 0), count(tiers_.size(), 0), indexed(tiers_.size(), 0);
  std::int64_t readers = 0, in_flight = 0;
  for (const auto& [id, e] : entries_) {
    if (e.id != id) return "entry id mismatch";
    if (e.copies.empty()) return "entry without a copy";
    for (std::size_t i = 0; i < e.copies.size(); ++i) {
      const tier_copy& c = e.copies[i];
      if (i > 0 && !(e.copies[i - 1].tier < c.tier)) return "copies not in ascending tier order";
      if (c.pages.size() != pages_for(c.bytes)) return "page count mismatch";
      if (c.pages.size() % e.segments != 0) return "pages do not divide into segments";
      if (c.pins < 0 || c.readers < 0) return "negative pin or reader count";
      if (c.state != copy_state::valid && (c.pins > 0 || c.readers > 0)) return "an invisible copy is in use";
      bool twice = false;
      c.pages.for_each_page([&](std::uint32_t p) {
        if (p < owner[c.tier.value].size()) twice |= owner[c.tier.value][p]++ != 0;
      });
      if (twice) return "tier " + std::to_string(c.tier.value) + ": a page is owned twice";
      count[c.tier.value] += 1;
      if (c.idle()) evictable[c.tier.value] += c.pages.size();
      readers += c.readers;
      in_flight += c.state == copy_state::filling;
    }
  }
  // A filling copy has one reader on its source (an extract reads another entry).
  if (readers != in_flight) return "reader counts disagree with the copies in flight";
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    for (auto c : owner[t])
      if (c != 1) return "tier " + std::to_string(t) + ": a page is " + (c == 0 ? "lost" : "owned twice");
    if (evictable[t] != tiers_[t].evictable_pages) return "evictable page counter mismatch";
    if (count[t] != tiers_[t].copies) return "copy counter mismatch";
    for (const auto& [k, id] : tiers_[t].index) {
      const auto it = entries_.find(id);
      const tier_copy* c = it == entries_.end() ? nullptr : it->second.in(tier_id{static_cast<std::uint8_t>(t)});
      if (c == nullptr || !c->idle()) return "index holds a copy that is not idle";
      indexed[t] += 1;
    }
  }
  std::int64_t idle = 0, in_index = 0;
  for (const auto& [id, e] : entries_)
    for (const auto& c : e.copies) idle += c.idle();
  for (auto n : indexed) in_index += n;
  if (idle != in_index) return "index misses an idle copy";
  return {};
}

}  // namespace hybridcache::tiered
