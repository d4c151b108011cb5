// hybridcache/tiered/host_copy_engine.hpp
//
// The host implementation of the copy-engine interface (the CUDA one is
// cuda/copy_engine.cuh): one arena per tier, two copy "streams" (an offload queue towards
// slower tiers and an onboard queue towards HBM), each a worker thread executing memcpy
// jobs in FIFO order, and per-page hazard tracking so that jobs on different streams
// never race on a page:
//
//   before a job runs it waits for the last writer of every source page (read after
//   write) and for the last writer and last readers of every destination page (write
//   after write, write after read) — TensorRT-LLM's per-slot read/write events, keyed by
//   the physical page, not the logical entry.
//
// Protocol (prepare/complete, vLLM's two phases): the store's `prepare_move` reserves the
// destination, `submit` enqueues the copies and returns an event, `wait` reports success or
// the injected/real failure, and the caller passes that to `complete_move`. `move_entry`
// does all four.
//
// Bandwidth per lower tier and direction is measured at start-up with a memcpy probe
// (`measured_gbps`), so policies can decide reload-vs-recompute from numbers, not constants.
//
// Storage tiers (disk, redis: `is_storage`) have no arena: each is a `storage_backend`
// behind a `storage_tier_io` handed to the constructor, one per storage tier in tier order,
// and its pages are a `storage_page_space` (storage_page_space.hpp): a copy into the tier
// puts one value with the bytes of its destination pages, a copy out of it reads the values
// that hold its source pages back (checked against the CRC taken at the put) and fails,
// like an injected fault, when one is missing, short or altered. So a runtime puts a disk or
// Redis tier under a `tiered_store` (or a `tiered_state_store`) with this engine and no
// harness; values are keyed by a serial under `storage_model` and a per-engine salt (drawn
// at random unless given), so two engines sharing one Redis never read each other's values
// (sharing between processes goes by content keys: storage_format.hpp). Such a copy lands
// whole (not layer by layer). The engine removes its values when it stops.
//
// Layer by layer: a ticket of several layer segments (layer-major pages, a full-size copy)
// is copied segment after segment, and the worker publishes each segment as it lands, so a
// runtime can compute layer l once `landed_segments(ev) > l` (`wait_segments(ev, l + 1)`)
// while later layers are still being copied (`layered_copy_engine`). Copies are coalesced
// within a segment, never across one. Several tickets submitted as one group
// (`submit_group`, `grouped_copy_engine`) are one job whose segments run layer-major across
// the tickets (`interleave_segments`), each ticket with its own event: a hit's layer 0 of
// every entry lands first.
//
// Costs: submit O(pages of the ticket) (allocates the job's span list; a group adds
// O(segments log segments) to order them), query and
// landed_segments O(1) (a failed job: O(log failed jobs not yet waited for)), wait and
// wait_segments block until the job (or the segments) ran. A storage copy adds the
// backend's put or gets and O(runs · log runs mapped) on the worker; a storage tier's page
// hazards live in a hash map pruned of finished entries (amortized O(1) per page), not an
// array of its capacity. Thread-safe: any thread may submit and wait.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/host_memory.hpp"
#include "hybridcache/tiered/storage_page_space.hpp"
#include "hybridcache/tiered/storage_tier_io.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

/// Completion marker of one submitted job (stream + position in its FIFO).
struct copy_event {
  copy_stream stream = copy_stream::offload;
  std::uint64_t seq = 0;      ///< 0 = the null event (already complete)
  std::int32_t segments = 1;  ///< layer segments the job lands one by one (1: all at once)
};

/// `submit(t)` of an engine whose single move is a group of one (`submit_group` with one
/// ticket, one event): both engines submit that way, so one move and a group of one
/// behave alike.
template <class Engine>
[[nodiscard]] expected<copy_event> submit_as_group(Engine& engine, const move_ticket& t) {
  copy_event ev;
  auto r = engine.submit_group(std::span<const move_ticket>(&t, 1), std::span<copy_event>(&ev, 1));
  if (!r) return unexpected(r.error());
  return ev;
}

/// Counters since construction (or the last `take_stats`).
struct copy_stats {
  std::int64_t jobs = 0;
  std::int64_t transfers = 0;        ///< copy calls after coalescing
  std::int64_t small_transfers = 0;  ///< transfers below min_transfer_bytes
  std::int64_t bytes = 0;
  std::int64_t failed_jobs = 0;
};

/// Options of the host copy engine. Aggregate with defaults.
struct host_copy_engine_options {
  bool measure_bandwidth = true;                           ///< run the memcpy probe at start-up
  std::int64_t probe_bytes = std::int64_t{8} << 20;        ///< probe size (capped by the arenas)
  std::int64_t min_transfer_bytes = default_min_transfer_bytes;
  /// `storage_key::model` of the values put into storage tiers (model_identity, or any tag).
  std::uint64_t storage_model = 0;
  /// Salt of those values' keys; 0 draws one at random per engine.
  std::uint64_t storage_key_salt = 0;
};

/// memcpy-based copy engine over one host arena per tier (tier 0 stands in for HBM).
class host_copy_engine {
 public:
  /// Test hook: called for every copy span about to run; returning true makes that span
  /// (and so the job) fail without copying it. Runs on a worker thread.
  using fault_hook = std::function<bool(const copy_span&)>;

  /// Allocates one arena per memory tier (page aligned; host/CXL tiers bound to their NUMA
  /// node when configured), maps each storage tier onto its `storage` calls (one per
  /// storage tier, in tier order; they must outlive the engine), starts the two workers,
  /// measures bandwidth.
  /// @throws invalid_argument for a bad tier list (tier.hpp rules), or a count of `storage`
  ///         calls other than the storage tiers', or one lacking a call.
  host_copy_engine(const std::vector<tier_config>& tiers, std::int64_t page_bytes,
                   host_copy_engine_options options = {}, std::vector<storage_tier_io> storage = {})
      : page_bytes_(page_bytes), options_(options) {
    validate_tiers(tiers, page_bytes);
    std::size_t storage_tiers = 0;
    for (const auto& t : tiers) storage_tiers += is_storage(t.kind) ? 1 : 0;
    HYBRIDCACHE_EXPECTS(storage.size() == storage_tiers, invalid_argument,
                        "host_copy_engine: " + std::to_string(storage_tiers) + " storage tier(s) need as many storage_tier_io, got " +
                            std::to_string(storage.size()));
    if (storage_tiers > 0 && options_.storage_key_salt == 0) options_.storage_key_salt = std::random_device{}() | 1;
    std::size_t next_io = 0;
    for (const auto& t : tiers) {
      const std::int64_t pages = t.capacity_bytes / page_bytes;
      limits_.push_back(pages * page_bytes);
      hazards_.emplace_back();
      if (is_storage(t.kind)) {
        arenas_.emplace_back();
        spaces_.push_back(std::make_unique<storage_page_space>(std::move(storage[next_io++]), options_.storage_model,
                                                               options_.storage_key_salt));
        hazards_.back().sparse = true;
      } else {
        arenas_.emplace_back(pages * page_bytes, t.kind == tier_kind::hbm ? -1 : t.numa_node);
        spaces_.emplace_back();
        hazards_.back().dense.resize(static_cast<std::size_t>(pages));
      }
    }
    gbps_.assign(tiers.size(), {0.0, 0.0});
    if (options_.measure_bandwidth) measure();
    for (int s = 0; s < 2; ++s) workers_[s] = std::thread([this, s] { run(static_cast<copy_stream>(s)); });
  }

  /// Runs every job already submitted, then stops the workers (`stop`).
  ~host_copy_engine() { stop(); }

  /// Refuses new jobs (`submit` returns busy), runs every job already queued on both
  /// streams, and joins the workers. Every submitted job has run (or failed) when it
  /// returns, so a `wait` on it reports its real outcome. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    for (auto& sp : spaces_)
      if (sp) sp->remove_all();
  }

  host_copy_engine(const host_copy_engine&) = delete;
  host_copy_engine& operator=(const host_copy_engine&) = delete;

  /// Start of tier `t`'s arena (null for a storage tier: it has none).
  [[nodiscard]] std::byte* base(tier_id t) { return arenas_.at(t.value).data(); }
  /// Bytes of tier `t`'s arena (0 for a storage tier).
  [[nodiscard]] std::int64_t arena_bytes(tier_id t) const { return arenas_.at(t.value).size(); }
  /// The page map of storage tier `t` (null for a memory tier): its counters, and the
  /// value a page's bytes are in (tests).
  [[nodiscard]] const storage_page_space* storage_pages(tier_id t) const { return spaces_.at(t.value).get(); }
  /// Whether tier `t`'s arena was bound to its NUMA node.
  [[nodiscard]] bool numa_bound(tier_id t) const { return arenas_.at(t.value).bound(); }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }

  /// Measured memcpy bandwidth (GB/s) between HBM's arena and tier `t`'s, in the direction
  /// of `s` (0 when not measured or t is HBM).
  [[nodiscard]] double measured_gbps(tier_id t, copy_stream s) const {
    return gbps_.at(t.value)[static_cast<std::size_t>(s)];
  }

  /// Installs (or clears, with {}) the fault hook. Not while jobs are queued.
  void set_fault_hook(fault_hook hook) {
    std::lock_guard lock(mu_);
    fault_ = std::move(hook);
  }

  /// Enqueues the copies of a prepared move on the stream of its direction. The event
  /// counts the ticket's layer segments; a full-size copy lands them one by one, any other
  /// (a sparsified copy, pages that do not split evenly) all at once.
  /// Errors: invalid_argument when the ticket names an unknown tier or pages outside an arena.
  [[nodiscard]] expected<copy_event> submit(const move_ticket& t) {
    return submit_as_group(*this, t);
  }

  /// Enqueues several prepared moves as one job whose layer segments land interleaved
  /// (`grouped_copy_engine`: segment s of every ticket before segment s + 1 of any, in
  /// proportion to each ticket's segment count; `interleave_segments`). events[k] is ticket
  /// k's event: it lands, fails and is waited for on its own (a ticket whose every segment
  /// landed before another's copy failed has succeeded). invalid_argument for a ticket
  /// outside the arenas, tickets of both directions, or sizes that differ; busy after
  /// `stop`. All or nothing.
  [[nodiscard]] expected<void> submit_group(std::span<const move_ticket> tickets, std::span<copy_event> events) {
    if (tickets.empty() || tickets.size() != events.size()) return unexpected(errc::invalid_argument);
    const copy_stream s = stream_for(tickets.front());
    std::vector<layered_copies> plans;
    plans.reserve(tickets.size());
    std::vector<part> parts;
    parts.reserve(tickets.size());
    for (const move_ticket& t : tickets) {
      if (t.src.value >= arenas_.size() || t.dst.value >= arenas_.size() || stream_for(t) != s)
        return unexpected(errc::invalid_argument);
      plans.push_back(plan_layered_copies(t, page_bytes_));
      // A storage copy is one value put or read: it lands whole.
      if (spaces_[t.src.value] || spaces_[t.dst.value]) plans.back().ends.clear();
      // Not layered: its one planned segment lands all of the ticket's at once.
      parts.push_back({t.src, t.dst, 0, std::max<std::int32_t>(1, t.segments), plans.back().ends.empty()});
    }
    job j;
    for (const group_step& g : interleave_segments(plans)) {
      const auto [first, last] = segment_span_range(plans[g.part], g.segment);
      for (std::size_t i = first; i < last; ++i) {
        j.spans.push_back(plans[g.part].spans[i]);
        j.owner.push_back(g.part);
      }
      j.lands.push_back({j.spans.size(), g.part});
    }
    auto r = enqueue(std::move(j), std::move(parts), s);
    if (!r) return unexpected(r.error());
    for (std::size_t k = 0; k < tickets.size(); ++k) events[k] = copy_event{s, *r + k, std::max<std::int32_t>(1, tickets[k].segments)};
    return {};
  }

  /// Enqueues arbitrary spans from tier `src` to tier `dst` on stream `s`. busy after `stop`.
  /// `segment_ends` (optional): segment i ends after span segment_ends[i] - 1 (ascending,
  /// the last one spans.size()); the job then lands segment by segment.
  [[nodiscard]] expected<copy_event> submit(tier_id src, tier_id dst, std::vector<copy_span> spans, copy_stream s,
                                            std::vector<std::size_t> segment_ends = {}) {
    if (src.value >= arenas_.size() || dst.value >= arenas_.size()) return unexpected(errc::invalid_argument);
    if (!valid_segment_ends(segment_ends, spans.size())) return unexpected(errc::invalid_argument);
    const auto segments = static_cast<std::int32_t>(segment_ends.empty() ? 1 : segment_ends.size());
    job j;
    j.owner.assign(spans.size(), 0);
    j.spans = std::move(spans);
    for (const std::size_t e : segment_ends) j.lands.push_back({e, 0});
    if (segment_ends.empty()) j.lands.push_back({j.spans.size(), 0});
    std::vector<part> parts{part{src, dst, 0, segments, false}};
    auto r = enqueue(std::move(j), std::move(parts), s);
    if (!r) return unexpected(r.error());
    return copy_event{s, *r, segments};
  }

  /// True when the job has run (successfully or not).
  [[nodiscard]] bool query(copy_event ev) const {
    std::lock_guard lock(mu_);
    return completed_[static_cast<std::size_t>(ev.stream)] >= ev.seq;
  }

  /// Blocks until the job has run; returns `busy` if a copy of it failed (or, for an
  /// event this engine never issued, if it can never run).
  [[nodiscard]] expected<void> wait(copy_event ev) {
    std::unique_lock lock(mu_);
    const auto si = static_cast<std::size_t>(ev.stream);
    // Workers drain their queues before exiting, so after `stop` only a foreign event
    // (beyond what was submitted) can remain incomplete.
    done_cv_.wait(lock, [&] { return completed_[si] >= ev.seq || (stop_ && ev.seq > submitted_[si]); });
    if (completed_[si] < ev.seq) return unexpected(errc::busy);
    if (failed_[si].erase(ev.seq) > 0) return unexpected(errc::busy);
    return {};
  }

  /// How many leading layer segments of the job are in place, without blocking: 0 before it
  /// starts, `ev.segments` once it ran successfully; a failed job counts the segments that
  /// landed before the failure (until `wait` consumes the failure).
  [[nodiscard]] std::int32_t landed_segments(copy_event ev) const {
    std::lock_guard lock(mu_);
    return landed_locked(ev);
  }

  /// Blocks until the job's first `n` layer segments are in place (the whole job need not
  /// have run). busy when the job failed before them (the failure stays for `wait`), or for
  /// an event this engine never issued; invalid_argument for n outside [0, ev.segments].
  [[nodiscard]] expected<void> wait_segments(copy_event ev, std::int32_t n) {
    if (n < 0 || n > ev.segments) return unexpected(errc::invalid_argument);
    if (n == 0) return {};
    std::unique_lock lock(mu_);
    const auto si = static_cast<std::size_t>(ev.stream);
    done_cv_.wait(lock, [&] {
      return landed_locked(ev) >= n || completed_[si] >= ev.seq || (stop_ && ev.seq > submitted_[si]);
    });
    if (landed_locked(ev) >= n) return {};
    return unexpected(errc::busy);
  }

  /// Blocks until every submitted job has run.
  void synchronize() {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return completed_[0] >= submitted_[0] && completed_[1] >= submitted_[1]; });
  }

  /// Returns the counters and resets them.
  [[nodiscard]] copy_stats take_stats() {
    std::lock_guard lock(mu_);
    return std::exchange(stats_, copy_stats{});
  }

 private:
  struct page_hazard {
    std::size_t writer_stream = 2;  // 2 = never written
    std::uint64_t writer_seq = 0;
    std::array<std::uint64_t, 2> reader_seq{};
  };
  // The hazards of one tier's pages: an array for a memory tier (its arena's pages); a hash
  // map for a storage tier, whose capacity may be far beyond memory, pruned of the pages
  // whose last jobs have all run (an absent page: never written, read by nothing pending).
  struct hazard_table {
    std::vector<page_hazard> dense;
    std::unordered_map<std::uint32_t, page_hazard> pages;
    bool sparse = false;
    std::size_t prune_at = 1024;
    page_hazard& at(std::int64_t q) {
      return sparse ? pages[static_cast<std::uint32_t>(q)] : dense[static_cast<std::size_t>(q)];
    }
  };
  // What a worker carries through one job's storage copies: the value being gathered for a
  // storage destination (and its pages), the last value read from a storage source.
  struct storage_work {
    std::vector<std::size_t> last;  // per part: its last span
    std::vector<std::byte> value;
    std::vector<std::uint32_t> pages;
    std::vector<std::byte> cache;
    std::uint64_t cached = 0;
    bool have = false;
  };
  // One ticket of a job: its tiers, its sequence number on the stream, its event's segment
  // count, whether its one planned segment lands all of them at once (not layered), and how
  // many have landed.
  struct part {
    tier_id src, dst;
    std::uint64_t seq;
    std::int32_t segments;
    bool whole;
    std::int32_t landed = 0;
  };
  // A job: one ticket, or a group's tickets interleaved (copied in this order by one worker).
  struct job {
    std::vector<copy_span> spans;                           // in the order they run
    std::vector<std::uint32_t> owner;                       // the part each span belongs to
    std::vector<std::pair<std::size_t, std::uint32_t>> lands;  // after `first` spans ran, part `second` has one more segment in place
    std::vector<part> parts;                                // seqs first_seq, first_seq + 1, ...
    std::uint64_t seq = 0;                                  // the last part's (the job completes with it)
    std::uint64_t wait_other = 0;                           // the other stream must have completed this seq first
    bool storage = false;                                   // a part reads or writes a storage tier
  };

  // Checks the spans, numbers the parts, registers the page hazards and queues the job.
  // Returns the first part's sequence number. Caller-built parts; `j.owner` parallel to spans.
  expected<std::uint64_t> enqueue(job&& j, std::vector<part>&& parts, copy_stream s) {
    for (std::size_t i = 0; i < j.spans.size(); ++i) {
      const copy_span& c = j.spans[i];
      const part& p = parts[j.owner[i]];
      if (c.bytes <= 0 || c.src_offset < 0 || c.dst_offset < 0 || c.src_offset + c.bytes > limits_[p.src.value] ||
          c.dst_offset + c.bytes > limits_[p.dst.value])
        return unexpected(errc::invalid_argument);
    }
    for (const part& p : parts) j.storage = j.storage || spaces_[p.src.value] || spaces_[p.dst.value];
    std::lock_guard lock(mu_);
    if (stop_) return unexpected(errc::busy);  // stopping: the workers would never run it
    const auto si = static_cast<std::size_t>(s);
    const auto other = 1 - si;
    const std::uint64_t first = submitted_[si] + 1;
    for (std::size_t k = 0; k < parts.size(); ++k) parts[k].seq = first + k;
    submitted_[si] += parts.size();
    j.parts = std::move(parts);
    j.seq = submitted_[si];
    // Hazards: the job may not start before the other stream finished the last writer of
    // each source page and the last writer/readers of each destination page.
    for_pages(j, true, [&](page_hazard& h) {
      if (h.writer_stream == other) j.wait_other = std::max(j.wait_other, h.writer_seq);
    });
    for_pages(j, false, [&](page_hazard& h) {
      if (h.writer_stream == other) j.wait_other = std::max(j.wait_other, h.writer_seq);
      j.wait_other = std::max(j.wait_other, h.reader_seq[other]);
    });
    for_pages(j, true, [&](page_hazard& h) { h.reader_seq[si] = j.seq; });
    for_pages(j, false, [&](page_hazard& h) {
      h.writer_stream = si;
      h.writer_seq = j.seq;
    });
    if (j.storage) prune_hazards();
    stats_.jobs += static_cast<std::int64_t>(j.parts.size());
    for (const auto& c : j.spans) {
      stats_.transfers += 1;
      stats_.small_transfers += c.bytes < options_.min_transfer_bytes;
      stats_.bytes += c.bytes;
    }
    queues_[si].push_back(std::move(j));
    work_cv_.notify_all();
    return first;
  }

  template <class F>
  void for_pages(const job& j, bool source, F&& f) {
    for (std::size_t i = 0; i < j.spans.size(); ++i) {
      const copy_span& c = j.spans[i];
      const part& p = j.parts[j.owner[i]];
      auto& table = hazards_[source ? p.src.value : p.dst.value];
      const std::int64_t off = source ? c.src_offset : c.dst_offset;
      for (std::int64_t q = off / page_bytes_; q * page_bytes_ < off + c.bytes; ++q) f(table.at(q));
    }
  }

  // Drops the storage pages whose last writer and readers have all run. Under mu_.
  void prune_hazards() {
    for (auto& t : hazards_) {
      if (!t.sparse || t.pages.size() < t.prune_at) continue;
      std::erase_if(t.pages, [&](const auto& kv) {
        const page_hazard& h = kv.second;
        return (h.writer_stream == 2 || completed_[h.writer_stream] >= h.writer_seq) && completed_[0] >= h.reader_seq[0] &&
               completed_[1] >= h.reader_seq[1];
      });
      t.prune_at = std::max<std::size_t>(1024, 2 * t.pages.size());
    }
  }

  // One span of a job touching a storage tier: its source bytes (an arena's, or read from
  // the values holding its pages) into the destination (an arena, or the value being
  // gathered, put once the part's last span is in). false: a value missing, short or
  // altered, or a put the backend refused.
  bool storage_span(const job& j, std::size_t i, storage_work& w) {
    const copy_span& c = j.spans[i];
    const part& p = j.parts[j.owner[i]];
    storage_page_space* const into = spaces_[p.dst.value].get();
    std::byte* out = nullptr;
    if (into != nullptr) {
      const std::size_t at = w.value.size();
      w.value.resize(at + static_cast<std::size_t>(c.bytes));
      out = w.value.data() + at;
      for (std::int64_t q = c.dst_offset / page_bytes_; q * page_bytes_ < c.dst_offset + c.bytes; ++q)
        w.pages.push_back(static_cast<std::uint32_t>(q));
    } else {
      out = arenas_[p.dst.value].data() + c.dst_offset;
    }
    if (storage_page_space* const from = spaces_[p.src.value].get()) {
      for (std::int64_t done = 0; done < c.bytes;) {
        const std::int64_t off = c.src_offset + done, in_page = off % page_bytes_;
        const auto home = from->locate(static_cast<std::uint32_t>(off / page_bytes_));
        if (!home) return false;  // never written there
        if (!w.have || w.cached != home->value) {
          w.have = false;
          if (!from->read(home->value, w.cache)) return false;
          w.have = true;
          w.cached = home->value;
        }
        const std::int64_t at = home->index * page_bytes_ + in_page;
        const std::int64_t len = std::min(page_bytes_ - in_page, c.bytes - done);
        if (at + len > static_cast<std::int64_t>(w.cache.size())) return false;
        std::memcpy(out + done, w.cache.data() + at, static_cast<std::size_t>(len));
        done += len;
      }
    } else {
      std::memcpy(out, arenas_[p.src.value].data() + c.src_offset, static_cast<std::size_t>(c.bytes));
    }
    if (into == nullptr || i != w.last[j.owner[i]]) return true;
    const std::uint64_t value = next_value_.fetch_add(1) + 1;
    const auto r = into->put(value, w.pages, page_bytes_, w.value);
    w.value.clear();
    w.pages.clear();
    return r.has_value();
  }

  void run(copy_stream s) {
    const auto si = static_cast<std::size_t>(s);
    const auto other = 1 - si;
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queues_[si].empty(); });
      if (queues_[si].empty()) return;  // stopping, and nothing left to run
      job& j = queues_[si].front();
      // The other stream drains its queue too, so its hazards are always met eventually.
      done_cv_.wait(lock, [&] { return completed_[other] >= j.wait_other; });
      fault_hook fault = fault_;
      running_[si] = &j;  // its parts' `landed` are read under the lock
      lock.unlock();
      bool ok = true;
      std::size_t next = 0;  // the next landing to publish
      storage_work work;
      if (j.storage) {
        work.last.assign(j.parts.size(), 0);
        for (std::size_t i = 0; i < j.spans.size(); ++i) work.last[j.owner[i]] = i;
      }
      for (std::size_t i = 0; i < j.spans.size(); ++i) {
        const copy_span& c = j.spans[i];
        const part& p = j.parts[j.owner[i]];
        if (fault && fault(c)) {
          ok = false;
          break;
        }
        if (spaces_[p.src.value] || spaces_[p.dst.value]) {
          if (!storage_span(j, i, work)) {
            ok = false;
            break;
          }
        } else {
          std::memcpy(arenas_[p.dst.value].data() + c.dst_offset, arenas_[p.src.value].data() + c.src_offset,
                      static_cast<std::size_t>(c.bytes));
        }
        // What lands with the last span lands with the job (completion publishes it, so a
        // waiter woken for it also sees the job complete).
        if (next < j.lands.size() && j.lands[next].first <= i + 1 && i + 1 < j.spans.size()) {
          lock.lock();
          for (; next < j.lands.size() && j.lands[next].first <= i + 1; ++next) {
            part& q = j.parts[j.lands[next].second];
            q.landed = q.whole ? q.segments : q.landed + 1;
          }
          lock.unlock();
          done_cv_.notify_all();
        }
      }
      lock.lock();
      for (const part& p : j.parts)
        if (!ok && p.landed < p.segments) {  // a part whose every segment landed has succeeded
          failed_[si].emplace(p.seq, p.landed);
          stats_.failed_jobs += 1;
        }
      running_[si] = nullptr;
      completed_[si] = j.seq;
      queues_[si].pop_front();
      done_cv_.notify_all();
    }
  }

  void measure() {
    for (std::size_t t = 1; t < arenas_.size(); ++t) {
      if (spaces_[t]) continue;  // a storage tier: no memcpy to probe
      const std::int64_t n = std::min({options_.probe_bytes, arenas_[0].size(), arenas_[t].size()});
      if (n <= 0) continue;
      auto time_copy = [&](std::byte* dst, const std::byte* src) {
        double best = 0.0;
        for (int rep = 0; rep < 3; ++rep) {
          const auto a = std::chrono::steady_clock::now();
          std::memcpy(dst, src, static_cast<std::size_t>(n));
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
          if (sec > 0) best = std::max(best, static_cast<double>(n) / sec / 1e9);
        }
        return best;
      };
      gbps_[t][0] = time_copy(arenas_[t].data(), arenas_[0].data());
      gbps_[t][1] = time_copy(arenas_[0].data(), arenas_[t].data());
    }
  }

  std::int32_t landed_locked(copy_event ev) const {
    const auto si = static_cast<std::size_t>(ev.stream);
    if (completed_[si] >= ev.seq) {
      const auto f = failed_[si].find(ev.seq);
      return f == failed_[si].end() ? ev.segments : f->second;
    }
    const job* r = running_[si];
    if (r == nullptr || ev.seq > r->seq || ev.seq < r->parts.front().seq) return 0;
    return r->parts[static_cast<std::size_t>(ev.seq - r->parts.front().seq)].landed;
  }

  std::int64_t page_bytes_;
  host_copy_engine_options options_;
  std::vector<host_arena> arenas_;                          // empty for a storage tier
  std::vector<std::unique_ptr<storage_page_space>> spaces_;  // null for a memory tier
  std::vector<std::int64_t> limits_;                         // bytes addressable in each tier (whole pages)
  std::vector<hazard_table> hazards_;
  std::atomic<std::uint64_t> next_value_{0};                 // the last storage value's number
  std::vector<std::array<double, 2>> gbps_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::array<std::deque<job>, 2> queues_;
  std::array<std::uint64_t, 2> submitted_{}, completed_{};
  std::array<std::map<std::uint64_t, std::int32_t>, 2> failed_;  // failed job -> segments landed before
  std::array<const job*, 2> running_{};                              // the job a worker runs (null: none)
  fault_hook fault_;
  copy_stats stats_;
  bool stop_ = false;
  std::array<std::thread, 2> workers_;
};

static_assert(grouped_copy_engine<host_copy_engine> && arena_copy_engine<host_copy_engine>);

/// Moves one entry to tier `dst` through the full protocol: prepare (reserve destination),
/// submit, wait, complete. On any failure the entry stays at its source, intact, and the
/// reservation is released. Returns the first error (`out_of_capacity`, `busy`, ...); an
/// engine that throws (the CUDA engine's `cuda_error`) has the move rolled back first and
/// the exception propagates.
template <class Store, class Engine>
[[nodiscard]] expected<void> move_entry(Store& store, Engine& engine, entry_id id, tier_id dst, std::int64_t dst_bytes = 0) {
  auto ticket = store.prepare_move(id, dst, dst_bytes);
  if (!ticket) return unexpected(ticket.error());
  bool ok = false;
  try {
    auto ev = engine.submit(*ticket);
    if (!ev) {
      (void)store.complete_move(*ticket, false);
      return unexpected(ev.error());
    }
    const auto done = engine.wait(*ev);
    ok = done.has_value();
    const auto fin = store.complete_move(*ticket, ok);
    if (!done) return done;
    return fin;
  } catch (...) {
    (void)store.complete_move(*ticket, false);  // no-op if already completed
    throw;
  }
}

}  // namespace hybridcache::tiered
