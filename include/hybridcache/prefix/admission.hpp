// hybridcache/prefix/admission.hpp
//
// Admission policies (concept `admission_policy`): which positions of a committed sequence
// keep an SSM checkpoint. Every node of the tree ends at a kept position or at a branch, so
// admission also shapes the tree.
//
//   judicious_admission        Marconi (paper §4.2): the branch point found by speculative
//                              insertion (when the sequence splits an existing edge, or leaves
//                              a sequence cached below HBM) and the state after the last
//                              decoded token: at most 3 per sequence.
//   every_block_admission<B>   vLLM+ (fine-grained checkpointing): every multiple of B the
//                              request computed, plus the sequence end (the partial last block).
//   last_token_admission       only the state after the last decoded token: what an engine
//                              without speculative insertion keeps (hcbench's `lru` policy).
//   no_admission               keep no state: cached tokens are KV only and never reusable on a
//                              hybrid model (an ablation; application-directed positions still
//                              apply).
//
// Costs: judicious O(1); every_block O(total / B) positions appended (the caller's vector
// keeps its capacity, so steady state allocates nothing). Each says how many it appends at
// most (`max_positions`, concept `bounded_admission`), so the cache's scratch is sized by
// that, not by the sequence's length.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridcache/concepts/admission.hpp"

namespace hybridcache::prefix {

/// Marconi's judicious admission. See the file comment.
struct judicious_admission {
  void select(const insertion_view& v, std::vector<std::int64_t>& out) const noexcept {
    // push_back on a vector whose capacity the cache reserved (>= 2) does not allocate.
    if (v.branch_point > 0) out.push_back(v.branch_point);
    // Judicious across tiers: the branch point a cached sequence below HBM shows.
    if (v.lower_branch_point > v.reusable_tokens && v.lower_branch_point < v.total_tokens)
      out.push_back(v.lower_branch_point);
    // A full hit (reusable == total) computed no state: the concept allows only (reusable, total].
    if (v.total_tokens > v.reusable_tokens) out.push_back(v.total_tokens);
  }
  [[nodiscard]] std::int64_t max_positions(const insertion_view&) const noexcept { return 3; }
};
static_assert(bounded_admission<judicious_admission>);

/// vLLM+-style admission: a checkpoint every `Block` tokens (32 in the Marconi paper) the
/// request computed, and one at the end of the sequence.
template <std::int64_t Block>
struct every_block_admission {
  static_assert(Block > 0, "every_block_admission: Block must be positive");
  static constexpr std::int64_t block = Block;

  void select(const insertion_view& v, std::vector<std::int64_t>& out) const noexcept {
    const std::int64_t first = (v.reusable_tokens / Block + 1) * Block;
    for (std::int64_t p = first; p <= v.total_tokens; p += Block) out.push_back(p);
    if (v.total_tokens > v.reusable_tokens && v.total_tokens % Block != 0) out.push_back(v.total_tokens);
  }
  [[nodiscard]] std::int64_t max_positions(const insertion_view& v) const noexcept {
    return v.total_tokens > v.reusable_tokens ? (v.total_tokens - v.reusable_tokens) / Block + 2 : 0;
  }
};
static_assert(admission_policy<every_block_admission<32>>);

/// Only the state after the sequence's last token (no branch-point checkpoints).
struct last_token_admission {
  void select(const insertion_view& v, std::vector<std::int64_t>& out) const noexcept {
    if (v.total_tokens > v.reusable_tokens) out.push_back(v.total_tokens);
  }
  [[nodiscard]] std::int64_t max_positions(const insertion_view&) const noexcept { return 1; }
};
static_assert(admission_policy<last_token_admission>);

/// Keeps no SSM state.
struct no_admission {
  void select(const insertion_view&, std::vector<std::int64_t>&) const noexcept {}
  [[nodiscard]] std::int64_t max_positions(const insertion_view&) const noexcept { return 0; }
};
static_assert(admission_policy<no_admission>);

}  // namespace hybridcache::prefix
