// hybridcache/attention/kv_buffer.hpp
//
// KVBuffer bookkeeping (arXiv 2605.19049): per request, the tokens since the last flush of
// its linear-attention state live in a small paged buffer whose blocks come from a pool
// shared by all requests. This header has the host-side owner of the page tables and
// cursors (`kv_buffer_table`), the trivially copyable view the kernels use
// (`kv_buffer_ref`), and the cursor rule both sides apply (`advance_cursor`).
//
// What a buffered token holds: linear attention (k, v) — raw inputs; Gated DeltaNet
// (k, u, g) — raw key, corrected delta `u` (fp32) and log-decay `g` (anchor §2.4). Keys are
// stored once per key head, values and decays per value head.
//
// Modes of a request: chunkwise (a state exists; flush every `flush_interval` tokens) and
// KV-only (no state yet, context below the crossover; at the crossover the buffer is folded
// into a fresh state and the request switches to chunkwise, releasing its surplus blocks).
//
// The table is the single source of truth for cursors: kernels read cursors and never move
// them; after each step the host calls `advance` (the device copy is re-uploaded before the
// next launch). Costs: open/close/advance O(blocks per slot), no allocation after
// construction; checks O(batch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::attention {

/// Result of moving a cursor by `accepted` tokens.
struct cursor_step {
  int length = 0;            ///< tokens buffered after the step
  bool state_valid = false;  ///< the request has a state after the step
  bool fold = false;         ///< the step folds the whole buffer into the state (one state write)
};

/// The cursor rule shared by kernels (fold decision) and the host table (bookkeeping): with
/// `length` tokens buffered and `accepted` more committed, a chunkwise request folds when the
/// buffer reaches `flush_interval`; a KV-only request folds (and switches) at `crossover`.
HYBRIDCACHE_HD_INLINE cursor_step advance_cursor(int length, bool state_valid, int accepted, int flush_interval,
                                                 int crossover) {
  const int n = length + accepted;
  const bool fold = state_valid ? n >= flush_interval : n >= crossover;
  return cursor_step{fold ? 0 : n, state_valid || fold, fold};
}

/// Shape of a KVBuffer. Aggregate; validated by `kv_buffer_table`'s constructor.
struct kv_buffer_config {
  int num_slots = 0;           ///< requests addressable at once (slot ids 0..num_slots-1)
  int num_blocks = 0;          ///< blocks in the shared pool
  int block_tokens = 16;       ///< tokens per block
  int flush_interval = 16;     ///< B: tokens per state write; cost-model optimum sqrt(2d) = 16 for d = 128
  int max_new_tokens = 1;      ///< most tokens one step appends (1 for decode, n drafts for verify)
  int kv_only_crossover = 0;   ///< context length at which KV-only requests fold (0: no KV-only mode)
};

/// Cost-model optimum buffer size `sqrt(2 c_S / c_tok)` for fp32 state and 16-bit k, v
/// (anchor §1.4): sqrt(2 d) for d_k = d_v = d, rounded to the nearest integer (16 for 128).
inline int optimal_flush_interval(int key_dim, int value_dim) {
  const double c_state = 4.0 * key_dim * value_dim;
  const double c_token = 2.0 * (key_dim + value_dim);
  return std::max(1, static_cast<int>(std::sqrt(2.0 * c_state / c_token) + 0.5));
}

/// KV-only crossover (anchor §1.6): the context length at which the buffered k, v of all
/// heads (16-bit) take as many bytes as the fp32 state of all value heads. d for MHA; 171 for
/// Qwen3-Next (16 key heads, 32 value heads, d = 128).
inline int kv_only_crossover(int num_k_heads, int num_v_heads, int key_dim, int value_dim) {
  const double state = 4.0 * num_v_heads * key_dim * value_dim;
  const double token = 2.0 * (static_cast<double>(num_k_heads) * key_dim + static_cast<double>(num_v_heads) * value_dim);
  return static_cast<int>(state / token + 0.5);
}

/// Device-usable view of one layer's KVBuffer: the shared pool arrays of that layer plus the
/// table's arrays (shared by all layers). Token `pos` of slot `s` lives in block
/// `block_table[s * max_blocks + pos / block_tokens]` at offset `pos % block_tokens`.
template <class KeyT, class ValueT>
struct kv_buffer_ref {
  KeyT* keys = nullptr;        ///< [num_blocks][block_tokens][num_k_heads][key_dim]
  ValueT* values = nullptr;    ///< [num_blocks][block_tokens][num_v_heads][value_dim]
  float* log_decay = nullptr;  ///< [num_blocks][block_tokens][num_v_heads]
  const std::int32_t* block_table = nullptr;  ///< [num_slots][max_blocks], -1 = none
  const std::int32_t* cursor = nullptr;       ///< [num_slots] tokens since the last flush
  const std::int32_t* state_valid = nullptr;  ///< [num_slots] 1 = chunkwise, 0 = KV-only
  int block_tokens = 0;
  int max_blocks = 0;
  int num_k_heads = 0;
  int num_v_heads = 0;
  int key_dim = 0;
  int value_dim = 0;

  HYBRIDCACHE_HD_INLINE std::int64_t token_index(int slot, int pos) const {
    const std::int64_t block = block_table[static_cast<std::int64_t>(slot) * max_blocks + pos / block_tokens];
    return block * block_tokens + pos % block_tokens;
  }
  /// Key, value and decay of the pool token `tok` (a `token_index`): no block-table lookup.
  HYBRIDCACHE_HD_INLINE KeyT* key_of(std::int64_t tok, int h) const { return keys + (tok * num_k_heads + h) * key_dim; }
  HYBRIDCACHE_HD_INLINE ValueT* value_of(std::int64_t tok, int hv) const {
    return values + (tok * num_v_heads + hv) * value_dim;
  }
  HYBRIDCACHE_HD_INLINE float* decay_of(std::int64_t tok, int hv) const { return log_decay + tok * num_v_heads + hv; }
  HYBRIDCACHE_HD_INLINE KeyT* key(int slot, int pos, int h) const {
    return keys + (token_index(slot, pos) * num_k_heads + h) * key_dim;
  }
  HYBRIDCACHE_HD_INLINE ValueT* value(int slot, int pos, int hv) const {
    return values + (token_index(slot, pos) * num_v_heads + hv) * value_dim;
  }
  HYBRIDCACHE_HD_INLINE float* decay(int slot, int pos, int hv) const {
    return log_decay + token_index(slot, pos) * num_v_heads + hv;
  }
};

/// Host owner of a KVBuffer's page tables and cursors, with a free list of pool blocks.
/// Not thread-safe (one scheduler thread drives it, as in SGLang/vLLM).
class kv_buffer_table {
 public:
  /// @throw invalid_argument on a non-positive size or a pool too small for one request.
  explicit kv_buffer_table(const kv_buffer_config& cfg) : cfg_(cfg) {
    HYBRIDCACHE_EXPECTS(cfg.num_slots > 0, invalid_argument, "kv_buffer_config.num_slots must be positive");
    HYBRIDCACHE_EXPECTS(cfg.block_tokens > 0, invalid_argument, "kv_buffer_config.block_tokens must be positive");
    HYBRIDCACHE_EXPECTS(cfg.flush_interval > 0, invalid_argument, "kv_buffer_config.flush_interval must be positive");
    HYBRIDCACHE_EXPECTS(cfg.max_new_tokens > 0, invalid_argument, "kv_buffer_config.max_new_tokens must be positive");
    HYBRIDCACHE_EXPECTS(cfg.kv_only_crossover >= 0, invalid_argument,
                        "kv_buffer_config.kv_only_crossover must be >= 0");
    max_blocks_ = blocks_for(std::max(capacity(false), capacity(true)));
    HYBRIDCACHE_EXPECTS(cfg.num_blocks >= blocks_for(capacity(false)), invalid_argument,
                        "kv_buffer_config.num_blocks cannot hold one request's buffer");
    table_.assign(static_cast<std::size_t>(cfg.num_slots) * max_blocks_, -1);
    cursor_.assign(static_cast<std::size_t>(cfg.num_slots), 0);
    valid_.assign(static_cast<std::size_t>(cfg.num_slots), 0);
    open_.assign(static_cast<std::size_t>(cfg.num_slots), 0);
    seen_.assign(static_cast<std::size_t>(cfg.num_slots), 0);
    free_.reserve(static_cast<std::size_t>(cfg.num_blocks));
    for (int b = cfg.num_blocks - 1; b >= 0; --b) free_.push_back(b);
  }

  [[nodiscard]] const kv_buffer_config& config() const noexcept { return cfg_; }
  /// Tokens a request must be able to hold in a mode: (B or crossover) - 1 + max_new_tokens.
  [[nodiscard]] int capacity(bool kv_only) const noexcept {
    if (kv_only) return cfg_.kv_only_crossover > 0 ? cfg_.kv_only_crossover - 1 + cfg_.max_new_tokens : 0;
    return cfg_.flush_interval - 1 + cfg_.max_new_tokens;
  }
  /// Columns of the block table (blocks of the larger mode).
  [[nodiscard]] int max_blocks_per_slot() const noexcept { return max_blocks_; }
  [[nodiscard]] int free_blocks() const noexcept { return static_cast<int>(free_.size()); }
  [[nodiscard]] bool is_open(int slot) const { return in_range(slot) && open_[static_cast<std::size_t>(slot)]; }
  [[nodiscard]] int cursor(int slot) const { return cursor_.at(static_cast<std::size_t>(slot)); }
  [[nodiscard]] bool state_valid(int slot) const { return valid_.at(static_cast<std::size_t>(slot)) != 0; }
  [[nodiscard]] const std::int32_t* block_table_data() const noexcept { return table_.data(); }
  [[nodiscard]] const std::int32_t* cursor_data() const noexcept { return cursor_.data(); }
  [[nodiscard]] const std::int32_t* state_valid_data() const noexcept { return valid_.data(); }
  /// Bumped by every change, so a device mirror knows when to re-upload.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }

  /// Opens `slot` in KV-only mode (no state yet) or chunkwise mode (the state was written by
  /// prefill), reserving the mode's capacity. Leaves the table unchanged on failure.
  expected<void> open(int slot, bool kv_only) noexcept {
    if (!in_range(slot) || open_[static_cast<std::size_t>(slot)]) return unexpected(errc::invalid_argument);
    if (kv_only && cfg_.kv_only_crossover == 0) return unexpected(errc::invalid_argument);
    const int need = blocks_for(capacity(kv_only));
    if (need > free_blocks()) return unexpected(errc::out_of_capacity);
    std::int32_t* row = row_of(slot);
    for (int i = 0; i < need; ++i) {
      row[i] = free_.back();
      free_.pop_back();
    }
    open_[static_cast<std::size_t>(slot)] = 1;
    cursor_[static_cast<std::size_t>(slot)] = 0;
    valid_[static_cast<std::size_t>(slot)] = kv_only ? 0 : 1;
    ++version_;
    return {};
  }

  /// Releases `slot`'s blocks. Closing a closed slot is a no-op.
  void close(int slot) noexcept {
    if (!is_open(slot)) return;
    shrink(slot, 0);
    open_[static_cast<std::size_t>(slot)] = 0;
    cursor_[static_cast<std::size_t>(slot)] = 0;
    valid_[static_cast<std::size_t>(slot)] = 0;
    ++version_;
  }

  /// Checks a step before launch: every non-negative slot is open, in range and named once,
  /// and `new_tokens` fit after its cursor. Negative slots are skipped (padding). O(batch).
  /// @throw invalid_argument naming the first offending batch entry.
  void check_step(std::span<const std::int32_t> slots, int new_tokens) const {
    HYBRIDCACHE_EXPECTS(new_tokens >= 1 && new_tokens <= cfg_.max_new_tokens, invalid_argument,
                        "kv_buffer: " + std::to_string(new_tokens) + " new tokens per step, capacity is " +
                            std::to_string(cfg_.max_new_tokens) + " (kv_buffer_config.max_new_tokens)");
    const std::uint64_t mark = ++stamp_;  // marks of earlier checks never equal this one
    for (std::size_t b = 0; b < slots.size(); ++b) {
      const int s = slots[b];
      if (s < 0) continue;
      HYBRIDCACHE_EXPECTS(is_open(s), invalid_argument,
                          "kv_buffer: batch entry " + std::to_string(b) + " names slot " + std::to_string(s) +
                              ", which is not open");
      HYBRIDCACHE_EXPECTS(seen_[static_cast<std::size_t>(s)] != mark, invalid_argument,
                          "kv_buffer: slot " + std::to_string(s) + " appears twice in one batch");
      seen_[static_cast<std::size_t>(s)] = mark;
      const int cap = capacity(!state_valid(s));
      HYBRIDCACHE_EXPECTS(cursor(s) + new_tokens <= cap, invalid_argument,
                          "kv_buffer: slot " + std::to_string(s) + " would overflow its buffer (" +
                              std::to_string(cursor(s) + new_tokens) + " > " + std::to_string(cap) + " tokens)");
    }
  }

  /// Moves `slot`'s cursor by `accepted` tokens after a decode (1) or a commit (0..n);
  /// returns what the kernels did. A KV-only request that folds switches to chunkwise and
  /// releases the blocks it no longer needs.
  cursor_step advance(int slot, int accepted) {
    HYBRIDCACHE_EXPECTS(is_open(slot), invalid_argument, "kv_buffer: advance on a slot that is not open");
    const auto i = static_cast<std::size_t>(slot);
    HYBRIDCACHE_EXPECTS(accepted >= 0 && cursor_[i] + accepted <= capacity(valid_[i] == 0), invalid_argument,
                        "kv_buffer: advance past the reserved buffer");
    const cursor_step st = advance_cursor(cursor_[i], valid_[i] != 0, accepted, cfg_.flush_interval,
                                          cfg_.kv_only_crossover);
    if (st.fold && valid_[i] == 0) shrink(slot, blocks_for(capacity(false)));
    cursor_[i] = st.length;
    valid_[i] = st.state_valid ? 1 : 0;
    ++version_;
    return st;
  }

 private:
  [[nodiscard]] bool in_range(int slot) const noexcept { return slot >= 0 && slot < cfg_.num_slots; }
  [[nodiscard]] int blocks_for(int tokens) const noexcept { return (tokens + cfg_.block_tokens - 1) / cfg_.block_tokens; }
  std::int32_t* row_of(int slot) noexcept { return table_.data() + static_cast<std::size_t>(slot) * max_blocks_; }
  void shrink(int slot, int keep) noexcept {
    std::int32_t* row = row_of(slot);
    for (int b = max_blocks_ - 1; b >= keep; --b) {
      if (row[b] < 0) continue;
      free_.push_back(row[b]);
      row[b] = -1;
    }
  }

  kv_buffer_config cfg_;
  int max_blocks_ = 0;
  std::vector<std::int32_t> table_;
  std::vector<std::int32_t> cursor_;
  std::vector<std::int32_t> valid_;
  std::vector<unsigned char> open_;
  std::vector<std::int32_t> free_;
  mutable std::vector<std::uint64_t> seen_;  // duplicate-slot marks of check_step (stamp-based, no clearing)
  mutable std::uint64_t stamp_ = 0;
  std::uint64_t version_ = 0;
};

}  // namespace hybridcache::attention
