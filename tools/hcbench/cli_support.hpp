// tools/hcbench/cli_support.hpp
//
// The conventions every sub-command shares (docs/replay.md, "Errors and output"):
//
// - Errors. Bad input exits 1 with one line on stderr:
//     hcbench: FILE:LINE: field 'X': what was expected, what was found
//   (FILE, LINE and field only where they apply). `input_error` carries them; main prints it.
// - Options that do not apply to the chosen mode are errors (`reject_unless`).
// - JSON: one number style (shortest round-trip, `null` for a non-finite value) and the
//   run's provenance: `command` (the command line), `version` (version and git describe),
//   `date` (UTC, ISO 8601), as vLLM's benchmark --save-result records.
// - Progress goes to stderr, for runs that take a while (progress.hpp's `progress_meter`).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/svg_chart.hpp>

#ifndef HCBENCH_VERSION
#define HCBENCH_VERSION "0.0.0"
#endif
#ifndef HCBENCH_GIT_DESCRIBE
#define HCBENCH_GIT_DESCRIBE "unknown"
#endif

namespace hcbench {

/// "0.1.0 (v0.1.0-12-gabcdef)": the project version and `git describe` at configure time.
inline std::string version_string() { return std::string(HCBENCH_VERSION) + " (" + HCBENCH_GIT_DESCRIBE + ")"; }

/// The message of a hybridcache exception without its "hybridcache: " prefix.
inline std::string strip_library_prefix(std::string_view what) {
  constexpr std::string_view prefix = "hybridcache: ";
  if (what.substr(0, prefix.size()) == prefix) what.remove_prefix(prefix.size());
  return std::string(what);
}

/// The detail of a format_error: its message without "line N, field 'X': ".
inline std::string format_error_detail(const hybridcache::format_error& e) {
  std::string s = strip_library_prefix(e.what());
  const std::string head = "line " + std::to_string(e.line()) + ", field '" + e.field() + "': ";
  if (s.compare(0, head.size(), head) == 0) s.erase(0, head.size());
  return s;
}

/// Bad input in a file: printed by main as `hcbench: FILE:LINE: field 'X': detail`.
class input_error : public std::runtime_error {
 public:
  input_error(const std::string& file, std::int64_t line, const std::string& field, const std::string& detail)
      : std::runtime_error(compose(file, line, field, detail)) {}

 private:
  static std::string compose(const std::string& file, std::int64_t line, const std::string& field,
                             const std::string& detail) {
    std::string s = file;
    if (line > 0) s += ":" + std::to_string(line);
    s += ": ";
    if (!field.empty()) s += "field '" + field + "': ";
    return s + detail;
  }
};

/// The command line, as given (set by main).
inline std::vector<std::string>& invocation() {
  static std::vector<std::string> argv;
  return argv;
}

/// How a trace is named in tables, CSV, JSON and plots: "-" is stdin; a directory keeps its
/// name whatever trailing slashes it is given with (`trajs/` -> trajs); a stream with no name
/// of its own (bash's process substitution, /dev/fd/63) keeps its path; a file its stem.
inline std::string trace_label(std::string path) {
  if (path == "-") return "stdin";
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.rfind("/dev/fd/", 0) == 0 || path.rfind("/proc/self/fd/", 0) == 0) return path;
  const std::string stem = std::filesystem::path(path).stem().string();
  return stem.empty() ? path : stem;
}

/// "1 prefill engine", "4 prefill engines" (English plurals by -s).
inline std::string count_of(std::size_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

/// A linear axis from 0 with ticks at round values: `step` is 1, 2 or 5 x 10^k, the
/// smallest such that `count` <= 5 steps reach `max` (top = step x count >= max). A max of
/// 0 or less (nothing to show) gives the axis 0..1 in 5 steps of 0.2.
struct round_axis {
  double step = 0.2;
  int count = 5;
  [[nodiscard]] double top() const noexcept { return step * count; }
  /// Tick k's label: as many decimals as the step needs ("0", "50", "0.2", "0.05").
  [[nodiscard]] std::string label(int k) const {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    char b[48];
    std::snprintf(b, sizeof b, "%.*f", decimals, step * k);
    return b;
  }
};
[[nodiscard]] inline round_axis round_axis_for(double max) {
  if (!(max > 0) || !std::isfinite(max)) return {};
  const double step = hybridcache::sim::round_step(max / 5);  // the compare plot's rule
  const int count = std::max(1, static_cast<int>(std::ceil(max / step - 1e-9)));
  return {step, count};
}

/// Whether the option `name` of `sub` was given on the command line.
inline bool given(const CLI::App& sub, const std::string& name) {
  const CLI::Option* opt = sub.get_option_no_throw(name);
  return opt != nullptr && opt->count() > 0;
}

/// Throws `invalid_argument("OPTION does not apply WHY")` when `opt` was given on the
/// command line and the mode it belongs to is off.
inline void reject_unless(bool applies, const CLI::App& sub, const std::string& name, const std::string& why) {
  if (!applies && given(sub, name)) throw hybridcache::invalid_argument(name + " does not apply " + why);
}

/// Checks that a parsed double is finite and in [lo, hi]; names the option otherwise.
inline double check_finite_range(double v, double lo, double hi, const std::string& name) {
  if (!std::isfinite(v) || v < lo || v > hi) {
    char b[160];
    std::snprintf(b, sizeof b, "%s: expected a finite number in [%g, %g], got %g", name.c_str(), lo, hi, v);
    throw hybridcache::invalid_argument(b);
  }
  return v;
}

namespace json {

/// A JSON string literal (UTF-8 passed through; invalid UTF-8 bytes become U+FFFD, control
/// characters are escaped), so the output is always valid JSON.
inline std::string string(std::string_view s) {
  std::string o = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
      ++i;
    } else if (c < 0x80) {
      o += static_cast<char>(c);
      ++i;
    } else {  // validate one UTF-8 sequence
      std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool ok = n != 0 && i + n <= s.size();
      for (std::size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok && n == 3) {
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
      }
      if (ok && n == 4) {
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
      }
      if (ok) {
        o.append(s.substr(i, n));
        i += n;
      } else {
        o += "\\ufffd";
        ++i;
      }
    }
  }
  return o + "\"";
}

/// The one number style: shortest round-trip decimal; `null` when not finite.
inline std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}
inline std::string number(std::int64_t v) { return std::to_string(v); }

/// Builds one JSON object, keys in insertion order.
class object {
 public:
  object& raw(std::string_view key, const std::string& value) {
    if (body_.size() > 1) body_ += ", ";
    body_ += string(key) + ": " + value;
    return *this;
  }
  object& str(std::string_view key, std::string_view v) { return raw(key, string(v)); }
  object& num(std::string_view key, double v) { return raw(key, number(v)); }
  object& integer(std::string_view key, std::int64_t v) { return raw(key, number(v)); }
  /// Adds `command`, `version` and `date`.
  object& provenance() {
    std::string cmd;
    for (const auto& a : invocation()) {
      if (!cmd.empty()) cmd += ' ';
      cmd += a;
    }
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&now, &tm);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    str("command", cmd);
    str("version", version_string());
    return str("date", date);
  }
  [[nodiscard]] std::string text() const { return body_ + "}"; }

 private:
  std::string body_ = "{";
};

}  // namespace json

/// A CSV field: quoted (with "" for ") when it holds a comma, quote, CR or LF.
inline std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

}  // namespace hcbench
