// hybridcache/tiered/cuda/copy_engine.cuh
//
// The CUDA copy engine of the tiered store: the same interface as the host engine
// (tiered/host_copy_engine.hpp: submit a move ticket, get an event, wait for it), on real
// memory and real DMA:
//
//   - tier 0 (HBM) is one cudaMalloc arena; lower tiers are pinned host arenas:
//     cudaHostAlloc, or — for a tier bound to a NUMA node (a CXL expander) — page-aligned
//     memory bound with mbind, first-touched, then cudaHostRegister'ed (LMCache's recipe);
//   - two copy streams, offload (towards slower tiers) and onboard (towards HBM), created
//     non-blocking so they never serialize with the legacy default stream;
//   - per-page read/write hazards as in TensorRT-LLM's transfer manager: each job records
//     one event; a job on one stream first waits (cudaStreamWaitEvent) for the other
//     stream's last writer of each source page and last writer/readers of each destination
//     page, so no host synchronization is needed between moves;
//   - copies of adjacent pages coalesced (tiered/copy_plan.hpp), one cudaMemcpyAsync per run;
//   - step joins: `wait_for(compute)` makes both copy streams wait for the compute stream
//     (start of a step), `join_into(compute)` makes compute wait for both copy streams;
//   - per-layer events for layer-wise loading in a small ring (`cuda_layer_event_ring`);
//   - a move of several layer segments (a full-size copy) records one event per segment, so
//     `landed_segments` / `wait_segments` report it layer by layer (`layered_copy_engine`;
//     copies are coalesced within a segment, never across one);
//   - bandwidth per lower tier and direction measured at start-up with timed copies;
//   - the caller's current device is left as it was (the engine switches to its device for
//     its own calls and back).
//
// Every failing CUDA call throws `hybridcache::cuda_error` naming the call and the error;
// `tiered::move_entry` rolls the move back before the exception leaves, so no entry is
// left half-moved. Host code only (no kernels); compiles with nvcc -std=c++20 (sm_80,
// sm_90) and with a host compiler that sees the CUDA runtime headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/host_memory.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

/// Options of the CUDA copy engine. Aggregate with defaults.
struct copy_engine_options {
  int device = 0;                                      ///< CUDA device of the HBM tier
  bool measure_bandwidth = true;                       ///< time copies at start-up
  std::int64_t probe_bytes = std::int64_t{64} << 20;  ///< probe size (capped by the arenas)
  std::int64_t min_transfer_bytes = tiered::default_min_transfer_bytes;
};

/// Device + pinned-host arenas, two copy streams, per-page hazard events.
class copy_engine {
 public:
  /// @throws invalid_argument for a bad tier list or a storage tier (disk, redis: this
  ///         engine moves memory only; the host engine takes storage tiers); cuda_error when
  ///         an allocation, stream or event call fails (the message names the call).
  copy_engine(const std::vector<tiered::tier_config>& tiers, std::int64_t page_bytes, copy_engine_options options = {})
      : page_bytes_(page_bytes), options_(options) {
    tiered::validate_tiers(tiers, page_bytes);
    // Before, a disk tier got a pinned host arena of its capacity.
    for (std::size_t i = 0; i < tiers.size(); ++i)
      if (tiered::is_storage(tiers[i].kind))
        throw invalid_argument("cuda copy_engine: tier " + std::to_string(i) + " (" + std::string(tiered::to_string(tiers[i].kind)) +
                               ") is a storage tier; this engine copies between memory tiers only");
    const scoped_device on(options_.device);  // the caller's current device comes back after
    try {
      for (const auto& t : tiers) {
        const std::int64_t pages = t.capacity_bytes / page_bytes;
        arena a;
        a.bytes = pages * page_bytes;
        if (t.kind == tiered::tier_kind::hbm) {
          HYBRIDCACHE_CUDA_TRY(cudaMalloc(&a.ptr, static_cast<std::size_t>(a.bytes)));
          a.kind = arena_kind::device;
        } else if (t.numa_node >= 0) {
          a.host = tiered::host_arena(a.bytes, t.numa_node);
          HYBRIDCACHE_CUDA_TRY(cudaHostRegister(a.host.data(), static_cast<std::size_t>(a.bytes), cudaHostRegisterDefault));
          a.ptr = a.host.data();
          a.kind = arena_kind::registered;
        } else {
          HYBRIDCACHE_CUDA_TRY(cudaHostAlloc(&a.ptr, static_cast<std::size_t>(a.bytes), cudaHostAllocDefault));
          a.kind = arena_kind::pinned;
        }
        arenas_.push_back(std::move(a));
        hazards_.emplace_back(static_cast<std::size_t>(pages));
      }
      for (auto& s : streams_) HYBRIDCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      gbps_.assign(tiers.size(), {0.0, 0.0});
      if (options_.measure_bandwidth) measure();
    } catch (...) {
      release();
      throw;
    }
  }

  ~copy_engine() { release(); }
  copy_engine(const copy_engine&) = delete;
  copy_engine& operator=(const copy_engine&) = delete;

  /// Base address of tier `t`'s arena (device pointer for HBM, pinned host pointer below).
  [[nodiscard]] std::byte* base(tier_id t) const { return static_cast<std::byte*>(arenas_.at(t.value).ptr); }
  [[nodiscard]] std::int64_t arena_bytes(tier_id t) const { return arenas_.at(t.value).bytes; }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] cudaStream_t stream(copy_stream s) const noexcept { return streams_[static_cast<std::size_t>(s)]; }
  /// Measured bandwidth (GB/s) between HBM and tier `t` in the direction of `s`.
  [[nodiscard]] double measured_gbps(tier_id t, copy_stream s) const { return gbps_.at(t.value)[static_cast<std::size_t>(s)]; }

  /// Enqueues a prepared move on the stream of its direction. The event counts the
  /// ticket's layer segments; a full-size copy records an event after each segment, any other
  /// (a sparsified copy) lands them all at once. `invalid_argument` for a ticket outside the
  /// arenas. @throws cuda_error when a CUDA call fails.
  [[nodiscard]] expected<copy_event> submit(const move_ticket& t) {
    return tiered::submit_as_group(*this, t);
  }

  /// Enqueues several prepared moves on one stream with their layer segments interleaved
  /// (`grouped_copy_engine`: segment s of every ticket before segment s + 1 of any, in
  /// proportion to each ticket's segment count; `interleave_segments`), each ticket its own
  /// job and event (an event after each of its segments, the last one its job's). The
  /// stream runs them in that order, so layer 0 of every entry of a hit lands first.
  /// invalid_argument for a ticket outside the arenas, tickets of both directions, or sizes
  /// that differ (nothing submitted). @throws cuda_error when a CUDA call fails.
  [[nodiscard]] expected<void> submit_group(std::span<const move_ticket> tickets, std::span<copy_event> events) {
    if (tickets.empty() || tickets.size() != events.size()) return unexpected(errc::invalid_argument);
    const copy_stream s = tiered::stream_for(tickets.front());
    std::vector<group_part> parts;
    std::vector<tiered::layered_copies> plans;
    parts.reserve(tickets.size());
    plans.reserve(tickets.size());
    for (const move_ticket& t : tickets) {
      if (t.src.value >= arenas_.size() || t.dst.value >= arenas_.size() || tiered::stream_for(t) != s)
        return unexpected(errc::invalid_argument);
      parts.push_back({t.src, t.dst, std::max<std::int32_t>(1, t.segments)});
      plans.push_back(tiered::plan_layered_copies(t, page_bytes_));
    }
    auto first = issue(parts, plans, s);
    if (!first) return unexpected(first.error());
    for (std::size_t k = 0; k < tickets.size(); ++k) events[k] = copy_event{s, *first + k, parts[k].segments};
    return {};
  }

  /// Enqueues spans from tier `src` to tier `dst` on stream `s`. `segment_ends` (optional):
  /// segment i ends after span segment_ends[i] - 1 (ascending, the last one spans.size());
  /// an event is recorded after each segment but the last.
  [[nodiscard]] expected<copy_event> submit(tier_id src, tier_id dst, const std::vector<copy_span>& spans, copy_stream s,
                                            const std::vector<std::size_t>& segment_ends = {}) {
    if (src.value >= arenas_.size() || dst.value >= arenas_.size()) return unexpected(errc::invalid_argument);
    if (!tiered::valid_segment_ends(segment_ends, spans.size())) return unexpected(errc::invalid_argument);
    const auto segments = static_cast<std::int32_t>(segment_ends.empty() ? 1 : segment_ends.size());
    const std::vector<group_part> parts{group_part{src, dst, segments}};
    const std::vector<tiered::layered_copies> plans{tiered::layered_copies{spans, segment_ends}};
    auto first = issue(parts, plans, s);
    if (!first) return unexpected(first.error());
    return copy_event{s, *first, segments};
  }

  /// True when the job has completed on the device.
  [[nodiscard]] bool query(copy_event ev) {
    std::lock_guard lock(mu_);
    retire();
    return completed_[static_cast<std::size_t>(ev.stream)] >= ev.seq;
  }

  /// Blocks the host until the job completed. @throws cuda_error if the copy failed.
  /// The event is synchronised outside the lock, so it is marked waited first: a job that
  /// retires meanwhile (another thread's `query`) does not hand its event to a new job
  /// while this wait still synchronises it (it is recycled by the last waiter).
  [[nodiscard]] expected<void> wait(copy_event ev) {
    const auto si = static_cast<std::size_t>(ev.stream);
    cudaEvent_t e = nullptr;
    {
      std::lock_guard lock(mu_);
      retire();
      for (auto& j : inflight_[si])
        if (j.seq == ev.seq) {
          j.waiters += 1;
          e = j.event;
        }
    }
    if (e == nullptr) return {};  // already complete
    synchronize_marked(si, e);
    return {};
  }

  /// How many leading layer segments of the job have landed on the device, without
  /// blocking: `ev.segments` once it completed. @throws cuda_error if a copy failed.
  [[nodiscard]] std::int32_t landed_segments(copy_event ev) {
    std::lock_guard lock(mu_);
    retire();
    const auto si = static_cast<std::size_t>(ev.stream);
    if (completed_[si] >= ev.seq) return ev.segments;
    for (const auto& j : inflight_[si]) {
      if (j.seq != ev.seq) continue;
      std::int32_t n = 0;
      for (cudaEvent_t e : j.segment_events) {
        const cudaError_t st = cudaEventQuery(e);
        if (st == cudaErrorNotReady) break;
        throw_on_cuda_error(st, "cudaEventQuery", __FILE__, __LINE__);
        ++n;
      }
      return n;
    }
    return 0;  // never issued
  }

  /// Blocks the host until the job's first `n` layer segments landed (the whole job need
  /// not have). invalid_argument for n outside [0, ev.segments]. @throws cuda_error if a
  /// copy failed. The segment's event is marked waited first, as `wait` does.
  [[nodiscard]] expected<void> wait_segments(copy_event ev, std::int32_t n) {
    if (n < 0 || n > ev.segments) return unexpected(errc::invalid_argument);
    if (n == 0) return {};
    const auto si = static_cast<std::size_t>(ev.stream);
    cudaEvent_t e = nullptr;
    {
      std::lock_guard lock(mu_);
      retire();
      if (completed_[si] >= ev.seq) return {};
      for (auto& j : inflight_[si])
        if (j.seq == ev.seq) {
          if (static_cast<std::size_t>(n) > j.segment_events.size()) break;  // the whole job: wait()
          j.segment_waiters[static_cast<std::size_t>(n - 1)] += 1;
          e = j.segment_events[static_cast<std::size_t>(n - 1)];
        }
    }
    if (e == nullptr) return wait(ev);
    synchronize_marked(si, e);
    return {};
  }

  /// Both copy streams wait for the work queued on `compute` so far (start of a step).
  void wait_for(cudaStream_t compute) {
    std::lock_guard lock(mu_);
    cudaEvent_t e = take_event();
    HYBRIDCACHE_CUDA_TRY(cudaEventRecord(e, compute));
    for (auto s : streams_) HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(s, e, 0));
    spare_.push_back(e);  // reusable at once: waits captured the event's current state
  }

  /// `compute` waits for everything queued on both copy streams (end of a step). No host sync.
  void join_into(cudaStream_t compute) {
    std::lock_guard lock(mu_);
    for (auto s : streams_) {
      cudaEvent_t e = take_event();
      HYBRIDCACHE_CUDA_TRY(cudaEventRecord(e, s));
      HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(compute, e, 0));
      spare_.push_back(e);
    }
  }

  /// Blocks until both copy streams are idle.
  void synchronize() {
    for (auto s : streams_) HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(s));
    std::lock_guard lock(mu_);
    retire();
  }

  /// Returns the counters and resets them.
  [[nodiscard]] tiered::copy_stats take_stats() {
    std::lock_guard lock(mu_);
    return std::exchange(stats_, tiered::copy_stats{});
  }

 private:
  // One ticket of a group: its tiers and its event's segments (its copies: the plan of the
  // same index).
  struct group_part {
    tier_id src, dst;
    std::int32_t segments;
  };

  // Issues the parts' copies on stream `s` in `interleave_segments` order, one job per part
  // (consecutive sequence numbers; an event after each segment of a part, its last one the
  // job's event: the last segments come in part order, so jobs complete in sequence order,
  // as `retire` expects). Returns the first part's sequence number.
  expected<std::uint64_t> issue(const std::vector<group_part>& parts, const std::vector<tiered::layered_copies>& plans,
                                copy_stream s) {
    for (std::size_t k = 0; k < parts.size(); ++k)
      for (const auto& c : plans[k].spans)
        if (c.bytes <= 0 || c.src_offset < 0 || c.dst_offset < 0 || c.src_offset + c.bytes > arenas_[parts[k].src.value].bytes ||
            c.dst_offset + c.bytes > arenas_[parts[k].dst.value].bytes)
          return unexpected(errc::invalid_argument);
    const std::vector<tiered::group_step> order = tiered::interleave_segments(plans);
    std::lock_guard lock(mu_);
    retire();
    const auto si = static_cast<std::size_t>(s), other = 1 - si;
    const std::uint64_t first = submitted_[si] + 1;
    std::uint64_t wait_other = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      for_pages(parts[k].src, plans[k].spans, true, [&](page_hazard& h) {
        if (h.writer_stream == other) wait_other = std::max(wait_other, h.writer_seq);
      });
      for_pages(parts[k].dst, plans[k].spans, false, [&](page_hazard& h) {
        if (h.writer_stream == other) wait_other = std::max(wait_other, h.writer_seq);
        wait_other = std::max(wait_other, h.reader_seq[other]);
      });
    }
    if (wait_other > completed_[other])
      for (const auto& j : inflight_[other])
        if (j.seq == wait_other) HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(streams_[si], j.event, 0));
    std::vector<inflight_job> jobs(parts.size());
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::size_t between = plans[k].ends.empty() ? 0 : plans[k].ends.size() - 1;
      jobs[k].seq = first + k;
      jobs[k].segment_events.reserve(between);
      jobs[k].segment_waiters.assign(between, 0);
    }
    try {
      for (const tiered::group_step& g : order) {
        const group_part& p = parts[g.part];
        const tiered::layered_copies& plan = plans[g.part];
        const auto [lo, hi] = tiered::segment_span_range(plan, g.segment);
        for (std::size_t i = lo; i < hi; ++i) {
          const copy_span& c = plan.spans[i];
          HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(base(p.dst) + c.dst_offset, base(p.src) + c.src_offset,
                                               static_cast<std::size_t>(c.bytes), cudaMemcpyDefault, streams_[si]));
        }
        inflight_job& j = jobs[g.part];
        const bool last = static_cast<std::size_t>(g.segment) + 1 >= std::max<std::size_t>(plan.ends.size(), 1);
        cudaEvent_t e = take_event();
        (last ? j.event : j.segment_events.emplace_back()) = e;
        HYBRIDCACHE_CUDA_TRY(cudaEventRecord(e, streams_[si]));
      }
    } catch (...) {
      for (const inflight_job& j : jobs) {
        for (cudaEvent_t e : j.segment_events) spare_.push_back(e);
        if (j.event != nullptr) spare_.push_back(j.event);
      }
      throw;
    }
    submitted_[si] += parts.size();
    for (auto& j : jobs) inflight_[si].push_back(std::move(j));
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::uint64_t seq = first + k;
      for_pages(parts[k].src, plans[k].spans, true, [&](page_hazard& h) { h.reader_seq[si] = seq; });
      for_pages(parts[k].dst, plans[k].spans, false, [&](page_hazard& h) {
        h.writer_stream = si;
        h.writer_seq = seq;
      });
      stats_.jobs += 1;
      for (const auto& c : plans[k].spans) {
        stats_.transfers += 1;
        stats_.small_transfers += c.bytes < options_.min_transfer_bytes;
        stats_.bytes += c.bytes;
      }
    }
    return first;
  }

  enum class arena_kind : std::uint8_t { device, pinned, registered };
  struct arena {
    void* ptr = nullptr;
    std::int64_t bytes = 0;
    arena_kind kind = arena_kind::device;
    tiered::host_arena host;
  };
  struct page_hazard {
    std::size_t writer_stream = 2;
    std::uint64_t writer_seq = 0;
    std::array<std::uint64_t, 2> reader_seq{};
  };

  template <class F>
  void for_pages(tier_id t, const std::vector<copy_span>& spans, bool source, F&& f) {
    auto& table = hazards_[t.value];
    for (const auto& c : spans) {
      const std::int64_t off = source ? c.src_offset : c.dst_offset;
      for (std::int64_t p = off / page_bytes_; p * page_bytes_ < off + c.bytes; ++p) f(table[static_cast<std::size_t>(p)]);
    }
  }

  cudaEvent_t take_event() {
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    const scoped_device on(options_.device);  // events belong to the device current at creation
    cudaEvent_t e = nullptr;
    HYBRIDCACHE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Retires completed jobs in stream order (caller holds mu_).
  void retire() {
    for (std::size_t s = 0; s < 2; ++s)
      while (!inflight_[s].empty()) {
        const cudaError_t st = cudaEventQuery(inflight_[s].front().event);
        if (st == cudaErrorNotReady) break;
        throw_on_cuda_error(st, "cudaEventQuery", __FILE__, __LINE__);
        const inflight_job& j = inflight_[s].front();
        completed_[s] = j.seq;
        if (j.waiters > 0) waited_[j.event] += j.waiters;  // recycled by its last waiter
        else spare_.push_back(j.event);
        for (std::size_t k = 0; k < j.segment_events.size(); ++k)
          if (j.segment_waiters[k] > 0) waited_[j.segment_events[k]] += j.segment_waiters[k];
          else spare_.push_back(j.segment_events[k]);
        inflight_[s].pop_front();
      }
  }

  void measure() {
    // Timing events (the pooled ones have timing disabled), destroyed on every way out.
    const owned_event start, stop;
    const cudaEvent_t a = start.get(), b = stop.get();
    for (std::size_t t = 1; t < arenas_.size(); ++t) {
      const std::int64_t n = std::min({options_.probe_bytes, arenas_[0].bytes, arenas_[t].bytes});
      for (std::size_t dir = 0; dir < 2; ++dir) {
        void* dst = dir == 0 ? arenas_[t].ptr : arenas_[0].ptr;
        const void* src = dir == 0 ? arenas_[0].ptr : arenas_[t].ptr;
        float best_ms = 0.0f;
        for (int rep = 0; rep < 3; ++rep) {
          HYBRIDCACHE_CUDA_TRY(cudaEventRecord(a, streams_[dir]));
          HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n), cudaMemcpyDefault, streams_[dir]));
          HYBRIDCACHE_CUDA_TRY(cudaEventRecord(b, streams_[dir]));
          HYBRIDCACHE_CUDA_TRY(cudaEventSynchronize(b));
          float ms = 0.0f;
          HYBRIDCACHE_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
          if (rep == 0 || ms < best_ms) best_ms = ms;
        }
        gbps_[t][dir] = best_ms > 0 ? static_cast<double>(n) / (static_cast<double>(best_ms) * 1e6) : 0.0;
      }
    }
  }

  void release() noexcept {
    for (auto s : streams_)
      if (s != nullptr) (void)cudaStreamSynchronize(s);
    for (auto& q : inflight_)
      for (auto& j : q) {
        (void)cudaEventDestroy(j.event);
        for (cudaEvent_t e : j.segment_events) (void)cudaEventDestroy(e);
      }
    for (auto e : spare_) (void)cudaEventDestroy(e);
    for (auto& [e, n] : waited_) (void)cudaEventDestroy(e);
    waited_.clear();
    inflight_ = {};
    spare_.clear();
    for (auto& s : streams_)
      if (s != nullptr) {
        (void)cudaStreamDestroy(s);
        s = nullptr;
      }
    for (auto& a : arenas_) {
      if (a.ptr == nullptr) continue;
      if (a.kind == arena_kind::device) (void)cudaFree(a.ptr);
      else if (a.kind == arena_kind::pinned) (void)cudaFreeHost(a.ptr);
      else (void)cudaHostUnregister(a.ptr);
      a.ptr = nullptr;
    }
    arenas_.clear();
  }

  std::int64_t page_bytes_;
  copy_engine_options options_;
  std::vector<arena> arenas_;
  std::vector<std::vector<page_hazard>> hazards_;
  std::vector<std::array<double, 2>> gbps_;
  std::array<cudaStream_t, 2> streams_{};
  struct inflight_job {
    std::uint64_t seq = 0;
    cudaEvent_t event = nullptr;
    int waiters = 0;  // threads in `wait` synchronising this event
    std::vector<cudaEvent_t> segment_events;  // after each layer segment but the last
    std::vector<int> segment_waiters;         // threads in `wait_segments` synchronising each
  };
  // Synchronises an event of a job on stream `si` that the caller marked waited (a job's or
  // a segment's waiter count, under mu_), outside the lock, then unmarks it: a job that
  // retired meanwhile left the event to its last waiter, which recycles it.
  void synchronize_marked(std::size_t si, cudaEvent_t e) {
    const cudaError_t st = cudaEventSynchronize(e);
    std::lock_guard lock(mu_);
    bool found = false;
    for (auto& j : inflight_[si]) {
      if (j.event == e) {
        j.waiters -= 1;
        found = true;
      }
      for (std::size_t k = 0; k < j.segment_events.size(); ++k)
        if (j.segment_events[k] == e) {
          j.segment_waiters[k] -= 1;
          found = true;
        }
    }
    if (!found) {
      const auto it = waited_.find(e);
      if (it != waited_.end() && --it->second == 0) {
        waited_.erase(it);
        spare_.push_back(e);
      }
    }
    throw_on_cuda_error(st, "cudaEventSynchronize", __FILE__, __LINE__);
    retire();
  }
  std::array<std::deque<inflight_job>, 2> inflight_;
  std::map<cudaEvent_t, int> waited_;  // retired events still synchronised by waiters
  std::vector<cudaEvent_t> spare_;
  std::array<std::uint64_t, 2> submitted_{}, completed_{};
  tiered::copy_stats stats_;
  std::mutex mu_;
};

static_assert(grouped_copy_engine<copy_engine> && arena_copy_engine<copy_engine>);

/// Per-layer CUDA events in a ring of event sets (layer-wise loading; 3 sets by default,
/// as SGLang HiCache): the loader records layer l's event on the onboard stream after
/// queuing its copy; the compute stream waits for exactly that event before layer l. A set
/// is reused only after every one of its events has completed (`begin` returns `busy`).
///
/// `wait` blocks the calling (host) thread until layer l of the set's current use has been
/// recorded, then queues the stream wait: a CUDA stream wait on an event not yet recorded
/// in this use would wait on the previous use's record (long complete) and let the layer
/// run before its copy was even queued. Thread-safe: the loader records on one thread while
/// the compute thread waits on another. Costs: record/query O(1); wait O(1) plus the time
/// until the record.
class cuda_layer_event_ring {
 public:
  /// @throws invalid_argument for layers/sets <= 0; cuda_error if event creation fails.
  cuda_layer_event_ring(std::int32_t layers, std::int32_t sets = 3) : layers_(layers), sets_(sets) {
    HYBRIDCACHE_EXPECTS(layers > 0 && sets > 0, invalid_argument, "cuda_layer_event_ring: layers and sets must be > 0");
    events_.resize(static_cast<std::size_t>(layers) * static_cast<std::size_t>(sets), nullptr);
    recorded_.assign(events_.size(), 0);
    try {
      for (auto& e : events_) HYBRIDCACHE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~cuda_layer_event_ring() { destroy(); }
  cuda_layer_event_ring(const cuda_layer_event_ring&) = delete;
  cuda_layer_event_ring& operator=(const cuda_layer_event_ring&) = delete;

  /// Claims the next set; `busy` while any event of it (from its last use) is pending.
  [[nodiscard]] expected<std::int32_t> begin() {
    std::lock_guard lock(mu_);
    const std::int32_t s = next_;
    for (std::int32_t l = 0; l < layers_; ++l) {
      const auto i = index(s, l);
      if (!recorded_[i]) continue;
      const cudaError_t st = cudaEventQuery(events_[i]);
      if (st == cudaErrorNotReady) return unexpected(errc::busy);
      throw_on_cuda_error(st, "cudaEventQuery", __FILE__, __LINE__);
    }
    for (std::int32_t l = 0; l < layers_; ++l) recorded_[index(s, l)] = 0;
    next_ = (next_ + 1) % sets_;
    return s;
  }
  /// Records layer `l` of set `s` on `stream` (after that layer's copies were queued) and
  /// wakes a `wait` for it.
  void record(std::int32_t s, std::int32_t l, cudaStream_t stream) {
    {
      std::lock_guard lock(mu_);
      HYBRIDCACHE_CUDA_TRY(cudaEventRecord(events_.at(index(s, l)), stream));
      recorded_[index(s, l)] = 1;
    }
    cv_.notify_all();
  }
  /// `compute` waits for layer `l` of set `s` only (no host synchronization with the GPU),
  /// once the loader has recorded it in this use (the host thread blocks until then).
  void wait(std::int32_t s, std::int32_t l, cudaStream_t compute) const {
    std::unique_lock lock(mu_);
    const auto i = index(s, l);
    cv_.wait(lock, [&] { return recorded_[i] != 0; });
    HYBRIDCACHE_CUDA_TRY(cudaStreamWaitEvent(compute, events_[i], 0));
  }
  /// True when layer `l` of set `s` was recorded in this use and has completed.
  [[nodiscard]] bool query(std::int32_t s, std::int32_t l) const {
    std::lock_guard lock(mu_);
    const auto i = index(s, l);
    if (!recorded_[i]) return false;  // an event not recorded yet reports complete
    const cudaError_t st = cudaEventQuery(events_[i]);
    if (st == cudaErrorNotReady) return false;
    throw_on_cuda_error(st, "cudaEventQuery", __FILE__, __LINE__);
    return true;
  }

 private:
  [[nodiscard]] std::size_t index(std::int32_t s, std::int32_t l) const {
    HYBRIDCACHE_EXPECTS(s >= 0 && s < sets_ && l >= 0 && l < layers_, invalid_argument, "cuda_layer_event_ring: set or layer out of range");
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(l);
  }
  void destroy() noexcept {
    for (auto& e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    events_.clear();
  }
  std::int32_t layers_, sets_, next_ = 0;
  std::vector<cudaEvent_t> events_;
  std::vector<std::uint8_t> recorded_;  // guarded by mu_
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
};

}  // namespace hybridcache::tiered
