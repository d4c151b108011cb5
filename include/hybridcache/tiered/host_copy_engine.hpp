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
// wait_segments block until the job (or the segments) ran. Thread-safe: any thread may
// submit and wait.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/host_memory.hpp"
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
};

/// memcpy-based copy engine over one host arena per tier (tier 0 stands in for HBM).
class host_copy_engine {
 public:
  /// Test hook: called for every copy span about to run; returning true makes that span
  /// (and so the job) fail without copying it. Runs on a worker thread.
  using fault_hook = std::function<bool(const copy_span&)>;

  /// Allocates one arena per tier (page aligned; host/CXL tiers bound to their NUMA node
  /// when configured), starts the two workers, measures bandwidth.
  /// @throws invalid_argument for a bad tier list (tier.hpp rules).
  host_copy_engine(const std::vector<tier_config>& tiers, std::int64_t page_bytes,
                   host_copy_engine_options options = {})
      : page_bytes_(page_bytes), options_(options) {
    validate_tiers(tiers, page_bytes);
    for (const auto& t : tiers) {
      const std::int64_t pages = t.capacity_bytes / page_bytes;
      arenas_.emplace_back(pages * page_bytes, t.kind == tier_kind::hbm ? -1 : t.numa_node);
      hazards_.emplace_back(static_cast<std::size_t>(pages));
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
  }

  host_copy_engine(const host_copy_engine&) = delete;
  host_copy_engine& operator=(const host_copy_engine&) = delete;

  /// Start of tier `t`'s arena.
  [[nodiscard]] std::byte* base(tier_id t) { return arenas_.at(t.value).data(); }
  [[nodiscard]] std::int64_t arena_bytes(tier_id t) const { return arenas_.at(t.value).size(); }
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
  };

  // Checks the spans, numbers the parts, registers the page hazards and queues the job.
  // Returns the first part's sequence number. Caller-built parts; `j.owner` parallel to spans.
  expected<std::uint64_t> enqueue(job&& j, std::vector<part>&& parts, copy_stream s) {
    for (std::size_t i = 0; i < j.spans.size(); ++i) {
      const copy_span& c = j.spans[i];
      const part& p = parts[j.owner[i]];
      if (c.bytes <= 0 || c.src_offset < 0 || c.dst_offset < 0 || c.src_offset + c.bytes > arenas_[p.src.value].size() ||
          c.dst_offset + c.bytes > arenas_[p.dst.value].size())
        return unexpected(errc::invalid_argument);
    }
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
      for (std::int64_t q = off / page_bytes_; q * page_bytes_ < off + c.bytes; ++q) f(table[static_cast<std::size_t>(q)]);
    }
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
      for (std::size_t i = 0; i < j.spans.size(); ++i) {
        const copy_span& c = j.spans[i];
        const part& p = j.parts[j.owner[i]];
        if (fault && fault(c)) {
          ok = false;
          break;
        }
        std::memcpy(arenas_[p.dst.value].data() + c.dst_offset, arenas_[p.src.value].data() + c.src_offset,
                    static_cast<std::size_t>(c.bytes));
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
  std::vector<host_arena> arenas_;
  std::vector<std::vector<page_hazard>> hazards_;
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
