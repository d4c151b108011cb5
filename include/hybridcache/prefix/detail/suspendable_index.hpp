// hybridcache/prefix/detail/suspendable_index.hpp
//
// `detail::suspendable_index<Scorer>`: the suspend/resume half of a `rebuildable_scorer`
// (concepts/utility_scorer.hpp), for a scorer whose eviction index is a function of the
// live candidates and what its hooks stamp, so replaying `on_update` over the live nodes
// rebuilds it. A CRTP base: the scorer keeps its own index and supplies
// `clear_index()` (empties it; a friend may call it) and `on_update(tree, n)` (which must
// do nothing but stamp while `suspended_` is set).
//
// Costs: suspend_index / index_suspended O(1); resume_index O(clear_index) plus
// O(id_bound) liveness checks and one on_update per live node.
#pragma once

#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix::detail {

/// The suspend/resume upkeep switch of a scorer's index. See the file comment.
template <class Scorer>
class suspendable_index {
 public:
  /// Stops the index's upkeep: the hooks only stamp until resume_index. select_victim must
  /// not be called meanwhile. O(1).
  void suspend_index() noexcept { suspended_ = true; }
  /// Rebuilds the index from `tree` (every live candidate at its time) and resumes its
  /// upkeep. See the file comment for the cost.
  template <class Tree>
  void resume_index(const Tree& tree) noexcept {
    auto& self = static_cast<Scorer&>(*this);
    self.clear_index();
    suspended_ = false;
    for (node_id n = 0; n < tree.id_bound(); ++n)  // the root is never a candidate
      if (tree.live(n)) self.on_update(tree, n);
  }
  /// True while the index is suspended.
  [[nodiscard]] bool index_suspended() const noexcept { return suspended_; }

 protected:
  bool suspended_ = false;
};

}  // namespace hybridcache::prefix::detail
