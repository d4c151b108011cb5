// Storage backends below host memory: the disk tier against the file system it runs on,
// measured side by side in one run (docs/storage.md has the numbers and the commands).
//
//   bm_disk_load_vs_dd/cold|warm   goal: loading a 9.2 MB checkpoint (Jamba's) through the
//                                  disk tier (open, pread in blocks, CRC-32C, header checks)
//                                  reaches >= 70 % of a dd-style read of the same file
//                                  (open, read() in 1 MiB blocks into one buffer, close),
//                                  the three alternating in one loop, medians of the per-load
//                                  times; `cold` drops the file's
//                                  pages first (posix_fadvise DONTNEED), `warm` reads from
//                                  the page cache. Counters: tier_GBps, dd_GBps, ratio; and
//                                  load_GBps / ratio_to_load for a plain read() of the whole
//                                  file into a buffer of its size (a load that keeps the
//                                  bytes, which dd's reused 1 MiB buffer does not).
//   bm_layout_*                    the design measurement behind "one file per value": the
//                                  raw syscall pattern of a file per value (create, pwrite,
//                                  rename / open, pread, close) against an append-only
//                                  segment (pwrite / pread at an offset), per value size
//   bm_disk_put / bm_disk_get      the tier's own put / get (all checks) per value size
//   bm_crc32c_*                    the checksum: crc32 instruction (3 streams), slicing-by-8,
//                                  and memcpy of the same bytes for scale
//
// The directory is $HYBRIDCACHE_BENCH_DIR or ./hc-bench-storage (created, then removed): put
// it on the file system to measure.
//   build/release/bench/bench_storage --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/core/crc32c.hpp>
#include <hybridcache/tiered/disk_backend.hpp>

using namespace hybridcache;
using namespace hybridcache::tiered;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t checkpoint_bytes = 9'200'000;  // Jamba-1.5-Mini's SSM checkpoint, 9.2 MB

fs::path bench_dir() {
  const char* env = std::getenv("HYBRIDCACHE_BENCH_DIR");
  return fs::path(env != nullptr ? env : "hc-bench-storage");
}

std::vector<std::byte> random_bytes(std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  return v;
}

/// A disk tier in a fresh directory, removed afterwards.
struct scratch_tier {
  explicit scratch_tier(const std::string& tag)
      : dir(bench_dir() / tag),
        tier((fs::remove_all(dir), disk_backend_config{.directory = dir.string(), .capacity_bytes = std::int64_t{8} << 30,
                                                       .io_threads = 2, .queue_depth = 64,
                                                       .io_block_bytes = std::int64_t{1} << 20})) {}
  ~scratch_tier() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path dir;
  disk_backend<> tier;
};

void drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// What `dd if=path of=/dev/null bs=1M` does: read() 1 MiB at a time into one buffer.
std::int64_t dd_style_read(const std::string& path, std::vector<std::byte>& block) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n <= 0) break;
    total += n;
  }
  ::close(fd);
  return total;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The least a load that keeps the bytes does: read() the whole file into one buffer of
/// its size, 1 MiB per call, no checks.
std::int64_t plain_load(const std::string& path, std::vector<std::byte>& into) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::int64_t total = 0;
  for (;;) {
    const std::size_t want = std::min<std::size_t>(std::size_t{1} << 20, into.size() - static_cast<std::size_t>(total));
    if (want == 0) break;
    const ssize_t n = ::read(fd, into.data() + total, want);
    if (n <= 0) break;
    total += n;
  }
  ::close(fd);
  return total;
}

}  // namespace

// Goal: the tier's sequential load of a 9.2 MB checkpoint vs a dd-style read, same file.
static void bm_disk_load_vs_dd(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  scratch_tier s(cold ? "load_cold" : "load_warm");
  const storage_key key{1, 2, 3, value_kind::checkpoint};
  const auto value = random_bytes(checkpoint_bytes);
  (void)s.tier.wait(*s.tier.put(key, {3, {}}, value));
  const std::string path = s.tier.path_of(key);
  std::vector<std::byte> into(value.size()), block(std::size_t{1} << 20);
  std::vector<double> tier_s, dd_s, load_s;
  auto timed = [](std::vector<double>& out, auto&& f) {
    const auto a = std::chrono::steady_clock::now();
    f();
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  };
  for (auto _ : state) {
    if (cold) drop_page_cache(path);
    timed(dd_s, [&] { benchmark::DoNotOptimize(dd_style_read(path, block)); });
    if (cold) drop_page_cache(path);
    timed(load_s, [&] { benchmark::DoNotOptimize(plain_load(path, into)); });
    if (cold) drop_page_cache(path);
    io_result r;
    timed(tier_s, [&] { r = s.tier.wait(*s.tier.get(key, into)).value(); });
    if (r.status != io_status::ok) state.SkipWithError("get failed");
  }
  // Medians of the per-load times: on a shared machine a load that lost its CPU for a
  // scheduling slice says nothing about the code, and it would dominate a mean.
  const double bytes = static_cast<double>(checkpoint_bytes + static_cast<std::int64_t>(value_header_bytes));
  const double tier = median(tier_s), dd = median(dd_s), load = median(load_s);
  state.counters["tier_GBps"] = bytes / tier / 1e9;
  state.counters["dd_GBps"] = bytes / dd / 1e9;
  state.counters["ratio"] = dd / tier;
  state.counters["load_GBps"] = bytes / load / 1e9;
  state.counters["ratio_to_load"] = load / tier;
}
BENCHMARK(bm_disk_load_vs_dd)->Arg(1)->Arg(0)->ArgName("cold")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Design measurement: a file per value vs an append-only segment, raw syscalls only.
static void bm_layout_file_per_value_put(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const fs::path dir = bench_dir() / "layout_files";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto v = random_bytes(size);
  std::uint64_t i = 0;
  for (auto _ : state) {
    std::string tmp = (dir / "t").string(), fin = (dir / "f").string();
    tmp += std::to_string(i);
    fin += std::to_string(i++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    benchmark::DoNotOptimize(::pwrite(fd, v.data(), size, 0));
    ::close(fd);
    ::rename(tmp.c_str(), fin.c_str());
    if (i % 256 == 0) {  // bounded footprint; unlinks are outside the timing
      state.PauseTiming();
      fs::remove_all(dir);
      fs::create_directories(dir);
      state.ResumeTiming();
    }
  }
  fs::remove_all(dir);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
static void bm_layout_segment_put(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  fs::create_directories(bench_dir());
  const std::string seg = (bench_dir() / "layout_segment").string();
  int fd = ::open(seg.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  const auto v = random_bytes(size);
  std::uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(::pwrite(fd, v.data(), size, static_cast<off_t>(i++ % 256 * size)));
    if (i % 256 == 0) {
      state.PauseTiming();
      ::close(fd);
      fd = ::open(seg.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
      state.ResumeTiming();
    }
  }
  ::close(fd);
  fs::remove(seg);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
static void bm_layout_file_per_value_get(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const fs::path dir = bench_dir() / "layout_files_get";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto v = random_bytes(size);
  constexpr int files = 32;
  for (int i = 0; i < files; ++i) {
    const int fd = ::open((dir / std::to_string(i)).c_str(), O_WRONLY | O_CREAT, 0644);
    (void)!::pwrite(fd, v.data(), size, 0);
    ::close(fd);
  }
  std::vector<std::byte> into(size);
  int i = 0;
  for (auto _ : state) {
    const int fd = ::open((dir / std::to_string(i++ % files)).c_str(), O_RDONLY);
    struct stat st {};
    ::fstat(fd, &st);
    benchmark::DoNotOptimize(::pread(fd, into.data(), size, 0));
    ::close(fd);
  }
  fs::remove_all(dir);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
static void bm_layout_segment_get(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  fs::create_directories(bench_dir());
  const std::string seg = (bench_dir() / "layout_segment_get").string();
  const int fd = ::open(seg.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  const auto v = random_bytes(size);
  constexpr int values = 32;
  for (int i = 0; i < values; ++i) (void)!::pwrite(fd, v.data(), size, static_cast<off_t>(i * size));
  std::vector<std::byte> into(size);
  int i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(::pread(fd, into.data(), size, static_cast<off_t>(i++ % values * size)));
  ::close(fd);
  fs::remove(seg);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
#define HC_SIZES ->Arg(4096)->Arg(64 << 10)->Arg(1 << 20)->Arg(checkpoint_bytes)->UseRealTime()
BENCHMARK(bm_layout_file_per_value_put) HC_SIZES;
BENCHMARK(bm_layout_segment_put) HC_SIZES;
BENCHMARK(bm_layout_file_per_value_get) HC_SIZES;
BENCHMARK(bm_layout_segment_get) HC_SIZES;

// The tier itself, all checks included (warm page cache).
static void bm_disk_put(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  scratch_tier s("put");
  const auto v = random_bytes(size);
  std::uint64_t i = 0;
  for (auto _ : state) {
    const storage_key k{1, i % 256, static_cast<std::int64_t>(i % 256), value_kind::kv};
    ++i;
    if (s.tier.wait(*s.tier.put(k, {0, {}}, v))->status != io_status::ok) state.SkipWithError("put failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
static void bm_disk_get(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  scratch_tier s("get");
  const auto v = random_bytes(size);
  for (std::uint64_t i = 0; i < 32; ++i) (void)s.tier.wait(*s.tier.put({1, i, static_cast<std::int64_t>(i), value_kind::kv}, {0, {}}, v));
  std::vector<std::byte> into(size);
  std::uint64_t i = 0;
  for (auto _ : state) {
    const storage_key k{1, i % 32, static_cast<std::int64_t>(i % 32), value_kind::kv};
    ++i;
    if (s.tier.wait(*s.tier.get(k, into))->status != io_status::ok) state.SkipWithError("get failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
BENCHMARK(bm_disk_put) HC_SIZES;
BENCHMARK(bm_disk_get) HC_SIZES;

static void bm_crc32c_hardware(benchmark::State& state) {
  const auto v = random_bytes(checkpoint_bytes);
  for (auto _ : state) benchmark::DoNotOptimize(crc32c(v));
  state.SetBytesProcessed(state.iterations() * checkpoint_bytes);
  state.SetLabel(crc32c_hardware() ? "crc32 instruction" : "no SSE4.2: slicing-by-8");
}
static void bm_crc32c_software(benchmark::State& state) {
  const auto v = random_bytes(checkpoint_bytes);
  for (auto _ : state) benchmark::DoNotOptimize(crc32c_software(v));
  state.SetBytesProcessed(state.iterations() * checkpoint_bytes);
}
static void bm_memcpy_checkpoint(benchmark::State& state) {
  const auto v = random_bytes(checkpoint_bytes);
  std::vector<std::byte> into(v.size());
  for (auto _ : state) {
    std::memcpy(into.data(), v.data(), v.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * checkpoint_bytes);
}
BENCHMARK(bm_crc32c_hardware);
BENCHMARK(bm_crc32c_software);
BENCHMARK(bm_memcpy_checkpoint);

BENCHMARK_MAIN();
