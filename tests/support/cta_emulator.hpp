// tests/support/cta_emulator.hpp — runs CUDA kernel bodies on the host, one real thread per
// lane, so that the device code of include/hybridcache/*/cuda/ is executed (under ASan, UBSan
// and ThreadSanitizer) on machines without a GPU.
//
// A kernel body is written once against an execution context (the library's `cuda_context`
// under nvcc, `hctest::emu::lane` here; attention/kernel_context.hpp lists what a context
// offers). `launch(shape, body)` runs `body(lane)` for every thread of every CTA of the grid:
//
//   threads   every lane is its own std::thread (created once per launch and reused from CTA
//             to CTA); CTAs run `concurrent_ctas` at a time (2 by default), so data races
//             between lanes or between CTAs are real races that ThreadSanitizer reports;
//   barriers  `sync_threads` (every live lane of the CTA) and `sync_warp` (every lane of the
//             warp) are barriers; warp shuffles and votes are warp barriers that exchange
//             values, in the hardware's order (`shfl_xor` reads lane ^ mask, `shfl_up` lane -
//             delta or keeps its own value, exactly as __shfl_*_sync with a full mask);
//   checks    a barrier that cannot complete is reported, never hung: when every live lane
//             of a CTA is blocked and none of their barriers can complete (a deadlock), when
//             a lane returns while others wait at __syncthreads or after any lane returned,
//             when lanes of one warp meet different collectives, when lanes of a CTA meet at
//             different __syncthreads sites (legal hardware, never intended here); the report
//             names every lane's state and source line. A lane blocked for `hang_timeout`
//             (an endless loop elsewhere) aborts the process with the same report;
//   shared    dynamic shared memory is allocated per CTA at exactly the launch's byte count
//             (AddressSanitizer sees any access past it) and filled with NaN (0x7FC0DEAD), so
//             a read before a write poisons the result; without ASan a guard zone after it is
//             checked when the CTA ends;
//   grid      the launch is checked as the driver would (blocks in [1, 2^31 - 1], threads in
//             [1, 1024], shared memory <= the largest opt-in limit, 227 KiB).
//
// Cost: a futex wait per lane per barrier, 50-100 us per warp collective on a busy 2-core
// machine (3-4x that under ThreadSanitizer): use small shapes.
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <source_location>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define HCTEST_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HCTEST_EMU_ASAN 1
#endif
#endif
#ifndef HCTEST_EMU_ASAN
#define HCTEST_EMU_ASAN 0
#endif

namespace hctest::emu {

/// Where a barrier or warp operation was called: std::source_location where the standard
/// library has it. libstdc++ 12's needs __builtin_source_location, which clang++ 14 lacks (the
/// sanitizers preset builds with clang++), so there the same four values come from
/// __builtin_FILE/FUNCTION/LINE/COLUMN, which clang evaluates at the caller as current() is.
#if defined(__cpp_lib_source_location)
using source_site = std::source_location;
#else
class source_site {
 public:
  static constexpr source_site current(const char* file = __builtin_FILE(), const char* function = __builtin_FUNCTION(),
                                       std::uint_least32_t line = __builtin_LINE(),
                                       std::uint_least32_t column = __builtin_COLUMN()) noexcept {
    source_site s;
    s.file_ = file;
    s.function_ = function;
    s.line_ = line;
    s.column_ = column;
    return s;
  }
  constexpr source_site() noexcept = default;
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr std::uint_least32_t line() const noexcept { return line_; }
  constexpr std::uint_least32_t column() const noexcept { return column_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  std::uint_least32_t line_ = 0;
  std::uint_least32_t column_ = 0;
};
#endif

/// A launch: a 1-D grid of `blocks` CTAs of `threads` lanes with `shared_bytes` of dynamic
/// shared memory (the library's `kernel_launch_shape` converts to it).
struct launch_config {
  std::uint64_t blocks = 1;
  std::uint32_t threads = 128;
  std::size_t shared_bytes = 0;
};

/// Limits the driver enforces on a launch (sm_80 / sm_90: the same grid and block limits;
/// the shared-memory limit is the larger, sm_90's opt-in maximum).
inline constexpr std::uint64_t max_grid_x = 2147483647ull;
inline constexpr std::uint32_t max_block_threads = 1024;
inline constexpr std::size_t max_shared_bytes = 232448;

struct options {
  int concurrent_ctas = 2;
  std::chrono::milliseconds hang_timeout{120000};
  /// Emulate only the CTAs for which this returns true (all when empty): to run the CTAs of
  /// a few chosen entries of a huge grid.
  std::function<bool(std::uint64_t)> only_blocks;
};

/// What a failed emulation reports: the first error and every lane's state at that moment.
class emulation_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// True when `cfg` is a launch the driver accepts; otherwise `why` says what is wrong.
inline bool valid_launch(const launch_config& cfg, std::string* why = nullptr) {
  auto fail = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (cfg.blocks < 1 || cfg.blocks > max_grid_x)
    return fail("grid of " + std::to_string(cfg.blocks) + " blocks outside [1, 2^31 - 1]");
  if (cfg.threads < 1 || cfg.threads > max_block_threads)
    return fail("block of " + std::to_string(cfg.threads) + " threads outside [1, 1024]");
  if (cfg.shared_bytes > max_shared_bytes)
    return fail(std::to_string(cfg.shared_bytes) + " B of dynamic shared memory, over the 227 KiB limit");
  return true;
}

namespace detail {

enum class op : std::uint8_t { none, sync_warp, shfl_xor, shfl_up, shfl_down, shfl_idx, ballot };

inline const char* op_name(op o) {
  switch (o) {
    case op::none: return "running";
    case op::sync_warp: return "__syncwarp";
    case op::shfl_xor: return "__shfl_xor_sync";
    case op::shfl_up: return "__shfl_up_sync";
    case op::shfl_down: return "__shfl_down_sync";
    case op::shfl_idx: return "__shfl_sync";
    case op::ballot: return "__ballot_sync";
  }
  return "?";
}

struct aborted {};  // thrown in every lane once the CTA failed, to unwind the body

inline constexpr std::uint32_t poison_word = 0x7FC0DEADu;  // a quiet NaN as float
inline constexpr std::size_t guard_bytes = HCTEST_EMU_ASAN ? 0 : 256;

// State of one CTA, shared by its lanes. Bookkeeping is guarded by `m_`; a blocked lane
// waits on its barrier's generation counter (a futex), outside the mutex.
class cta {
 public:
  cta(std::uint64_t block, const launch_config& cfg, std::atomic<std::uint64_t>& progress)
      : block_(block), threads_(cfg.threads), live_(cfg.threads), shared_bytes_(cfg.shared_bytes),
        progress_(&progress), nwarps_((cfg.threads + 31) / 32), warps_(new warp[nwarps_]), lanes_(cfg.threads) {
    for (std::uint32_t w = 0; w < nwarps_; ++w) warps_[w].lanes = std::min<std::uint32_t>(32, threads_ - w * 32);
    // Exactly the launch's bytes (ASan checks the bounds), NaN-filled, plus a guard without ASan.
    const std::size_t total = shared_bytes_ + guard_bytes;
    shared_.reset(new std::byte[total == 0 ? 0 : (total + 3) / 4 * 4]);
    for (std::size_t i = 0; i + 4 <= total; i += 4) std::memcpy(shared_.get() + i, &poison_word, 4);
  }

  [[nodiscard]] std::uint64_t block() const noexcept { return block_; }
  [[nodiscard]] std::uint32_t threads() const noexcept { return threads_; }
  [[nodiscard]] std::byte* shared() const noexcept { return shared_.get(); }

  void sync_threads(std::uint32_t tid, const source_site& at) {
    std::unique_lock lk(m_);
    throw_if_failed();
    lanes_[tid] = {lane_state::at_cta, op::none, at};
    if (exited_ > 0)
      fail(lk, "lane " + std::to_string(first_exited_) + " returned before this __syncthreads (" + where(at) +
                   "): a barrier in code not every thread reaches");
    if (bar_arrived_ == 0) {
      bar_site_ = at;
    } else if (!same_site(bar_site_, at)) {
      fail(lk, "lanes meet at different __syncthreads: " + where(bar_site_) + " and " + where(at));
    }
    if (++bar_arrived_ == live_) {
      bar_arrived_ = 0;
      blocked_ -= live_ - 1;
      for (auto& l : lanes_)
        if (l.state == lane_state::at_cta) l.state = lane_state::running;
      bar_gen_.fetch_add(1, std::memory_order_release);
      progress_->fetch_add(1, std::memory_order_relaxed);
      lk.unlock();
      wake_all(bar_gen_);
      return;
    }
    const std::uint32_t gen = bar_gen_.load(std::memory_order_relaxed);
    ++blocked_;
    check_deadlock(lk);
    lk.unlock();
    wait(bar_gen_, gen);
  }

  // A warp collective: lane `tid` contributes `value`; returns the value of lane `src(lane)`
  // (src < 0: its own) as exchanged at this collective.
  template <class Src>
  std::uint32_t warp_op(std::uint32_t tid, op kind, std::uint32_t value, Src src, const source_site& at) {
    std::unique_lock lk(m_);
    throw_if_failed();
    const std::uint32_t w = tid / 32, lane = tid % 32;
    warp& W = warps_[w];
    lanes_[tid] = {lane_state::at_warp, kind, at};
    if (W.exited > 0)
      fail(lk, std::string(op_name(kind)) + " (" + where(at) + ") in warp " + std::to_string(w) +
                   " after one of its lanes returned");
    if (W.arrived == 0) {
      W.kind = kind;
      W.site = at;
    } else if (W.kind != kind) {
      fail(lk, "warp " + std::to_string(w) + " diverged: lanes at " + op_name(W.kind) + " (" + where(W.site) +
                   ") and at " + op_name(kind) + " (" + where(at) + ")");
    }
    const std::uint32_t gen = W.gen.load(std::memory_order_relaxed);
    W.buf[gen & 1][lane] = value;
    if (++W.arrived == W.lanes) {
      W.arrived = 0;
      blocked_ -= W.lanes - 1;
      for (std::uint32_t l = 0; l < W.lanes; ++l) lanes_[w * 32 + l].state = lane_state::running;
      W.gen.fetch_add(1, std::memory_order_release);
      progress_->fetch_add(1, std::memory_order_relaxed);
      lk.unlock();
      wake_all(W.gen);
    } else {
      ++blocked_;
      check_deadlock(lk);
      lk.unlock();
      wait(W.gen, gen);
    }
    // The buffer of this generation is rewritten only two collectives later, which needs
    // this lane's next arrival: reading it here without the mutex is safe.
    const std::uint32_t* vals = W.buf[gen & 1];
    if (kind == op::ballot) {
      std::uint32_t mask = 0;
      for (std::uint32_t l = 0; l < W.lanes; ++l) mask |= (vals[l] != 0 ? 1u : 0u) << l;
      return mask;
    }
    const int s = src(static_cast<int>(lane), W.lanes);
    return vals[s < 0 ? lane : static_cast<std::uint32_t>(s)];
  }

  // Called once per lane when its body returned (or unwound).
  void exit_lane(std::uint32_t tid) {
    std::unique_lock lk(m_);
    lanes_[tid].state = lane_state::exited;
    warp& W = warps_[tid / 32];
    ++W.exited;
    if (exited_++ == 0) first_exited_ = tid;
    --live_;
    progress_->fetch_add(1, std::memory_order_relaxed);
    if (failed_.load()) return;
    if (W.arrived > 0)
      fail_nothrow("lane " + std::to_string(tid) + " returned while its warp waits at " + op_name(W.kind) + " (" +
                   where(W.site) + ")");
    else if (bar_arrived_ > 0)
      fail_nothrow("lane " + std::to_string(tid) + " returned while " + std::to_string(bar_arrived_) +
                   " lanes wait at __syncthreads (" + where(bar_site_) + ")");
    else if (live_ > 0 && blocked_ == live_)
      fail_nothrow("deadlock: every live lane waits at a barrier that cannot complete");
  }

  void body_threw(std::uint32_t tid, const std::string& what) {
    std::unique_lock lk(m_);
    if (!failed_.load()) fail_nothrow("lane " + std::to_string(tid) + " threw: " + what);
  }

  // After all lanes joined: the failure (empty when none), plus the guard-zone check.
  std::string finish() {
    std::lock_guard lk(m_);
    if (failed_.load()) return failure_;
    for (std::size_t i = 0; i + 4 <= guard_bytes; i += 4)
      if (std::memcmp(shared_.get() + shared_bytes_ + i, &poison_word, 4) != 0)
        return "block " + std::to_string(block_) + ": shared memory written past its " + std::to_string(shared_bytes_) +
               " B (guard byte " + std::to_string(i) + ")";
    return {};
  }

  // What every lane is doing (for a hang report).
  std::string describe(const std::string& why) {
    std::lock_guard lk(m_);
    return report(why);
  }
  [[nodiscard]] bool done() {
    std::lock_guard lk(m_);
    return live_ == 0;
  }

 private:
  enum class lane_state : std::uint8_t { running, at_cta, at_warp, exited };
  struct lane_info {
    lane_state state = lane_state::running;
    op kind = op::none;
    source_site site{};
  };
  struct warp {
    std::uint32_t lanes = 32, arrived = 0, exited = 0;
    std::atomic<std::uint32_t> gen{0};
    op kind = op::none;
    source_site site{};
    std::uint32_t buf[2][32]{};  // double-buffered by generation parity
  };

  static bool same_site(const source_site& a, const source_site& b) {
    return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
  }
  static std::string where(const source_site& s) {
    std::string f = s.file_name();
    if (const auto p = f.find("include/hybridcache/"); p != std::string::npos) f = f.substr(p + 8);
    else if (const auto q = f.rfind('/'); q != std::string::npos) f = f.substr(q + 1);
    return f + ":" + std::to_string(s.line());
  }

  // Blocks until `gen` moves on from `old` (or the CTA failed). The happens-before edge is
  // the release/acquire pair on `gen`; the futex only sleeps (on Linux a bare FUTEX_WAIT:
  // std::atomic::wait spins first, which with hundreds of lane threads on two cores, and
  // under ThreadSanitizer, cost about 3x the time).
  void wait(std::atomic<std::uint32_t>& gen, std::uint32_t old) {
    while (gen.load(std::memory_order_acquire) == old) {
#if defined(__linux__)
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&gen), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
#else
      gen.wait(old, std::memory_order_acquire);
#endif
    }
    if (failed_.load()) throw aborted{};
  }
  static void wake_all(std::atomic<std::uint32_t>& gen) {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&gen), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#else
    gen.notify_all();
#endif
  }
  void throw_if_failed() const {
    if (failed_.load()) throw aborted{};
  }
  // Every live lane blocked and the arrival that made it so completed nothing: a deadlock.
  void check_deadlock(std::unique_lock<std::mutex>& lk) {
    if (blocked_ == live_) fail(lk, "deadlock: every live lane waits at a barrier that cannot complete");
  }
  [[noreturn]] void fail(std::unique_lock<std::mutex>&, const std::string& why) {
    fail_nothrow(why);
    throw aborted{};
  }
  // Records the failure and wakes every blocked lane (they unwind with `aborted`).
  void fail_nothrow(const std::string& why) {
    if (!failed_.load()) failure_ = report(why);
    failed_.store(true);
    bar_gen_.fetch_add(1, std::memory_order_release);
    wake_all(bar_gen_);
    for (std::uint32_t w = 0; w < nwarps_; ++w) {
      warps_[w].gen.fetch_add(1, std::memory_order_release);
      wake_all(warps_[w].gen);
    }
  }
  std::string report(const std::string& why) const {
    std::string r = "block " + std::to_string(block_) + ": " + why + "\n  lanes:";
    // Runs of lanes in the same state, so a 128-lane report stays short.
    std::uint32_t t = 0;
    while (t < threads_) {
      std::uint32_t e = t + 1;
      while (e < threads_ && lanes_[e].state == lanes_[t].state && lanes_[e].kind == lanes_[t].kind &&
             (lanes_[t].state == lane_state::running || lanes_[t].state == lane_state::exited ||
              same_site(lanes_[e].site, lanes_[t].site)))
        ++e;
      r += "\n    " + std::to_string(t) + (e - t > 1 ? "-" + std::to_string(e - 1) : "") + ": ";
      switch (lanes_[t].state) {
        case lane_state::running: r += "running"; break;
        case lane_state::exited: r += "returned"; break;
        case lane_state::at_cta: r += "__syncthreads at " + where(lanes_[t].site); break;
        case lane_state::at_warp: r += std::string(op_name(lanes_[t].kind)) + " at " + where(lanes_[t].site); break;
      }
      t = e;
    }
    return r;
  }

  std::uint64_t block_;
  std::uint32_t threads_;
  std::uint32_t live_;
  std::size_t shared_bytes_;
  std::atomic<std::uint64_t>* progress_;
  std::unique_ptr<std::byte[]> shared_;
  std::mutex m_;
  std::uint32_t blocked_ = 0, exited_ = 0, first_exited_ = 0;
  std::uint32_t bar_arrived_ = 0;
  std::atomic<std::uint32_t> bar_gen_{0};
  source_site bar_site_{};
  std::uint32_t nwarps_;
  std::unique_ptr<warp[]> warps_;
  std::vector<lane_info> lanes_;
  std::atomic<bool> failed_{false};
  std::string failure_;
};

template <class T>
std::uint32_t to_bits(T v) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>, "warp collectives exchange 4-byte values");
  return std::bit_cast<std::uint32_t>(v);
}
template <class T>
T from_bits(std::uint32_t b) {
  return std::bit_cast<T>(b);
}

}  // namespace detail

/// One emulated thread: the execution context a kernel body receives (the same member names
/// as the library's device context, see attention/kernel_context.hpp).
class lane {
 public:
  lane(detail::cta& c, std::uint32_t tid, std::uint64_t grid) noexcept : cta_(&c), tid_(tid), grid_(grid) {}

  [[nodiscard]] std::uint32_t thread() const noexcept { return tid_; }
  [[nodiscard]] std::uint32_t block_threads() const noexcept { return cta_->threads(); }
  [[nodiscard]] std::uint64_t block() const noexcept { return cta_->block(); }
  [[nodiscard]] std::uint64_t grid_blocks() const noexcept { return grid_; }
  [[nodiscard]] int lane_id() const noexcept { return static_cast<int>(tid_ % 32); }
  [[nodiscard]] int warp_id() const noexcept { return static_cast<int>(tid_ / 32); }

  void sync_threads(source_site at = source_site::current()) const { cta_->sync_threads(tid_, at); }
  void sync_warp(source_site at = source_site::current()) const {
    (void)cta_->warp_op(tid_, detail::op::sync_warp, 0, [](int, std::uint32_t) { return -1; }, at);
  }
  template <class T>
  T shfl_xor(T v, int lane_mask, source_site at = source_site::current()) const {
    return detail::from_bits<T>(cta_->warp_op(tid_, detail::op::shfl_xor, detail::to_bits(v),
                                              [lane_mask](int l, std::uint32_t n) {
                                                const int s = l ^ (lane_mask & 31);
                                                return s < static_cast<int>(n) ? s : -1;
                                              },
                                              at));
  }
  template <class T>
  T shfl_up(T v, int delta, source_site at = source_site::current()) const {
    return detail::from_bits<T>(cta_->warp_op(tid_, detail::op::shfl_up, detail::to_bits(v),
                                              [delta](int l, std::uint32_t) { return l - delta >= 0 ? l - delta : -1; },
                                              at));
  }
  template <class T>
  T shfl_down(T v, int delta, source_site at = source_site::current()) const {
    return detail::from_bits<T>(cta_->warp_op(tid_, detail::op::shfl_down, detail::to_bits(v),
                                              [delta](int l, std::uint32_t n) {
                                                return l + delta < static_cast<int>(n) ? l + delta : -1;
                                              },
                                              at));
  }
  template <class T>
  T shfl(T v, int src_lane, source_site at = source_site::current()) const {
    return detail::from_bits<T>(cta_->warp_op(tid_, detail::op::shfl_idx, detail::to_bits(v),
                                              [src_lane](int l, std::uint32_t n) {
                                                const int s = src_lane & 31;
                                                return s < static_cast<int>(n) ? s : l;
                                              },
                                              at));
  }
  std::uint32_t ballot(bool pred, source_site at = source_site::current()) const {
    return cta_->warp_op(tid_, detail::op::ballot, pred ? 1u : 0u, [](int, std::uint32_t) { return -1; }, at);
  }
  bool any(bool pred, source_site at = source_site::current()) const { return ballot(pred, at) != 0; }
  bool all(bool pred, source_site at = source_site::current()) const {
    const std::uint32_t n = std::min<std::uint32_t>(32, cta_->threads() - (tid_ / 32) * 32);
    return ballot(pred, at) == (n == 32 ? 0xFFFFFFFFu : (1u << n) - 1u);
  }

  /// The CTA's dynamic shared memory (extern __shared__), NaN-filled at launch.
  template <class T>
  [[nodiscard]] T* shared() const noexcept {
    return reinterpret_cast<T*>(cta_->shared());
  }
  /// atomicAdd on global memory.
  std::uint32_t atomic_add(std::uint32_t* p, std::uint32_t v) const noexcept {
    return std::atomic_ref<std::uint32_t>(*p).fetch_add(v, std::memory_order_relaxed);
  }

 private:
  detail::cta* cta_;
  std::uint32_t tid_;
  std::uint64_t grid_;
};

/// Runs `body(lane&)` on every thread of every CTA of `cfg`. @throws emulation_error with the
/// first failure (deadlock, divergent barrier, shared memory overflow, an exception in a lane).
///
/// The lane threads are created once per launch (concurrent_ctas x threads of them) and run
/// the CTAs in rounds: creating a thread per lane per CTA dominated the run time under
/// ThreadSanitizer.
template <class Body>
void launch(const launch_config& cfg, Body&& body, const options& opt = {}) {
  std::string why;
  if (!valid_launch(cfg, &why)) throw emulation_error("invalid launch: " + why);
  std::vector<std::uint64_t> blocks;
  for (std::uint64_t b = 0; b < cfg.blocks; ++b)
    if (!opt.only_blocks || opt.only_blocks(b)) blocks.push_back(b);
  if (blocks.empty()) return;
  const std::size_t slots = std::min<std::size_t>(static_cast<std::size_t>(std::max(1, opt.concurrent_ctas)), blocks.size());
  std::atomic<std::uint64_t> progress{0};

  // One round: up to `slots` CTAs; worker (slot, t) runs lane t of the round's CTA in `slot`.
  std::mutex m;
  std::condition_variable to_workers, to_main;
  std::vector<std::unique_ptr<detail::cta>> round(slots);
  std::uint64_t round_id = 0;
  std::size_t running = 0;
  bool stop = false;
  std::vector<std::thread> workers;
  workers.reserve(slots * cfg.threads);
  for (std::size_t slot = 0; slot < slots; ++slot)
    for (std::uint32_t t = 0; t < cfg.threads; ++t)
      workers.emplace_back([&, slot, t] {
        std::uint64_t seen = 0;
        for (;;) {
          detail::cta* c = nullptr;
          {
            std::unique_lock lk(m);
            to_workers.wait(lk, [&] { return stop || round_id != seen; });
            if (stop) return;
            seen = round_id;
            c = round[slot].get();
          }
          if (c != nullptr) {
            lane ctx(*c, t, cfg.blocks);
            try {
              body(ctx);
            } catch (const detail::aborted&) {
            } catch (const std::exception& e) {
              c->body_threw(t, e.what());
            } catch (...) {
              c->body_threw(t, "unknown exception");
            }
            c->exit_lane(t);
          }
          std::lock_guard lk(m);
          if (--running == 0) to_main.notify_one();
        }
      });
  // Watchdog: a CTA that makes no progress for `hang_timeout` (a lane in an endless loop
  // outside any barrier) cannot be unwound; report every lane and stop the process.
  std::mutex stop_m;
  std::condition_variable stop_cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::uint64_t seen = progress.load();
    auto last = std::chrono::steady_clock::now();
    std::unique_lock lk(stop_m);
    while (!finished) {
      stop_cv.wait_for(lk, std::chrono::milliseconds(200));
      const std::uint64_t now = progress.load();
      if (now != seen) {
        seen = now;
        last = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last > opt.hang_timeout) {
        std::lock_guard rl(m);
        for (auto& c : round)
          if (c && !c->done()) std::fprintf(stderr, "cta_emulator: no progress\n%s\n", c->describe("hang").c_str());
        std::abort();
      }
    }
  });
  std::string failure;
  for (std::size_t first = 0; first < blocks.size() && failure.empty(); first += slots) {
    {
      std::lock_guard lk(m);
      for (std::size_t i = 0; i < slots; ++i)
        round[i] = first + i < blocks.size() ? std::make_unique<detail::cta>(blocks[first + i], cfg, progress) : nullptr;
      running = workers.size();
      ++round_id;
    }
    to_workers.notify_all();
    std::unique_lock lk(m);
    to_main.wait(lk, [&] { return running == 0; });
    for (auto& c : round)
      if (c && failure.empty()) failure = c->finish();
  }
  {
    std::lock_guard lk(m);
    stop = true;
  }
  to_workers.notify_all();
  for (auto& w : workers) w.join();
  {
    std::lock_guard lk(stop_m);
    finished = true;
  }
  stop_cv.notify_one();
  watchdog.join();
  if (!failure.empty()) throw emulation_error(failure);
}

}  // namespace hctest::emu
