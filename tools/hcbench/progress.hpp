// tools/hcbench/progress.hpp
//
// Progress of a long command on stderr, the way scripts/selector_goal.py shows it:
// `[k/N] replays, ETA mm:ss`. On a terminal one line rewritten in place after every step;
// otherwise (a log, CI) a plain line each time another ~10 % is done, so a log gets about ten
// lines and no carriage returns. Only runs that take a while show it: nothing is printed
// before `quiet_s` seconds have passed (a sub-second compare stays silent), and the last line
// says how long the whole run took. stdout is never touched. Thread-safe: workers call step().
//
//   hcbench::progress_meter meter({.total = jobs.size(), .what = "replays"});
//   ... meter.step();   // in each worker, once per finished item
//   meter.finish();
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include <unistd.h>

#include <hybridcache/core/error.hpp>

namespace hcbench {

/// What a progress_meter counts and how it shows it.
struct progress_options {
  std::size_t total = 0;      ///< steps in the whole run
  std::string what = "steps";  ///< plural noun after [k/N]: "replays", "sweep cells", "requests"
  /// Seconds before the first line: a run shorter than this prints nothing. The environment
  /// variable HCBENCH_PROGRESS_AFTER_S overrides it (tests set 0 to see the lines of a short run); a
  /// value that is not seconds >= 0 is an error.
  double quiet_s = 2.0;
};

class progress_meter {
 public:
  using clock = std::chrono::steady_clock;

  /// `tty`: stderr is a terminal (lines rewritten in place); the default asks isatty.
  explicit progress_meter(progress_options o, bool tty = ::isatty(STDERR_FILENO) != 0)
      : o_(std::move(o)), tty_(tty), start_(clock::now()) {
    if (const char* env = std::getenv("HCBENCH_PROGRESS_AFTER_S"); env != nullptr) {
      char* end = nullptr;
      const double v = std::strtod(env, &end);
      if (end == env || *end != '\0' || !std::isfinite(v) || v < 0)
        throw hybridcache::invalid_argument("HCBENCH_PROGRESS_AFTER_S='" + std::string(env) +
                                            "': expected seconds >= 0");
      o_.quiet_s = v;
    }
  }

  /// One more step finished.
  void step(std::size_t steps = 1) {
    std::lock_guard lock(mutex_);
    done_ += steps;
    const double s = elapsed_s();
    if (s < o_.quiet_s || done_ >= o_.total) return;  // the last line is finish()'s
    if (tty_) {
      show(line(s));
    } else if (done_ * 10 / o_.total > tenths_) {
      tenths_ = done_ * 10 / o_.total;
      std::fprintf(stderr, "%s\n", line(s).c_str());
    }
  }

  /// The run is over: how long it took, if anything was shown or it took longer than quiet_s.
  void finish() {
    std::lock_guard lock(mutex_);
    const double s = elapsed_s();
    if (s < o_.quiet_s || o_.total == 0) {
      if (width_ > 0) std::fprintf(stderr, "\r%*s\r", static_cast<int>(width_), "");
      return;
    }
    const std::string took = "[" + std::to_string(done_) + "/" + std::to_string(o_.total) + "] " + o_.what + " in " + mm_ss(s);
    if (tty_) {
      show(took);
      std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "%s\n", took.c_str());
    }
    std::fflush(stderr);
  }

  /// mm:ss, rounded up (00:00 only for no time at all).
  [[nodiscard]] static std::string mm_ss(double seconds) {
    const long s = seconds > 0 ? static_cast<long>(std::ceil(seconds)) : 0;
    char b[32];
    std::snprintf(b, sizeof b, "%02ld:%02ld", s / 60, s % 60);
    return b;
  }

 private:
  [[nodiscard]] double elapsed_s() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

  /// `[k/N] what, ETA mm:ss`: the wall time per finished step so far (parallel workers
  /// included) times the steps left.
  [[nodiscard]] std::string line(double s) const {
    const double per_step = done_ > 0 ? s / static_cast<double>(done_) : 0.0;
    return "[" + std::to_string(done_) + "/" + std::to_string(o_.total) + "] " + o_.what + ", ETA " +
           mm_ss(per_step * static_cast<double>(o_.total - done_));
  }

  void show(const std::string& text) {
    std::fprintf(stderr, "\r%-*s", static_cast<int>(width_), text.c_str());
    width_ = std::max(width_, text.size());
    std::fflush(stderr);
  }

  progress_options o_;
  bool tty_;
  clock::time_point start_;
  std::mutex mutex_;
  std::size_t done_ = 0, tenths_ = 0, width_ = 0;
};

}  // namespace hcbench
