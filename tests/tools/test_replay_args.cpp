// hcbench's capacity parsing and list helpers.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/svg_chart.hpp>

#include "atomic_file.hpp"
#include "cli_support.hpp"
#include "replay_args.hpp"
#include "tier_directories.hpp"
#include "tiered_flags.hpp"

using hcbench::parse_capacity;

TEST_CASE("parse_capacity accepts plain, scientific and unit-suffixed byte counts") {
  CHECK(parse_capacity("500000000") == 500000000);
  CHECK(parse_capacity("5e8") == 500000000);
  CHECK(parse_capacity("5E8") == 500000000);
  CHECK(parse_capacity("1.5e9") == 1500000000);
  CHECK(parse_capacity("5GB") == 5000000000);
  CHECK(parse_capacity("5gb") == 5000000000);
  CHECK(parse_capacity("4GiB") == 4LL << 30);
  CHECK(parse_capacity("512 MiB") == 512LL << 20);
  CHECK(parse_capacity("1.5GB") == 1500000000);
  CHECK(parse_capacity("2TB") == 2000000000000);
  CHECK(parse_capacity("64KiB") == 65536);
  CHECK(parse_capacity("7B") == 7);
  CHECK(parse_capacity(" 3kB ") == 3000);
  CHECK(parse_capacity("9223372036854775807") == 9223372036854775807LL);
  // The one grammar (core/byte_size.hpp): exact decimals, petabytes, any case.
  CHECK(parse_capacity("4.1GB") == 4100000000);
  CHECK(parse_capacity("0.5KiB") == 512);
  CHECK(parse_capacity("1PB") == 1000000000000000);
  CHECK(parse_capacity("1pib") == 1LL << 50);
  CHECK(parse_capacity(".5KB") == 500);
}

TEST_CASE("parse_capacity rejects what is not a positive whole number of bytes") {
  for (const char* bad : {"", "GB", "abc", "0", "-5", "-5e8", "0.5", "5XB", "5 G", "1e30", "9223372036854775808",
                          "8EiB", "10000000TB", "1.5B", "5e", "nan", "inf", "5GB5",
                          // Fractions of a byte the double-based parser rounded away, a bare K:
                          "1.0000001KB", "0.3KiB", "1.0000000001e9", "4K", "0x10", "0KiB"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_capacity(bad), hybridcache::invalid_argument);
  }
  try {
    (void)parse_capacity("5XB");
  } catch (const hybridcache::invalid_argument& e) {
    CHECK(std::string(e.what()).find("'5XB'") != std::string::npos);
  }
  CHECK_THROWS_AS((void)parse_capacity("1e30"), hybridcache::overflow_error);
  try {
    (void)parse_capacity("0");
    FAIL("0 accepted");
  } catch (const hybridcache::invalid_argument& e) {
    CHECK(std::string(e.what()).find("capacity '0': must be > 0") != std::string::npos);
  }
}

TEST_CASE("split_list and format_bytes") {
  CHECK(hcbench::split_list("marconi, sglang+,,vllm+ ") == std::vector<std::string>{"marconi", "sglang+", "vllm+"});
  CHECK(hcbench::split_list("").empty());
  // docs/replay.md, "Output conventions": a number, a space, the unit; exact sizes in the unit
  // the user would have typed, others to three significant digits in the user's family.
  CHECK(hcbench::format_bytes(500000000) == "500 MB");
  CHECK(hcbench::format_bytes(4LL << 30) == "4 GiB");
  CHECK(hcbench::format_bytes(5000000000) == "5 GB");
  CHECK(hcbench::format_bytes(1500000000) == "1500 MB");  // exact whole units first
  CHECK(hcbench::format_bytes(1234567890) == "1.23 GB");
  CHECK(hcbench::format_bytes(1234567890, hcbench::byte_units::binary) == "1.15 GiB");
  CHECK(hcbench::format_bytes(14662631424) == "14.7 GB");
  CHECK(hcbench::format_bytes(600621056) == "601 MB");
  CHECK(hcbench::format_bytes(1072693248, hcbench::byte_units::binary) == "1023 MiB");  // exact
  CHECK(hcbench::format_bytes(1073000000, hcbench::byte_units::binary) == "1073 MB");  // exact: as typed
  CHECK(hcbench::format_bytes(1073000001, hcbench::byte_units::binary) == "1.00 GiB");  // not "1023 MiB"
  CHECK(hcbench::format_bytes((1LL << 30) - 1, hcbench::byte_units::binary) == "1.00 GiB");  // not "1024 MiB"
  CHECK(hcbench::format_bytes(1000LL << 20, hcbench::byte_units::binary) == "1000 MiB");  // exact
  CHECK(hcbench::format_bytes((1000LL << 20) + 1, hcbench::byte_units::binary) == "0.98 GiB");
  CHECK(hcbench::format_bytes(999999999) == "1.00 GB");  // not "1000 MB"
  CHECK(hcbench::format_bytes(165644337152, hcbench::byte_units::binary) == "154 GiB");
  CHECK(hcbench::format_bytes(999) == "999 B");
  CHECK(hcbench::units_of("hbm=128GiB,host=512GiB") == hcbench::byte_units::binary);
  CHECK(hcbench::units_of("5e8") == hcbench::byte_units::decimal);
  CHECK(hcbench::units_of("4gib") == hcbench::byte_units::binary);
  CHECK(hcbench::units_of("512 MiB") == hcbench::byte_units::binary);
  CHECK(hcbench::units_of("hbm=1GB,disk@/usr/lib/x=5GB") == hcbench::byte_units::decimal);  // not the "ib" of lib
}

TEST_CASE("parse_lru_ties") {
  CHECK(hcbench::parse_lru_ties("reference"));
  CHECK_FALSE(hcbench::parse_lru_ties("node-id"));
  CHECK_THROWS_AS((void)hcbench::parse_lru_ties("heap"), hybridcache::invalid_argument);
}

TEST_CASE("--tiers flags: scheduler, prefetch, sparsify, demotion names and the options built from them") {
  using namespace hcbench;
  CHECK(parse_scheduler("car") == scheduler_kind::car);
  CHECK(parse_prefetch("deadline") == prefetch_kind::deadline);
  CHECK(parse_prefetch("threshold") == prefetch_kind::threshold);
  CHECK(parse_sparsify("profile") == sparsify_kind::profile);
  CHECK(parse_demotion("flop") == demotion_kind::flop_aware);
  CHECK_THROWS_AS((void)parse_scheduler("lifo"), invalid_argument);
  CHECK_THROWS_AS((void)parse_prefetch("always"), invalid_argument);
  CHECK_THROWS_AS((void)parse_sparsify("on"), invalid_argument);
  const auto cli = make_tiered_replay_options("hbm=8GiB,host=32GiB", 25.0, "car", "threshold", "profile");
  CHECK(cli.tiers.size() == 2);
  CHECK(cli.tiers[1].link_gbps == 25.0);
  CHECK(cli.link_gbps == 25.0);
  CHECK(cli.scheduler == scheduler_kind::car);
  CHECK(cli.prefetch == prefetch_kind::threshold);
  CHECK(cli.sparsify == sparsify_kind::profile);
  CHECK_THROWS_AS((void)make_tiered_replay_options("hbm=8GiB,host=0"), invalid_argument);
  CHECK_THROWS_AS((void)make_tiered_replay_options("hbm=8GiB", 0.0), invalid_argument);
  CHECK_THROWS_AS((void)make_tiered_replay_options("hbm=8GiB", 50.0, "sjf"), invalid_argument);
  // The prefix-cache replay's own knobs.
  CHECK(parse_write_policy("write-through-selective") == write_policy::write_through_selective);
  CHECK_THROWS_AS((void)parse_write_policy("lazy"), invalid_argument);
  CHECK(parse_demotion("car") == demotion_kind::car);  // CaR's score-based replacement (#38)
  CHECK_THROWS_WITH_AS((void)parse_demotion("lfu"), "hybridcache: --demotion: unknown value 'lfu' (auto, lru, flop, car)",
                       invalid_argument);
  CHECK(parse_on_off("off", "--layerwise") == false);
  CHECK_THROWS_AS((void)parse_on_off("yes", "--layerwise"), invalid_argument);
  const auto w = parse_watermarks("0.95,0.7");
  CHECK(w.high == 0.95);
  CHECK(w.low == 0.7);
  for (const char* bad : {"0.7,0.9", "0.9", "0.9,", "a,b", "1.5,0.2", "0.9,0.8,0.1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_watermarks(bad), invalid_argument);
  }
}

// --- issue #18: output conventions -----------------------------------------------------

TEST_CASE("write_file_atomic reports a full device and leaves no partial file") {
  // /dev/full fails every write with ENOSPC: the error names the path and the reason.
  try {
    hcbench::write_file_atomic("/dev/full", std::string(1 << 16, 'x'), "--per-request");
    FAIL("no error");
  } catch (const hybridcache::invalid_argument& e) {
    CHECK(std::string(e.what()).find("--per-request: cannot write '/dev/full' (No space left on device)") !=
          std::string::npos);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("hcbench_atomic_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string target = (dir / "a.csv").string();
  { std::ofstream(target) << "old\n"; }
  hcbench::atomic_file_set set;  // the second file cannot be created: neither appears
  set.add(target, "new\n");
  set.add((dir / "no-such-dir" / "b.csv").string(), "b\n");
  CHECK_THROWS_AS(set.commit("--out"), hybridcache::invalid_argument);
  std::ifstream in(target);
  std::string line;
  std::getline(in, line);
  CHECK(line == "old");
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{}) == 1);
  hcbench::write_file_atomic(target, "new\n", "--out");
  std::ifstream again(target);
  std::getline(again, line);
  CHECK(line == "new");
  std::filesystem::remove_all(dir);
}

TEST_CASE("JSON strings and numbers are always valid JSON") {
  using hcbench::json::number;
  using hcbench::json::string;
  CHECK(string("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(string(std::string("\x01", 1)) == "\"\\u0001\"");
  CHECK(string("trace\xff.jsonl") == "\"trace\\ufffd.jsonl\"");  // not UTF-8: U+FFFD
  CHECK(string("\xc3\xa9") == "\"\xc3\xa9\"");                   // valid UTF-8 passes
  CHECK(number(std::numeric_limits<double>::quiet_NaN()) == "null");
  CHECK(number(-std::numeric_limits<double>::infinity()) == "null");
  CHECK(number(0.25) == "0.25");
  CHECK(number(std::int64_t{-3}) == "-3");
}

TEST_CASE("CSV fields and SVG text are escaped") {
  CHECK(hcbench::csv_field("plain") == "plain");
  CHECK(hcbench::csv_field("x,\"y") == "\"x,\"\"y\"");
  CHECK(hcbench::csv_field("a\nb") == "\"a\nb\"");
  using hybridcache::sim::detail::xml_escape;
  CHECK(xml_escape("a<b&\"c\"") == "a&lt;b&amp;&quot;c&quot;");
  CHECK(xml_escape(std::string("x\x01y", 3)) == "x\xEF\xBF\xBDy");  // XML forbids control characters
  CHECK(xml_escape("\xff") == "\xEF\xBF\xBD");
  CHECK(xml_escape("tab\there") == "tab\there");
}

TEST_CASE("trace_label names a trace the way a reader of the table recognises it") {
  CHECK(hcbench::trace_label("-") == "stdin");
  CHECK(hcbench::trace_label("data/chat_seed7.jsonl") == "chat_seed7");
  CHECK(hcbench::trace_label("trajs/") == "trajs");     // a directory given with its slash
  CHECK(hcbench::trace_label("runs/trajs//") == "trajs");
  CHECK(hcbench::trace_label("/dev/fd/63") == "/dev/fd/63");  // bash's <(...) has no name of its own
  CHECK(hcbench::trace_label("/proc/self/fd/5") == "/proc/self/fd/5");
  CHECK(hcbench::trace_label("/") == "/");
  CHECK(hcbench::count_of(1, "prefill engine") == "1 prefill engine");
  CHECK(hcbench::count_of(4, "prefill engine") == "4 prefill engines");
  CHECK(hcbench::count_of(0, "thread") == "0 threads");
}

TEST_CASE("round_axis_for: ticks at 1, 2 or 5 x 10^k, at most 5 steps, the top at or above the max") {
  // The alloc SVG's ticks were 37.5, 62.5, 187.5 (a quarter of a top that was not round).
  const auto check = [](double max, double step, int count) {
    const hcbench::round_axis a = hcbench::round_axis_for(max);
    CHECK(a.step == doctest::Approx(step));
    CHECK(a.count == count);
    CHECK(a.top() >= max * (1 - 1e-12));
  };
  check(250, 50, 5);
  check(150, 50, 3);
  check(37, 10, 4);
  check(1, 0.2, 5);
  check(3.2, 1, 4);
  check(9, 2, 5);
  check(10, 2, 5);
  check(11, 5, 3);
  check(750, 200, 4);
  check(0.03, 0.01, 3);
  check(0, 0.2, 5);  // nothing to show: 0..1
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> exponent(-3, 6);
  for (int i = 0; i < 2000; ++i) {
    const double max = std::pow(10.0, exponent(rng));
    const hcbench::round_axis a = hcbench::round_axis_for(max);
    const double mantissa = a.step / std::pow(10.0, std::floor(std::log10(a.step) + 1e-9));
    CHECK((std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9));
    CHECK(a.count >= 1);
    CHECK(a.count <= 5);
    CHECK(a.top() >= max * (1 - 1e-12));
    CHECK(a.step * (a.count - 1) < max);  // no empty step on top
  }
  const hcbench::round_axis a = hcbench::round_axis_for(250);
  CHECK(a.label(0) == "0");
  CHECK(a.label(3) == "150");
  CHECK(hcbench::round_axis_for(1).label(2) == "0.4");
  CHECK(hcbench::round_axis_for(0.03).label(3) == "0.03");
}

TEST_CASE("new_directories_guard removes the disk tiers' directories a failed run made, and nothing else") {
  namespace fs = std::filesystem;
  namespace tr = hybridcache::tiered;
  const fs::path root = fs::temp_directory_path() / ("hcbench_guard_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "existing");
  const auto disk = [](const fs::path& p) {
    tr::tier_config t;
    t.kind = tr::tier_kind::disk;
    t.location = p.string();
    return t;
  };
  tr::tier_config hbm;
  hbm.kind = tr::tier_kind::hbm;
  const std::vector<tr::tier_config> tiers = {hbm, disk(root / "new" / "a" / ""), disk(root / "new" / "b"),
                                              disk(root / "existing")};
  const auto run = [&](bool fail) {
    const hcbench::new_directories_guard guard(tiers);
    for (const auto& t : tiers)
      if (t.kind == tr::tier_kind::disk) fs::create_directories(t.location);
    if (fail) throw hybridcache::error("a later tier failed");
  };
  // Failed: the two new directories and the parent made for them go; the one that was there stays.
  CHECK_THROWS_AS(run(true), hybridcache::error);
  CHECK_FALSE(fs::exists(root / "new"));
  CHECK(fs::is_directory(root / "existing"));
  // A file someone put in a new directory meanwhile keeps it (and its parent).
  try {
    const hcbench::new_directories_guard guard(tiers);
    fs::create_directories(root / "new" / "b");
    { std::ofstream(root / "new" / "b" / "theirs") << "x"; }
    throw hybridcache::error("failed");
  } catch (const hybridcache::error&) {
  }
  CHECK(fs::exists(root / "new" / "b" / "theirs"));
  fs::remove_all(root / "new");
  // Succeeded: the tiers keep their directories.
  run(false);
  CHECK(fs::is_directory(root / "new" / "a"));
  CHECK(fs::is_directory(root / "new" / "b"));
  fs::remove_all(root);
}
