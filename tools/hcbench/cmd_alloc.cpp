// `hcbench alloc`: allocator replay of the AVMP benchmark (hybridcache/sim/alloc_replay.hpp).
//
//   hcbench alloc --workload mixed_long --model jamba_1_5_mini --budget 1GiB --variant vmm_dynamic --seed 2 [--json]
//   hcbench alloc --sweep --out DIR [--threads N]
//   ... [--rebalance-batch N] [--threshold-low F] [--threshold-high F] [--rebalance-interval OPS]
//
// The rebalancer flags set the dynamic variants' rebalancer (the paper's sensitivity sweep:
// migration batch size B, then threshold_low / threshold_high); a single run refuses them for a
// variant without a rebalancer; the sweep applies them to its dynamic variants. Output keys and
// columns: output_fields.hpp (alloc_json, alloc_sweep_csv, alloc_summary_csv).
//
// The sweep runs variants x workloads x {jamba_1_5_mini, mamba2_1b3} x {1, 4 GiB} x the
// three bundled seeds in parallel threads and writes DIR/alloc_sweep.csv (one row per
// cell), DIR/alloc_sweep_summary.csv (seed means) and DIR/alloc_ooms.svg (mean OOM events
// per variant and workload, one panel per model and budget), and prints the summary.
#include <algorithm>
#include <cstdarg>
#include <mutex>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <hybridcache/core/byte_size.hpp>
#include <hybridcache/core/error.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/sim/alloc_replay.hpp>
#include <hybridcache/sim/bootstrap.hpp>

#include "atomic_file.hpp"
#include "cli_support.hpp"
#include "command.hpp"
#include "output_fields.hpp"
#include "progress.hpp"
#include "replay_args.hpp"

namespace {

using namespace hybridcache;

// --budget in the library's one byte-size grammar (core/byte_size.hpp: 1GiB, 512MiB, 1e9,
// 4.1GB exact), between 1 B and 1 PB (10^15 B); a fraction of a byte is an error.
byte_count parse_budget(const std::string& text) {
  const std::int64_t bytes = parse_byte_size_or_throw(text, "--budget");
  if (bytes < 1 || bytes > 1'000'000'000'000'000)
    throw invalid_argument("--budget '" + text + "': must be between 1 B and 1 PB");
  return bytes;
}

// The rebalancer flags as given; unset fields keep the variant's defaults.
struct rebalancer_flags {
  std::optional<std::uint64_t> migration_batch_size;
  std::optional<double> threshold_low;
  std::optional<double> threshold_high;
  std::optional<std::uint64_t> min_rebalance_interval_ops;
  [[nodiscard]] bool any() const noexcept {
    return migration_batch_size || threshold_low || threshold_high || min_rebalance_interval_ops;
  }
};

[[nodiscard]] bool has_rebalancer(sim::alloc_variant v) noexcept {
  return v == sim::alloc_variant::avmp_dynamic_b128 || v == sim::alloc_variant::vmm_dynamic;
}

// The rebalancer `v` runs with: its defaults with the flags applied; unset for a variant
// without one. @throws invalid_argument naming the flag when the result is invalid (checked
// per variant, since vmm_dynamic's default thresholds, 0.01 / 0.05, are not the paper's).
std::optional<memory::rebalancer_config> rebalancer_for(sim::alloc_variant v, const rebalancer_flags& f) {
  if (!has_rebalancer(v)) return std::nullopt;
  memory::rebalancer_config rc = sim::default_rebalancer_config(v);
  if (f.migration_batch_size) rc.migration_batch_size = *f.migration_batch_size;
  if (f.threshold_low) rc.threshold_low = *f.threshold_low;
  if (f.threshold_high) rc.threshold_high = *f.threshold_high;
  if (f.min_rebalance_interval_ops) rc.min_rebalance_interval_ops = *f.min_rebalance_interval_ops;
  if (!(rc.threshold_low < rc.threshold_high)) {
    char b[256];
    std::snprintf(b, sizeof b, "--threshold-low (%g) must be below --threshold-high (%g) for %s%s", rc.threshold_low,
                  rc.threshold_high, std::string(sim::to_string(v)).c_str(),
                  f.threshold_low && f.threshold_high ? "" : " (the other is the variant's default: give both)");
    throw invalid_argument(b);
  }
  rc.validate();
  return rc;
}

struct cell {
  std::string workload;
  std::string model;
  byte_count budget = 0;
  std::uint64_t seed = 0;
  sim::alloc_variant variant{};
  sim::alloc_replay_result result{};
  std::optional<memory::rebalancer_config> rebalancer{};  ///< what the variant ran with
};

// The replay config of a cell (the same for a single run and a sweep cell).
sim::alloc_replay_config config_of(const cell& c, bool reference_quirks) {
  sim::alloc_replay_config cfg;
  cfg.capacity_bytes = c.budget;
  cfg.reference_padded_id_reuse = reference_quirks;
  cfg.reference_avmp_stores = reference_quirks;
  cfg.rebalancer = c.rebalancer;
  return cfg;
}

// printf into a string.
[[gnu::format(printf, 2, 3)]] void appendf(std::string& out, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (static_cast<std::size_t>(n) < sizeof buf) {
    out.append(buf, static_cast<std::size_t>(n));
    return;
  }
  std::string big(static_cast<std::size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  big.pop_back();
  out += big;
}

std::string json_of(const cell& c) {
  const auto& r = c.result;
  auto u = [](std::uint64_t v) { return std::to_string(v); };
  hcbench::json::object o;
  o.str("workload", c.workload).str("model", c.model).raw("capacity_bytes", u(c.budget));
  o.str("variant", std::string(sim::to_string(c.variant))).raw("seed", u(c.seed));
  o.raw("submitted", u(r.submitted)).raw("oom_events", u(r.oom_events)).raw("completed", u(r.completed));
  o.num("completion", r.completion()).raw("completed_reference", u(r.completed_reference));
  o.num("completion_reference", r.completion_reference()).raw("evicted", u(r.evicted));
  o.raw("eviction_events", u(r.eviction_events)).raw("rebalances", u(r.rebalances));
  o.raw("bytes_migrated", u(r.bytes_migrated)).raw("bytes_wasted", u(r.bytes_wasted));
  o.raw("padding_bytes_peak", u(r.padding_bytes_peak)).raw("compactions", u(r.compactions));
  o.num("fragmentation_mean", r.fragmentation_mean).num("fragmentation_peak", r.fragmentation_peak);
  o.num("external_fragmentation_mean", r.external_fragmentation_mean);
  o.raw("peak_reserved_bytes", u(r.peak_reserved_bytes)).raw("kv_bytes_end", u(r.kv_bytes_end));
  o.raw("ssm_bytes_end", u(r.ssm_bytes_end)).raw("allocate_calls", u(r.allocate_calls));
  o.raw("growth_events", u(r.growth_events)).integer("replay_ticks", r.replay_ticks);
  o.num("goodput_per_ktick", r.goodput_per_ktick).num("goodput_requests_per_second", r.goodput_requests_per_second);
  o.num("batch_size_p50", r.batch_size_p50);
  o.raw("time_to_first_oom_ticks", r.time_to_first_oom_ticks ? std::to_string(*r.time_to_first_oom_ticks) : "null");
  o.raw("calls_served_directly", u(r.calls_served_directly));
  o.raw("calls_served_after_eviction", u(r.calls_served_after_eviction));
  o.raw("calls_served_after_rebalance", u(r.calls_served_after_rebalance));
  o.num("service_seconds", r.service_seconds).num("oom_retry_seconds", r.oom_retry_seconds);
  o.num("migration_seconds", r.migration_seconds).num("idle_seconds", r.idle_seconds);
  o.num("wall_seconds", r.wall_seconds);
  const auto& rb = c.rebalancer;
  o.raw("rebalance_batch", rb ? u(rb->migration_batch_size) : "null");
  o.raw("threshold_low", rb ? hcbench::json::number(rb->threshold_low) : "null");
  o.raw("threshold_high", rb ? hcbench::json::number(rb->threshold_high) : "null");
  o.raw("rebalance_interval", rb ? u(rb->min_rebalance_interval_ops) : "null");
  o.provenance();
  return o.text();
}

void print_text(const cell& c, bool reference_stores) {
  const auto& r = c.result;
  // Sizes as docs/replay.md's "Output conventions" say: exact ones as typed, others in binary
  // units (the allocator's pages and blocks are); the JSON keeps the bytes.
  auto size = [](auto bytes) { return hcbench::format_bytes(static_cast<std::int64_t>(bytes), hcbench::byte_units::binary); };
  std::printf("%s / %s / %s / seed %llu / %s\n", c.workload.c_str(), c.model.c_str(), size(c.budget).c_str(),
              static_cast<unsigned long long>(c.seed),
              std::string(sim::to_string(c.variant)).c_str());
  std::printf("  requests           %llu submitted, %llu allocate calls, %llu growth events\n",
              static_cast<unsigned long long>(r.submitted), static_cast<unsigned long long>(r.allocate_calls),
              static_cast<unsigned long long>(r.growth_events));
  std::printf("  OOM events         %llu\n", static_cast<unsigned long long>(r.oom_events));
  std::printf("  completed          %llu (%.4f; evicted requests count as not completed)\n",
              static_cast<unsigned long long>(r.completed), r.completion());
  std::printf("  completed (ref.)   %llu (%.4f; the reference's counting: evictions ignored)\n",
              static_cast<unsigned long long>(r.completed_reference), r.completion_reference());
  std::printf("  evicted            %s (%s)\n", hcbench::count_of(r.evicted, "request").c_str(),
              hcbench::count_of(r.eviction_events, "eviction event").c_str());
  std::printf("  rebalances         %llu (%s migrated, %s wasted, %s)\n", static_cast<unsigned long long>(r.rebalances),
              size(r.bytes_migrated).c_str(), size(r.bytes_wasted).c_str(),
              hcbench::count_of(r.compactions, "compaction").c_str());
  if (r.padding_bytes_peak) std::printf("  padding            %s of live pages at peak\n", size(r.padding_bytes_peak).c_str());
  std::printf("  fragmentation      mean %.4f, peak %.4f (free fraction under load); external %.4f\n",
              r.fragmentation_mean, r.fragmentation_peak, r.external_fragmentation_mean);
  std::printf("  peak reserved      %s\n", size(r.peak_reserved_bytes).c_str());
  if (r.kv_bytes_end || r.ssm_bytes_end)
    std::printf("  pools at end       KV %s, SSM %s\n", size(r.kv_bytes_end).c_str(), size(r.ssm_bytes_end).c_str());
  if (c.rebalancer && reference_stores)  // the reference's forced path reads the batch size only
    std::printf("  rebalancer         batch %llu (the reference's stores: no thresholds, no interval)\n",
                static_cast<unsigned long long>(c.rebalancer->migration_batch_size));
  else if (c.rebalancer)
    std::printf("  rebalancer         batch %llu, thresholds %g / %g, interval %llu ops\n",
                static_cast<unsigned long long>(c.rebalancer->migration_batch_size), c.rebalancer->threshold_low,
                c.rebalancer->threshold_high, static_cast<unsigned long long>(c.rebalancer->min_rebalance_interval_ops));
  std::printf("  goodput            %.2f completed requests per 1,000 ticks (%lld ticks); %.1f req/s in wall time "
              "(the paper's: completed_reference)\n",
              r.goodput_per_ktick, static_cast<long long>(r.replay_ticks), r.goodput_requests_per_second);
  std::printf("  batch size p50     %g active requests\n", r.batch_size_p50);
  if (r.time_to_first_oom_ticks)
    std::printf("  first OOM          %lld ticks after the first arrival\n",
                static_cast<long long>(*r.time_to_first_oom_ticks));
  else
    std::printf("  first OOM          none\n");
  std::printf("  calls              %llu served directly, %llu after an eviction, %llu after a rebalance, %llu failed\n",
              static_cast<unsigned long long>(r.calls_served_directly),
              static_cast<unsigned long long>(r.calls_served_after_eviction),
              static_cast<unsigned long long>(r.calls_served_after_rebalance),
              static_cast<unsigned long long>(r.oom_events));
  const double wall = r.wall_seconds > 0 ? r.wall_seconds : 1;
  std::printf("  phases (wall)      service %.1f %%, OOM retry %.1f %%, migration %.1f %%, idle %.1f %%\n",
              100 * r.service_seconds / wall, 100 * r.oom_retry_seconds / wall, 100 * r.migration_seconds / wall,
              100 * r.idle_seconds / wall);
  std::printf("  wall               %.4f s\n", r.wall_seconds);
}

// Grouped bar chart: one panel per (model, budget), groups = workloads, bars = variants; a
// whisker on each bar spans its bootstrap interval over the seeds.
std::string bar_chart_svg(const std::vector<std::string>& panels, const std::vector<std::string>& groups,
                          const std::vector<std::string>& bars,
                          const std::map<std::string, sim::mean_interval>& value,  // key panel|group|bar
                          const std::string& title) {
  static const char* colours[] = {"#7f7f7f", "#1f77b4", "#aec7e8", "#ff7f0e", "#d62728", "#2ca02c"};
  const int pw = 520, ph = 330, ml = 56, mr = 12, mt = 34, mb = 46, legend_h = 26;
  const int W = pw * static_cast<int>(std::min<std::size_t>(panels.size(), 2));
  const int rows = static_cast<int>((panels.size() + 1) / 2);
  const int H = 40 + rows * ph + legend_h;
  std::string o;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return std::string(b);
  };
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + std::to_string(W) + "\" height=\"" +
       std::to_string(H) + "\" font-family=\"sans-serif\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(W) + "\" height=\"" + std::to_string(H) + "\" fill=\"white\"/>\n";
  o += "<text x=\"" + std::to_string(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" +
       title + "</text>\n";
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const int ox = static_cast<int>(p % 2) * pw, oy = 40 + static_cast<int>(p / 2) * ph;
    double vmax = 1;
    for (const auto& g : groups)
      for (const auto& b : bars) {
        auto it = value.find(panels[p] + "|" + g + "|" + b);
        if (it != value.end()) vmax = std::max(vmax, it->second.high);
      }
    const hcbench::round_axis axis = hcbench::round_axis_for(vmax);  // ticks at 1, 2 or 5 x 10^k
    const double top = axis.top();
    const int x0 = ox + ml, y0 = oy + ph - mb, pwid = pw - ml - mr, phgt = ph - mt - mb;
    o += "<text x=\"" + std::to_string(ox + pw / 2) + "\" y=\"" + std::to_string(oy + 20) +
         "\" text-anchor=\"middle\" font-size=\"13\">" + panels[p] + "</text>\n";
    for (int t = 0; t <= axis.count; ++t) {
      const int y = y0 - static_cast<int>(phgt * t / static_cast<double>(axis.count));
      o += "<line x1=\"" + std::to_string(x0) + "\" y1=\"" + std::to_string(y) + "\" x2=\"" + std::to_string(x0 + pwid) +
           "\" y2=\"" + std::to_string(y) + "\" stroke=\"#ddd\"/>\n";
      o += "<text x=\"" + std::to_string(x0 - 6) + "\" y=\"" + std::to_string(y + 4) +
           "\" text-anchor=\"end\" font-size=\"11\">" + axis.label(t) + "</text>\n";
    }
    o += "<text x=\"" + std::to_string(ox + 14) + "\" y=\"" + std::to_string(oy + mt + phgt / 2) +
         "\" font-size=\"11\" transform=\"rotate(-90 " + std::to_string(ox + 14) + " " +
         std::to_string(oy + mt + phgt / 2) + ")\" text-anchor=\"middle\">mean OOM events</text>\n";
    const double gw = static_cast<double>(pwid) / static_cast<double>(groups.size());
    const double bw = gw * 0.8 / static_cast<double>(bars.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const double gx = x0 + gw * static_cast<double>(g) + gw * 0.1;
      for (std::size_t b = 0; b < bars.size(); ++b) {
        auto it = value.find(panels[p] + "|" + groups[g] + "|" + bars[b]);
        if (it == value.end()) continue;
        const sim::mean_interval& ci = it->second;
        const double h = phgt * ci.mean / top;
        o += "<rect x=\"" + num(gx + bw * static_cast<double>(b)) + "\" y=\"" + num(y0 - h) + "\" width=\"" +
             num(bw * 0.92) + "\" height=\"" + num(h) + "\" fill=\"" + colours[b % 6] + "\"><title>" + bars[b] + " " +
             groups[g] + ": " + num(ci.mean) + " [" + num(ci.low) + ", " + num(ci.high) + "]</title></rect>\n";
        if (ci.high > ci.low) {
          const std::string xc = num(gx + bw * (static_cast<double>(b) + 0.46));
          o += "<line x1=\"" + xc + "\" y1=\"" + num(y0 - phgt * ci.low / top) + "\" x2=\"" + xc + "\" y2=\"" +
               num(y0 - phgt * ci.high / top) + "\" stroke=\"black\" stroke-width=\"1\"/>\n";
        }
      }
      o += "<text x=\"" + num(gx + gw * 0.4) + "\" y=\"" + std::to_string(y0 + 16) +
           "\" text-anchor=\"middle\" font-size=\"11\">" + groups[g] + "</text>\n";
    }
    o += "<line x1=\"" + std::to_string(x0) + "\" y1=\"" + std::to_string(y0) + "\" x2=\"" + std::to_string(x0 + pwid) +
         "\" y2=\"" + std::to_string(y0) + "\" stroke=\"black\"/>\n";
  }
  int lx = 10;
  const int ly = H - 10;
  for (std::size_t b = 0; b < bars.size(); ++b) {
    o += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly - 10) + "\" width=\"12\" height=\"12\" fill=\"" +
         colours[b % 6] + "\"/>\n";
    o += "<text x=\"" + std::to_string(lx + 16) + "\" y=\"" + std::to_string(ly) + "\" font-size=\"12\">" + bars[b] +
         "</text>\n";
    lx += 34 + static_cast<int>(bars[b].size()) * 7;
  }
  o += "</svg>\n";
  return o;
}

void run_sweep(const std::string& out_dir, unsigned threads, bool reference_quirks, const rebalancer_flags& flags) {
  std::vector<cell> cells;
  for (const char* model : {"jamba_1_5_mini", "mamba2_1b3"})
    for (byte_count budget : {byte_count{1} << 30, byte_count{4} << 30})
      for (auto w : sim::alloc_workload_names())
        for (auto seed : sim::alloc_workload_seeds(w))
          for (auto v : sim::all_alloc_variants)
            cells.push_back({std::string(w), model, budget, seed, v, {}, rebalancer_for(v, flags)});

  // Load each trace once; cells only read them.
  std::map<std::string, sim::alloc_workload> traces;
  for (auto w : sim::alloc_workload_names())
    for (auto seed : sim::alloc_workload_seeds(w))
      traces.emplace(std::string(w) + "#" + std::to_string(seed), sim::bundled_alloc_workload(w, seed));

  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  hcbench::progress_meter meter({.total = cells.size(), .what = "sweep cells"});
  std::vector<std::thread> pool;
  std::vector<std::string> errors(threads);
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (std::size_t i = next++; i < cells.size(); i = next++) {
          cell& c = cells[i];
          c.result = sim::replay_alloc(traces.at(c.workload + "#" + std::to_string(c.seed)), presets::preset(c.model),
                                       c.variant, config_of(c, reference_quirks));
          meter.step();
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : pool) th.join();
  meter.finish();
  for (const auto& e : errors)
    if (!e.empty()) throw error("sweep: " + e);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw invalid_argument("--out '" + out_dir + "': cannot create directory (" + ec.message() + ")");
  std::string csv, summary, report;
  {
    csv += std::string(hcbench::fields::alloc_sweep_csv) + "\n";
    for (const auto& c : cells) {
      const auto& r = c.result;
      char row[1024];
      std::snprintf(row, sizeof row,
                    "%s,%s,%llu,%llu,%s,%llu,%llu,%llu,%.6f,%llu,%.6f,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%.6f,%.6f,%llu,"
                    "%llu,%llu\n",
                    c.workload.c_str(), c.model.c_str(), static_cast<unsigned long long>(c.budget),
                    static_cast<unsigned long long>(c.seed), std::string(sim::to_string(c.variant)).c_str(),
                    static_cast<unsigned long long>(r.submitted), static_cast<unsigned long long>(r.oom_events),
                    static_cast<unsigned long long>(r.completed), r.completion(),
                    static_cast<unsigned long long>(r.completed_reference), r.completion_reference(),
                    static_cast<unsigned long long>(r.evicted), static_cast<unsigned long long>(r.eviction_events),
                    static_cast<unsigned long long>(r.rebalances), static_cast<unsigned long long>(r.bytes_migrated),
                    static_cast<unsigned long long>(r.bytes_wasted),
                    static_cast<unsigned long long>(r.padding_bytes_peak), static_cast<unsigned long long>(r.compactions),
                    r.fragmentation_mean, r.fragmentation_peak, r.external_fragmentation_mean,
                    static_cast<unsigned long long>(r.peak_reserved_bytes),
                    static_cast<unsigned long long>(r.kv_bytes_end), static_cast<unsigned long long>(r.ssm_bytes_end));
      csv += row;
      // The evaluation metrics, then the rebalancer (output_fields.hpp's order).
      csv.pop_back();  // the newline above
      appendf(csv, ",%lld,%.6f,%.3f,%g,", static_cast<long long>(r.replay_ticks), r.goodput_per_ktick,
              r.goodput_requests_per_second, r.batch_size_p50);
      if (r.time_to_first_oom_ticks) appendf(csv, "%lld", static_cast<long long>(*r.time_to_first_oom_ticks));
      appendf(csv, ",%llu,%llu,%llu,%.6f,%.6f,%.6f,%.6f,%.6f,", static_cast<unsigned long long>(r.calls_served_directly),
              static_cast<unsigned long long>(r.calls_served_after_eviction),
              static_cast<unsigned long long>(r.calls_served_after_rebalance), r.service_seconds, r.oom_retry_seconds,
              r.migration_seconds, r.idle_seconds, r.wall_seconds);
      if (c.rebalancer)
        appendf(csv, "%llu,%g,%g,%llu\n", static_cast<unsigned long long>(c.rebalancer->migration_batch_size),
                c.rebalancer->threshold_low, c.rebalancer->threshold_high,
                static_cast<unsigned long long>(c.rebalancer->min_rebalance_interval_ops));
      else
        csv += ",,,\n";
    }
  }

  // Seed means per (model, budget, workload, variant).
  struct agg {
    double oom = 0, completion = 0, completion_ref = 0, evicted = 0, rebalances = 0, migrated = 0, frag = 0;
    double reserved = 0;
    int n = 0;
    // Per-seed values, for the bootstrap intervals; first OOM over the seeds that had one.
    std::vector<double> ooms, completions, goodputs, batch_p50s, first_ooms;
  };
  std::map<std::string, agg> means;
  std::vector<std::string> panels, groups, bars;
  auto add_unique = [](std::vector<std::string>& v, const std::string& s) {
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  };
  std::map<std::string, sim::mean_interval> oom_ci_text;
  for (const auto& c : cells) {
    const std::string panel = c.model + " " + hcbench::format_bytes(static_cast<std::int64_t>(c.budget), hcbench::byte_units::binary);
    const std::string variant(sim::to_string(c.variant));
    add_unique(panels, panel);
    add_unique(groups, c.workload);
    add_unique(bars, variant);
    agg& a = means[panel + "|" + c.workload + "|" + variant];
    const auto& r = c.result;
    a.oom += static_cast<double>(r.oom_events);
    a.completion += r.completion();
    a.completion_ref += r.completion_reference();
    a.evicted += static_cast<double>(r.evicted);
    a.rebalances += static_cast<double>(r.rebalances);
    a.migrated += static_cast<double>(r.bytes_migrated) / (1 << 20);
    a.frag += r.fragmentation_mean;
    a.reserved = static_cast<double>(r.peak_reserved_bytes);
    a.ooms.push_back(static_cast<double>(r.oom_events));
    a.completions.push_back(r.completion());
    a.goodputs.push_back(r.goodput_per_ktick);
    a.batch_p50s.push_back(r.batch_size_p50);
    if (r.time_to_first_oom_ticks) a.first_ooms.push_back(static_cast<double>(*r.time_to_first_oom_ticks));
    ++a.n;
  }
  {
    summary += std::string(hcbench::fields::alloc_summary_csv) + "\n";
    appendf(report, "sweep: %s in %.2f s on %s -> %s\n\n", hcbench::count_of(cells.size(), "cell").c_str(), seconds,
            hcbench::count_of(threads, "thread").c_str(), out_dir.c_str());
    // A markdown table's head: one column per variant after the workload.
    auto table_head = [&] {
      appendf(report, "| workload |");
      for (const auto& b : bars) appendf(report, " %s |", b.c_str());
      appendf(report, "\n|---|");
      for (std::size_t i = 0; i < bars.size(); ++i) appendf(report, "---:|");
      appendf(report, "\n");
    };
    for (const auto& panel : panels) {
      appendf(report, "%s: mean OOM events over seeds (completion, evictions counted)\n", panel.c_str());
      table_head();
      for (const auto& g : groups) {
        appendf(report, "| %s |", g.c_str());
        for (const auto& b : bars) {
          const std::string key = panel + "|" + g + "|" + b;
          const agg& a = means[key];
          const double n = a.n ? a.n : 1;
          appendf(report, " %.2f (%.3f) |", a.oom / n, a.completion / n);
          char row[512];
          std::snprintf(row, sizeof row, "%s,%s,%s,%d,%.4f,%.6f,%.6f,%.2f,%.2f,%.2f,%.6f,%.0f\n", panel.c_str(),
                        g.c_str(), b.c_str(), a.n, a.oom / n, a.completion / n, a.completion_ref / n, a.evicted / n,
                        a.rebalances / n, a.migrated / n, a.frag / n, a.reserved);
          summary += row;
          summary.pop_back();
          const auto oom_ci = sim::bootstrap_mean_ci(a.ooms), completion_ci = sim::bootstrap_mean_ci(a.completions);
          const auto goodput_ci = sim::bootstrap_mean_ci(a.goodputs), batch_ci = sim::bootstrap_mean_ci(a.batch_p50s);
          oom_ci_text[key] = oom_ci;  // bar and whisker of the figure, cells of the interval table
          appendf(summary, ",%.4f,%.4f,%.6f,%.6f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%zu,", oom_ci.low, oom_ci.high,
                  completion_ci.low, completion_ci.high, goodput_ci.mean, goodput_ci.low, goodput_ci.high, batch_ci.mean,
                  batch_ci.low, batch_ci.high, a.first_ooms.size());
          if (!a.first_ooms.empty()) appendf(summary, "%.2f", sim::bootstrap_mean_ci(a.first_ooms).mean);
          summary += "\n";
        }
        appendf(report, "\n");
      }
      appendf(report, "\n");
    }
    // The intervals, after the OOM tables (which stay as they were printed before).
    for (const auto& panel : panels) {
      appendf(report, "%s: mean OOM events [bootstrap 95 %% interval over seeds, 1,000 resamples]\n", panel.c_str());
      table_head();
      for (const auto& g : groups) {
        appendf(report, "| %s |", g.c_str());
        for (const auto& b : bars) {
          const auto& ci = oom_ci_text[panel + "|" + g + "|" + b];
          appendf(report, " %.2f [%.2f, %.2f] |", ci.mean, ci.low, ci.high);
        }
        appendf(report, "\n");
      }
      appendf(report, "\n");
    }
  }
  hcbench::atomic_file_set files;  // all three or none
  const std::filesystem::path dir(out_dir);
  files.add((dir / "alloc_sweep.csv").string(), csv);
  files.add((dir / "alloc_sweep_summary.csv").string(), summary);
  files.add((dir / "alloc_ooms.svg").string(),
            bar_chart_svg(panels, groups, bars, oom_ci_text,
                          "AVMP allocator replay: mean OOM events (3 seeds; whiskers: bootstrap 95 % interval)"));
  files.commit("--out");
  std::fputs(report.c_str(), stdout);
}

const bool registered = hcbench::register_command(
    {"alloc", "replay the AVMP allocator benchmark (KV pages + SSM blocks) through one pool variant, or sweep the grid",
     [](CLI::App& sub) {
       struct options {
         std::string workload = "uniform_short";
         std::string model = "jamba_1_5_mini";
         std::string budget = "1GiB";
         std::string variant = "vmm_dynamic";
         std::uint64_t seed = 0;  // used when given; otherwise the workload's first bundled seed
         bool json = false;
         bool sweep = false;
         bool reference_quirks = false;
         std::string out = "alloc-sweep";
         unsigned threads = 0;
         std::uint64_t rebalance_batch = 0;
         double threshold_low = 0, threshold_high = 0;
         std::uint64_t rebalance_interval = 0;
       };
       static options o;
       sub.add_option("--workload", o.workload, "uniform_short | mixed_long | agentic_burst | sharegpt_replay");
       sub.add_option("--model", o.model, "model preset (jamba_1_5_mini, mamba2_1b3, ...)");
       sub.add_option("--budget", o.budget, "memory budget: bytes or with a unit (1GiB, 512MiB, 1e9, 4.1GB)");
       sub.add_option("--variant", o.variant,
                      "padded_unified | fixed_dual_mr05 | fixed_dual_mr09 | avmp_static_mr05 | avmp_dynamic_b128 | "
                      "vmm_dynamic");
       // Each workload has its own bundled seeds: --help names the default of each, not "=0".
       std::string seed_help = "trace seed, one of the workload's bundled seeds (default: the workload's first:";
       const char* sep = " ";
       for (const std::string_view w : sim::alloc_workload_names()) {
         seed_help += sep + std::string(w) + " " + std::to_string(sim::alloc_workload_seeds(w).front());
         sep = ", ";
       }
       sub.add_option("--seed", o.seed, seed_help + ")")->default_str("");
       sub.add_flag("--json", o.json, std::string("print one JSON object; keys: ") + hcbench::fields::alloc_json);
       sub.add_flag("--reference-quirks", o.reference_quirks,
                    "reproduce the reference's defects: padded_unified frees by page id, avmp_dynamic_b128 runs on "
                    "an emulation of its tail-only stores (matches its published numbers)");
       sub.add_flag("--sweep", o.sweep,
                    std::string("run the whole grid in parallel; writes CSV + SVG into --out: alloc_sweep.csv (columns: ") +
                        hcbench::fields::alloc_sweep_csv + "), alloc_sweep_summary.csv (columns: " +
                        hcbench::fields::alloc_summary_csv + "), alloc_ooms.svg");
       // The rebalancer of the dynamic variants (avmp_dynamic_b128, vmm_dynamic): the paper's
       // sensitivity sweep (section 4.5) varies B, then the two thresholds.
       sub.add_option("--rebalance-batch", o.rebalance_batch,
                      "donor units per rebalance (migration_batch_size; default 128, the paper's B), 1..4294967295")
           ->default_str("");
       sub.add_option("--threshold-low", o.threshold_low,
                      "a pool is pressured below this free fraction, in [0, 1) (default 0.05; vmm_dynamic 0.01)")
           ->default_str("");
       sub.add_option("--threshold-high", o.threshold_high,
                      "a donor must keep more than this free fraction, in (0, 1] and above --threshold-low "
                      "(default 0.30; vmm_dynamic 0.05). With --reference-quirks avmp_dynamic_b128 ignores both "
                      "thresholds and --rebalance-interval, as the reference does")
           ->default_str("");
       sub.add_option("--rebalance-interval", o.rebalance_interval,
                      "logical operations between rebalances (min_rebalance_interval_ops; default 1000; vmm_dynamic 100)")
           ->default_str("");
       sub.add_option("--out", o.out, "output directory of --sweep");
       sub.add_option("--threads", o.threads, "sweep threads; 0: hardware concurrency (the default)");
       sub.callback([&sub] {
         for (const char* name : {"--out", "--threads"})
           hcbench::reject_unless(o.sweep, sub, name, "without --sweep");
         for (const char* name : {"--workload", "--model", "--budget", "--variant", "--seed", "--json"})
           hcbench::reject_unless(!o.sweep, sub, name, "with --sweep (the sweep runs the whole grid)");
         if (o.threads > 4096) throw invalid_argument("--threads: expected 0..4096, got " + std::to_string(o.threads));
         rebalancer_flags flags;
         if (hcbench::given(sub, "--rebalance-batch")) {
           if (o.rebalance_batch < 1 || o.rebalance_batch > 0xffffffffu)
             throw invalid_argument("--rebalance-batch: expected 1..4294967295 donor units, got " +
                                    std::to_string(o.rebalance_batch));
           flags.migration_batch_size = o.rebalance_batch;
         }
         if (hcbench::given(sub, "--threshold-low"))
           flags.threshold_low = hcbench::check_finite_range(o.threshold_low, 0, 1, "--threshold-low");
         if (hcbench::given(sub, "--threshold-high"))
           flags.threshold_high = hcbench::check_finite_range(o.threshold_high, 0, 1, "--threshold-high");
         if (hcbench::given(sub, "--rebalance-interval")) flags.min_rebalance_interval_ops = o.rebalance_interval;
         if (o.sweep) {
           for (auto v : sim::all_alloc_variants) (void)rebalancer_for(v, flags);  // bad values: one error, up front
           const unsigned t = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
           run_sweep(o.out, t, o.reference_quirks, flags);
           return;
         }
         std::uint64_t seed = o.seed;
         if (!hcbench::given(sub, "--seed")) {  // an unknown workload: bundled_alloc_workload names it
           const auto seeds = sim::alloc_workload_seeds(o.workload);
           if (!seeds.empty()) seed = seeds.front();
         }
         const sim::alloc_variant variant = sim::parse_alloc_variant(o.variant);
         if (flags.any() && !has_rebalancer(variant))
           for (const char* name : {"--rebalance-batch", "--threshold-low", "--threshold-high", "--rebalance-interval"})
             hcbench::reject_unless(false, sub, name,
                                    "to " + o.variant +
                                        ": it has no rebalancer (avmp_dynamic_b128 and vmm_dynamic have one)");
         cell c{o.workload, o.model, parse_budget(o.budget), seed, variant, {}, rebalancer_for(variant, flags)};
         c.result = sim::replay_alloc(sim::bundled_alloc_workload(c.workload, seed), presets::preset(c.model),
                                      c.variant, config_of(c, o.reference_quirks));
         if (o.json) std::printf("%s\n", json_of(c).c_str());
         else print_text(c, o.reference_quirks && variant == sim::alloc_variant::avmp_dynamic_b128);
       });
     }});

}  // namespace
