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

namespace hybridcache::stores::detail {

template <class Store, class Tree>
std::string check_tiered_invariants(const Store& st, const Tree& tree) {
  using role = typename Store::role;
  using kind = typename Store::kind;
  if (auto s = st.store_->check_invariants(); !s.empty()) return "table: " + s;
  std::int64_t tree_bytes = 0, staged = 0, draining = 0;
  std::size_t in_table = 0, tree_entries = 0;
  for (const auto& [id, e] : st.meta_) {
    const auto row = st.store_->find(id);
    if (!row) {
      if (e.r == role::staged && e.failed) continue;  // kept until its hits let go
      if (e.r == role::staged && e.pending_src != no_entry) {  // a join waiting for its source
        staged += e.pending_bytes;
        continue;
      }
      return "entry " + to_string(id) + " lost from the table";
    }
    ++in_table;
    const tier_copy* hbm = row->in(hbm_tier);
    switch (e.r) {
      case role::tree:
        if (hbm == nullptr || hbm->state != copy_state::valid) return "a tree entry has no valid HBM copy";
        if (hbm->bytes != st.bytes_of(e)) return "a tree entry's HBM copy has the wrong size";
        tree_bytes += st.bytes_of(e);
        ++tree_entries;
        break;
      case role::staged:
        if (hbm == nullptr || row->copies.size() != 1) return "a staged entry is not (only) in HBM";
        if (e.holds == 0 && !e.claimable && hbm->idle()) return "a staged entry no hit holds";
        if (e.holds > 1) return "a staged entry held by two hits";
        staged += hbm->bytes;
        break;
      case role::free: {
        if (!e.named) return "a free entry without a name";
        const auto& keys = e.k == kind::kv ? st.kv_keys_ : st.ckpt_keys_;
        const auto it = keys.find(e.key);
        if (it == keys.end() || it->second != id) return "a free entry not indexed by its key";
        if (hbm != nullptr) draining += st.bytes_of(e);
        break;
      }
    }
  }
  if (in_table != st.store_->size()) return "the table holds entries the store does not know";
  if (tree_bytes != st.used_) return "tree bytes disagree with used_bytes()";
  if (staged != st.staged_used_ || st.staged_used_ > st.staging_capacity_)
    return "staged bytes disagree or exceed the staging room";
  if (draining != st.draining_) return "draining bytes disagree";
  for (const auto* keys : {&st.kv_keys_, &st.ckpt_keys_})
    for (const auto& [key, id] : *keys) {
      const auto it = st.meta_.find(id);
      if (it == st.meta_.end() || it->second.r != role::free || it->second.key != key) return "a key names no free entry";
    }
  // Every tree handle is a tree-role entry, and every tree-role entry is a tree handle.
  std::size_t handles = 0;
  for (node_id n = 1; n < tree.id_bound(); ++n) {
    if (!tree.live(n)) continue;
    const auto& nd = tree.at(n);
    const std::array<entry_id, 2> ids{nd.kv.id, nd.has_checkpoint ? nd.checkpoint.id : no_entry};
    for (entry_id id : ids) {
      if (id == no_entry) continue;
      const auto it = st.meta_.find(id);
      if (it == st.meta_.end() || it->second.r != role::tree) return "a tree handle is not a tree entry";
      ++handles;
    }
    if (nd.kv.tokens != nd.edge()) return "a node's extent length differs from its edge";
  }
  if (handles != tree_entries) return "the store holds tree entries the tree does not";
  return {};
}

}  // namespace hybridcache::stores::detail
