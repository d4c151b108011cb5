// examples/llama_cpp/engine.hpp
//
// hybridcache-llama's serving loop: llama.cpp computes, hybridcache keeps what was computed.
// Requests go through `request_lifecycle` over a `pool_state_store`: the pool holds every
// cached token's K and V rows (one page per attention layer per block of tokens_per_page
// tokens: block tables) and every cached recurrent snapshot (one state block per recurrent
// layer: its conv and SSM rows); evicted leaves go to the store's host tier. llama.cpp's
// cells hold only the sequences being computed, one per slot.
//
// A request's life in a slot:
//   begin      match (joint-min: a cached recurrent snapshot with the KV of every earlier
//              token), plan the checkpoint sites of the prefill, reserve pages and slots; a
//              host-tier hit is copied into the reservation; refused -> the request waits
//              for slots to finish, or, when no cache of this size could hold it, runs uncached
//   restore    the hit's tokens [0, r) are written back into the slot's emptied sequence as
//              one rebuilt llama.cpp state: K/V rows from the pages, the snapshot from the
//              checkpoint (cells 0..r-1 of the slot's own stream, the bytes as computed;
//              verify.hpp: why later logits still move in the last bits)
//   prefill    [r, |prompt|) in llama_decode batches cut at every planned site, shared with
//              the other slots' work; after a batch ends at a site, the recurrent snapshot
//              (PARTIAL_ONLY) is copied into the site's reserved slot
//   decode     greedy, one token per step per slot, batched across slots
//   finish     the sequence's whole state is read once: the K/V rows of every token the tree
//              does not hold yet go into the reserved pages, the final snapshot into the end
//              slot; request_lifecycle::finish adopts them; the slot's sequence is emptied
//
// Cost per request beyond llama.cpp's compute: a restore copies r tokens' rows (about 1 KiB
// per token for the test models) plus one snapshot; a site costs one snapshot copy; finish
// copies the new tokens' rows and one snapshot. All single-threaded: one thread drives the
// engine (the lifecycle uses no_lock).
#pragma once

#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "llama_session.hpp"
#include "shared_tier.hpp"

namespace hybridcache_llama {

using pool_t = hc::memory::host_asymmetric_pool<hc::memory::threshold_rebalancer>;
using store_t = hc::stores::pool_state_store<pool_t>;

/// The cache's configuration (aggregate).
struct cache_options {
  hc::byte_count capacity_bytes = hc::byte_count{256} << 20;  ///< the pool: KV pages + checkpoint blocks
  hc::byte_count host_capacity_bytes = 0;                     ///< the host tier below it (0: none)
  std::int64_t tokens_per_page = 16;
  std::string policy = "marconi";  ///< marconi | sglang+ | vllm+
  std::string alpha = "auto";      ///< marconi: "auto" (the adaptive selector) or a FLOP weight
  /// Fault injection for tests: before every n-th request (0: never), flip one byte of every
  /// 7th page and block the host tier holds; the entries found changed are dropped, never loaded.
  std::int64_t flip_host_every = 0;
  /// The tier below the host tier (a directory or a Redis server; shared_tier.hpp): prefixes
  /// at the application's positions, written through, found by content key, so another
  /// process serving the same model file hits them too; with a host tier, also where the host
  /// tier's victims move down to (and are brought back from for a hit).
  shared_tier_options shared{};
  /// The weights' identity in content keys (`weights_identity` of the model file); required
  /// with a shared tier.
  std::string weights_id;
};

/// A request as a client sends it.
struct request_input {
  std::uint64_t id = 0;
  std::vector<llama_token> prompt;
  std::int32_t max_tokens = 16;
  hc::cache_salt salt = std::nullopt;
  /// Positions in the prompt where a state is worth keeping (application-directed: message
  /// boundaries, `loaded_model::message_boundaries`), ascending, in [1, |prompt|). The
  /// prompt's end is always one.
  std::vector<std::int64_t> checkpoints;
  /// Where an earlier request of the conversation ended (`loaded_model::last_turn_start`; 0:
  /// unknown): the shared tier looks there too, since that request stored its prompt's end.
  std::int64_t earlier_end = 0;
  /// Keep every logit row an output token is chosen from in `request_output::logits` (n_vocab
  /// floats per output token; for `--verify`, which compares them with the uncached run's).
  bool keep_logits = false;
  /// Report each output token's log-probability and the `top_logprobs` most likely tokens'
  /// (log-softmax of the row it was chosen from, as llama-server's `n_probs` / OpenAI's
  /// `logprobs`); -1: none. O(n_vocab log top) per output token.
  std::int32_t top_logprobs = -1;
};

/// One output token's log-probability and its row's most likely tokens (`top_logprobs`).
struct token_logprobs {
  float logprob = 0;
  std::vector<std::pair<llama_token, float>> top;  ///< most likely first (ties: lower id first)
};

/// What became of it.
struct request_output {
  std::uint64_t id = 0;
  std::vector<llama_token> tokens;     ///< generated (greedy), up to max_tokens, stopping after an end-of-generation token
  std::int64_t prompt_tokens = 0;
  std::int64_t reused_tokens = 0;      ///< prompt tokens not computed (cache hit, host tier included)
  std::int64_t host_loaded_tokens = 0; ///< of which came back from the host tier
  std::int64_t shared_loaded_tokens = 0; ///< of which came from the shared tier (disk or Redis)
  bool cached = true;                  ///< false: larger than the cache could ever hold; computed uncached
  double ttft_ms = 0, total_ms = 0;
  std::string error;                   ///< set when the request failed
  std::vector<float> logits;            ///< with `keep_logits`: the row of each output token, in order
  std::vector<token_logprobs> logprobs; ///< with `top_logprobs` >= 0: one per output token
};

/// `run_uncached`'s answer.
struct uncached_result {
  std::vector<llama_token> tokens;
  std::vector<float> logits;  ///< as `request_output::logits`
};

/// Running totals (all monotone).
struct engine_stats {
  std::int64_t requests = 0, prompt_tokens = 0, prefilled_tokens = 0, reused_tokens = 0;
  std::int64_t host_loads = 0, host_loaded_tokens = 0, evictions = 0, uncached = 0, waits = 0;
  std::int64_t host_corrupt_dropped = 0;  ///< host entries whose bytes had changed (never loaded)
  /// The host tier over the disk or Redis tier: entries it moved down, brought back up for a
  /// hit, and dropped from that tier to make room there. (A value that cannot be read back
  /// intact is a miss counted in `host_corrupt_dropped`.)
  std::int64_t moved_down = 0, brought_up = 0, storage_dropped = 0;
  std::int64_t snapshots = 0, restores = 0;
  double restore_ms = 0, snapshot_ms = 0, capture_ms = 0, bookkeeping_ms = 0, decode_ms = 0;
  std::int64_t shared_loaded_tokens = 0;  ///< prompt tokens loaded from the shared tier beyond the memory tiers' hit
  shared_tier_counters shared{};  ///< the shared tier's (all 0 without one)
  std::string shared_kind;        ///< "disk", "redis" or empty
};

/// The serving loop, whatever the policy. One thread calls it.
class engine {
 public:
  virtual ~engine() = default;
  /// Queues a request (first come, first served). @throws hc::invalid_argument for an empty
  /// prompt, max_tokens < 1, or a request longer than a slot's context.
  virtual void submit(request_input r) = 0;
  /// Requests queued or in flight.
  [[nodiscard]] virtual std::size_t pending() const = 0;
  /// One scheduling step: admits what fits into free slots, then one llama_decode over every
  /// busy slot's next chunk or token; appends the requests that ended to `done`.
  virtual void step(std::vector<request_output>& done) = 0;
  [[nodiscard]] virtual engine_stats stats() const = 0;
  /// A one-line description of the cache (policy, sizes).
  [[nodiscard]] virtual std::string describe() const = 0;
  /// Waits for writes to the shared tier still in flight (before a run ends).
  virtual void drain() = 0;
  /// Whether a shared tier is configured (then `request_input::earlier_end` is worth computing).
  [[nodiscard]] virtual bool has_shared_tier() const = 0;
};

/// The engine for `opts.policy`. @throws hc::invalid_argument for an unknown policy or a
/// pool that cannot hold the model's units.
std::unique_ptr<engine> make_engine(session& s, const cache_options& opts);

/// Runs `prompt` from scratch in sequence `seq` of `s` (which must be empty): prefill in one
/// pass, then greedy decoding as the engine does. The reference of `--verify`: its tokens and
/// the logit rows they were chosen from (as `request_input::keep_logits`).
/// @throws hc::invalid_argument when llama_decode fails.
uncached_result run_uncached(session& s, llama_seq_id seq, std::span<const llama_token> prompt, std::int32_t max_tokens);

}  // namespace hybridcache_llama

#include "engine_impl.hpp"  // IWYU pragma: keep
