// hybridcache/stores/detail/tiered_state_invariants.hpp
//
// The consistency check of a `tiered_state_store` (its `check_invariants`), kept apart from
// the store's hot paths: O(entries + tree nodes), allocates, for tests and debugging.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/stores/tiered_state_types.hpp"

namespace hybridcache::tiered::detail {

template <class Store, class Tree>
std::string check_tiered_invariants(const Store& st, const Tree& tree) {
    if (auto s = st.store_->check_invariants(); !s.empty()) return "table: " + s;
    if (st.meta_.size() != st.store_->size()) return "metadata and table disagree on the entry count";
    std::int64_t hbm = 0, host = 0, staged = 0;
    std::size_t staged_entries = 0;
    std::unordered_map<std::uint64_t, int> kv_keys, ck_keys;
    for (const auto& [id, e] : st.meta_) {
      const auto where = st.store_->locate(id);
      if (!where) return "entry " + to_string(id) + " lost from the table";
      const std::int64_t b = st.bytes_of(e);
      if ((where->first == hbm_tier) != (e.where != Store::place::host)) return "an entry is not in the tier it claims";
      if (e.where == Store::place::hbm) {
        hbm += b;
      } else if (e.where == Store::place::staged) {
        staged += b;
        ++staged_entries;
      } else {
        host += b;
        const auto& map = e.k == Store::kind::kv ? st.host_kv_ : st.host_ckpt_;
        const auto it = map.find(e.key);
        if (!e.named || it == map.end() || it->second != id) return "host entry not indexed by its key";
      }
      // A key lives once per tier. Across tiers it may live twice while requests are in
      // flight: HBM named a state that another request's hit held pinned (or staged) in the
      // host tier; the host copy holds the same bytes (content keys) and goes when that hit
      // lets go (`superseded`), or stays as a clean replica when it returns from staging.
      if (e.named) {
        auto& keys = e.k == Store::kind::kv ? kv_keys : ck_keys;
        const int bit = e.where == Store::place::host ? 2 : 1;
        if ((keys[e.key] & bit) != 0) return "a key is held twice in one tier";
        keys[e.key] |= bit;
      }
    }
    if (hbm != st.used_) return "HBM bytes disagree with used_bytes()";
    if (host != st.host_used_) return "host bytes disagree with host_used_bytes()";
    if (staged != st.staged_used_ || st.staged_used_ > st.staging_capacity_) return "staged bytes disagree or exceed the staging room";
    if (st.host_kv_.size() + st.host_ckpt_.size() != static_cast<std::size_t>(st.store_->usage(st.host_tier).entries))
      return "host index and host tier disagree";
    // Every tree handle is a live HBM entry, and the tree holds all HBM entries but the staged.
    std::int64_t tree_bytes = 0;
    std::size_t tree_entries = 0;
    for (prefix::node_id n = 1; n < tree.id_bound(); ++n) {
      if (!tree.live(n)) continue;
      const auto& nd = tree.at(n);
      const std::array<entry_id, 2> ids{nd.kv.id, nd.has_checkpoint ? nd.checkpoint.id : no_entry};
      for (entry_id id : ids) {
        if (id == no_entry) continue;
        const auto it = st.meta_.find(id);
        if (it == st.meta_.end() || it->second.where != Store::place::hbm) return "a tree handle is not in HBM";
        tree_bytes += st.bytes_of(it->second);
        ++tree_entries;
      }
      if (nd.kv.tokens != nd.edge()) return "a node's extent length differs from its edge";
    }
    if (tree_bytes != st.used_ ||
        static_cast<std::int64_t>(tree_entries + staged_entries) != st.store_->usage(hbm_tier).entries)
      return "HBM holds entries the tree does not own";
    const auto& c = st.counters_;
    if (c.demoted_entries != static_cast<std::int64_t>(st.host_kv_.size() + st.host_ckpt_.size() + staged_entries) +
                                 c.promoted_entries + c.dropped_entries)
      return "demoted entries not accounted for (host + staged + promoted + dropped)";
    return {};
  }

}  // namespace hybridcache::tiered::detail
