// hybridcache/concepts/admission.hpp
//
// `admission_policy`: which token positions of a committed sequence keep an SSM state,
// and `insertion_view`, what the policy sees. Models: prefix/admission.hpp.
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

namespace hybridcache {

/// What speculative insertion knows about a sequence before it is committed. Positions
/// count tokens from the start of the sequence (position p = the state after token p).
struct insertion_view {
  std::int64_t input_tokens = 0;     ///< length of the request's input (prompt)
  std::int64_t total_tokens = 0;     ///< input + output: what `commit` inserts
  std::int64_t reusable_tokens = 0;  ///< where prefill started (joint-min match of the input)
  std::int64_t common_prefix = 0;    ///< longest common prefix of the sequence with the tree
  /// The position where inserting the sequence splits an existing edge (the "branch
  /// point" of Marconi's speculative insertion), or 0 when the insert does not split an edge.
  std::int64_t branch_point = 0;
  /// The position where the input leaves a cached sequence found only below HBM (a lower
  /// tier's KV reach beyond the tree), or 0: the branch point the tree would have shown had
  /// that sequence stayed in HBM. Set at plan time by a runtime with a lower-tier store.
  std::int64_t lower_branch_point = 0;
};

/// Chooses the positions whose SSM state a committed sequence keeps.
///
/// The cache calls `a.select(view, out)` once per `plan` and per `commit` with `out`
/// empty; the policy appends positions in (view.reusable_tokens, view.total_tokens]
/// (only states that this request's prefill or decode actually computed), in any order
/// (the cache sorts and de-duplicates). Application-directed positions are merged in by the
/// cache afterwards. `out` keeps its capacity across calls, so steady state allocates nothing.
/// A position the policy returns that lies inside an existing edge splits it; one at an
/// existing node end without a checkpoint gives that node one.
template <class A>
concept admission_policy = requires(const A& a, const insertion_view& v, std::vector<std::int64_t>& out) {
  { a.select(v, out) } noexcept -> std::same_as<void>;
};

/// Says how many positions `select(v, out)` appends at most: `a.max_positions(v)`. The cache
/// reserves that much room before select instead of one slot per token of the sequence
/// (and sizes the scratch that follows the positions by it), so a policy that keeps a
/// handful of states does not make every cache hold ~25 B per token of its longest
/// sequence. Default (no max_positions): one per token.
template <class A>
concept bounded_admission = admission_policy<A> && requires(const A& a, const insertion_view& v) {
  { a.max_positions(v) } noexcept -> std::convertible_to<std::int64_t>;
};

}  // namespace hybridcache
