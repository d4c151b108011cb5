// bench/bench_linear_attention.cu — device benchmark of the linear-attention / Gated DeltaNet
// decode forms with Qwen3-Next shapes (H 16 key heads, HV 32 value heads, d 128, bf16 I/O,
// fp32 V-major state), batch 1..512.
//
// It first measures the device's copy bandwidth (device-to-device memcpy, read + write
// bytes), then for each form reports the median kernel time, the minimum bytes the form must
// move and the efficiency  eta = bytes_min / (time x measured bandwidth):
//   recurrent     one decode step, state read + written;
//   kvbuffer      chunkwise decode with B = 16 averaged over a whole flush cycle (m = 0..15,
//                 the last step folds and writes the state);
//   verify4-rec   4 drafts verified sequentially with a stored state per draft (SGLang/vLLM);
//   verify4-kvb   4 drafts verified in one pass from the state at the last flush + buffer;
//   kvonly@t      KV-only decode at context t (no state) vs kvbuffer.
//   prefill       chunked prefill (chunk_prepare + chunk_scan), chunk 64, against the roofline
//                 model's FP32-bound time.
// It also prints, from the roofline model (bench/roofline.hpp), the time at the device's
// published peak (H100 SXM 3.35 TB/s, H200 4.8 TB/s, recognised by name) and eta_peak against
// it. Goals (docs/linear-attention.md): recurrent eta_peak >= 0.8 at batch >= 64 (printed as
// PASS/FAIL); kvbuffer >= 1.6x recurrent at batch 256; verify4-kvb >= 3x verify4-rec; kvonly
// faster than kvbuffer below the crossover (171 tokens for this layout).
//
// Usage: bench_linear_attention [--batches 1,8,64,256,512] [--reps 7] [--iters 20]
// Needs a CUDA device. One command builds the device tests and this benchmark and runs both:
//   bash bench/run-gpu.sh
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/attention/cuda/linear_attention_kernels.cuh"
#include "roofline.hpp"

namespace hc = hybridcache::attention;
namespace rb = hybridcache::bench;

namespace {

constexpr int H = 16, HV = 32, D = 128, B = 16, DRAFTS = 4;
constexpr auto V = hc::state_layout::v_major;
using bf16 = hc::bfloat16_t;
constexpr double state_bytes = 4.0 * HV * D * D;                   // per entry, read or write
constexpr double io_bytes = 2.0 * (2 * H * D + HV * D) + 4.0 * HV * D + 8.0 * HV;  // q,k,v in; o out; g,beta
constexpr double tok_bytes = 2.0 * H * D + 4.0 * HV * D + 4.0 * HV;  // buffered k (bf16), u (fp32), g

struct options {
  std::vector<int> batches{1, 8, 64, 128, 256, 512};
  int reps = 7;
  int iters = 20;
};

void usage() {
  std::printf(
      "usage: bench_linear_attention [--batches 1,8,64,256,512] [--reps N] [--iters N]\n"
      "Measures copy bandwidth, then recurrent / KVBuffer / verification / KV-only decode kernels\n"
      "with Qwen3-Next GDN shapes. Needs a CUDA GPU (H100/H200 for the documented goals).\n");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else if (a == "--batches" && i + 1 < argc) {
      o.batches.clear();
      std::string s = argv[++i];
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t q = s.find(',', p);
        o.batches.push_back(std::atoi(s.substr(p, q - p).c_str()));
        if (q == std::string::npos) break;
        p = q + 1;
      }
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else {
      usage();
      std::exit(2);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class T>
hybridcache::device_array<T> random_device(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<T> h(n);
  for (auto& x : h) x = hc::from_float<T>(u(rng));
  hybridcache::device_array<T> d(n);
  HYBRIDCACHE_CUDA_TRY(cudaMemcpy(d.data(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Times `launch()` (one kernel) with events: median over reps of the mean over iters, in s.
template <class F>
double time_kernel(const options& o, F&& launch) {
  cudaEvent_t a, b;
  HYBRIDCACHE_CUDA_TRY(cudaEventCreate(&a));
  HYBRIDCACHE_CUDA_TRY(cudaEventCreate(&b));
  launch();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < o.reps; ++r) {
    HYBRIDCACHE_CUDA_TRY(cudaEventRecord(a));
    for (int i = 0; i < o.iters; ++i) launch();
    HYBRIDCACHE_CUDA_TRY(cudaEventRecord(b));
    HYBRIDCACHE_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    HYBRIDCACHE_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / o.iters);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return median(t);
}

double copy_bandwidth(const options& o) {
  const std::size_t bytes = std::size_t{1} << 30;
  hybridcache::device_array<char> src(bytes), dst(bytes);
  HYBRIDCACHE_CUDA_TRY(cudaMemset(src.data(), 1, bytes));
  const double t = time_kernel(o, [&] {
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
  });
  return 2.0 * static_cast<double>(bytes) / t;  // read + write
}

// The published peaks of the device, when its name says which one it is.
const rb::device_peaks* published_peaks(const char* name) {
  const std::string n = name;
  if (n.find("H200") != std::string::npos) return &rb::h200;
  if (n.find("H100") != std::string::npos && n.find("PCIe") == std::string::npos && n.find("NVL") == std::string::npos)
    return &rb::h100_sxm;
  return nullptr;
}
const rb::device_peaks* peaks = nullptr;

void row(const char* form, int batch, double seconds, double bytes, double bw) {
  std::printf("%-14s %6d %12.2f %14.0f %10.1f %7.3f", form, batch, seconds * 1e6, bytes, bytes / seconds / 1e9,
              bytes / (seconds * bw));
  if (peaks != nullptr) std::printf(" %9.3f", bytes / (seconds * peaks->hbm_bytes_per_s));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_linear_attention: no CUDA device; nothing measured. Run it on a machine with a GPU\n"
                "(see docs/linear-attention.md, \"Running the device tests and the benchmark\").\n");
    return 0;
  }
  cudaDeviceProp prop{};
  HYBRIDCACHE_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  const double bw = copy_bandwidth(o);
  peaks = published_peaks(prop.name);
  std::printf("device: %s, %d SMs; measured copy bandwidth %.0f GB/s (read + write)", prop.name,
              prop.multiProcessorCount, bw / 1e9);
  if (peaks != nullptr) std::printf(" = %.0f %% of the published %.2f TB/s", 100.0 * bw / peaks->hbm_bytes_per_s,
                                    peaks->hbm_bytes_per_s / 1e12);
  std::printf("\n%-14s %6s %12s %14s %10s %7s %9s\n", "form", "batch", "time_us", "bytes_min", "GB/s", "eta",
              peaks != nullptr ? "eta_peak" : "");
  const rb::layer_shape shape;  // the roofline model of exactly this configuration
  bool goal_met = true;
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const std::size_t tokens = static_cast<std::size_t>(max_batch) * DRAFTS;
  auto q = random_device<bf16>(tokens * H * D, -1, 1, 1), k = random_device<bf16>(tokens * H * D, -1, 1, 2);
  auto v = random_device<bf16>(tokens * HV * D, -1, 1, 3);
  auto g = random_device<float>(tokens * HV, -1.0f, -0.01f, 4), beta = random_device<float>(tokens * HV, 0.1f, 0.9f, 5);
  hybridcache::device_array<float> out(tokens * HV * D);
  auto states = random_device<float>(static_cast<std::size_t>(max_batch) * HV * D * D, -0.1f, 0.1f, 6);
  const hc::state_pool pool{states.data(), max_batch, HV, D, D, V};
  const auto qk = hc::qwen3_next_qk(D);
  const int crossover = hc::kv_only_crossover(H, HV, D, D);

  for (int batch : o.batches) {
    std::vector<std::int32_t> slots(static_cast<std::size_t>(batch));
    for (int i = 0; i < batch; ++i) slots[i] = i;
    hybridcache::device_array<std::int32_t> d_slots(slots.size());
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(d_slots.data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    auto io = [&](int n) {
      return hc::step_io<bf16, float>{d_slots.data(), batch, n, H, HV, q.data(), k.data(), v.data(), g.data(),
                                      beta.data(), out.data(), states.data(), qk};
    };
    // Recurrent decode.
    const double t_rec = time_kernel(o, [&] { hc::launch_recurrent_step<hc::delta_rule, V, D, D>(io(1), pool, slots); });
    const rb::work w_rec = rb::recurrent_decode(shape, batch);
    row("recurrent", batch, t_rec, w_rec.bytes, bw);
    if (peaks != nullptr && batch >= 64) {
      const double eta = rb::roofline_seconds(w_rec, *peaks) / t_rec;
      const bool pass = eta >= rb::decode_bandwidth_goal;
      goal_met = goal_met && pass;
      std::printf("  recurrent at batch %d: %.1f us at %s peak, measured %.1f us: eta_peak %.3f (goal >= %.2f) %s\n",
                  batch, rb::roofline_seconds(w_rec, *peaks) * 1e6, peaks->name, t_rec * 1e6, eta,
                  rb::decode_bandwidth_goal, pass ? "PASS" : "FAIL");
    }

    // KVBuffer decode over a whole flush cycle.
    hc::kv_buffer_table table({.num_slots = batch, .num_blocks = batch * 3, .block_tokens = 8, .flush_interval = B,
                               .max_new_tokens = DRAFTS});
    for (int s = 0; s < batch; ++s) (void)table.open(s, false);
    hc::device_kv_buffer_table dt(table);
    const hc::device_kv_buffer_pool<bf16, float> kv_pool(table, H, HV, D, D);
    const auto buf = kv_pool.ref(dt);
    double t_cycle = 0, bytes_cycle = 0;
    for (int m = 0; m < B; ++m) {
      dt.upload(table);
      t_cycle += time_kernel(o, [&] { hc::launch_kv_decode<hc::delta_rule, V, D, D>(io(1), pool, slots, table, buf); });
      bytes_cycle += batch * (state_bytes * (m == B - 1 ? 2 : 1) + tok_bytes * (m + 1) + io_bytes);
      for (int s = 0; s < batch; ++s) table.advance(s, 1);
    }
    row("kvbuffer", batch, t_cycle / B, bytes_cycle / B, bw);
    std::printf("  kvbuffer speedup over recurrent: %.2fx (model 1.77x, goal >= 1.6x at batch 256)\n", t_rec / (t_cycle / B));

    // Verification of 4 drafts: per-draft states (baseline) vs one KVBuffer pass (m = 8).
    hybridcache::device_array<float> inter(static_cast<std::size_t>(batch) * DRAFTS * HV * D * D);
    const double t_vrec = time_kernel(o, [&] {
      hc::launch_recurrent_step<hc::delta_rule, V, D, D>(io(DRAFTS), pool, slots, inter.data());
    });
    row("verify4-rec", batch, t_vrec, batch * ((1 + DRAFTS) * state_bytes + DRAFTS * io_bytes), bw);
    for (int i = 0; i < 8; ++i)
      for (int s = 0; s < batch; ++s) table.advance(s, 1);
    dt.upload(table);
    const double t_vkvb = time_kernel(o, [&] { hc::launch_kv_verify<hc::delta_rule, V, D, D>(io(DRAFTS), pool, slots, table, buf); });
    row("verify4-kvb", batch, t_vkvb, batch * (state_bytes + tok_bytes * (8 + DRAFTS) + DRAFTS * io_bytes), bw);
    std::printf("  verify speedup: %.2fx (model 4.57x at m = 8, goal >= 3x)\n", t_vrec / t_vkvb);

    // KV-only decode below the crossover.
    if (batch <= 256) {
      hc::kv_buffer_table kt({.num_slots = batch, .num_blocks = batch * 22, .block_tokens = 8, .flush_interval = B,
                              .max_new_tokens = 1, .kv_only_crossover = crossover});
      for (int s = 0; s < batch; ++s) (void)kt.open(s, true);
      hc::device_kv_buffer_table kdt(kt);
      const hc::device_kv_buffer_pool<bf16, float> kv_only_pool(kt, H, HV, D, D);
      const auto kbuf = kv_only_pool.ref(kdt);
      int at = 0;
      for (int ctx : {32, 96, 160}) {
        for (; at < ctx; ++at)
          for (int s = 0; s < batch; ++s) kt.advance(s, 1);
        kdt.upload(kt);
        const double t_kv = time_kernel(o, [&] { hc::launch_kv_decode<hc::delta_rule, V, D, D>(io(1), pool, slots, kt, kbuf); });
        const std::string name = "kvonly@" + std::to_string(ctx);
        row(name.c_str(), batch, t_kv, batch * (tok_bytes * (ctx + 1) + io_bytes), bw);
        std::printf("  kvonly@%d vs kvbuffer: %.2fx\n", ctx, (t_cycle / B) / t_kv);
      }
    }
  }
  // Chunked prefill: one sequence of 8192 tokens and 8 of 2048, chunk 64, no checkpoints.
  for (auto [seqs, T] : {std::pair{1, 8192}, std::pair{8, 2048}}) {
    const std::int64_t tokens_p = static_cast<std::int64_t>(seqs) * T;
    auto pq = random_device<bf16>(tokens_p * H * D, -1, 1, 11), pk = random_device<bf16>(tokens_p * H * D, -1, 1, 12);
    auto pv = random_device<bf16>(tokens_p * HV * D, -1, 1, 13);
    auto pg = random_device<float>(tokens_p * HV, -1.0f, -0.01f, 14), pb = random_device<float>(tokens_p * HV, 0.1f, 0.9f, 15);
    hybridcache::device_array<float> po(tokens_p * HV * D),
        pw(static_cast<std::size_t>(hc::prefill_workspace_floats(tokens_p, seqs, HV, 64)));
    std::vector<std::int64_t> cu(seqs + 1), starts(seqs, 0);
    std::vector<std::int32_t> pslots(seqs);
    for (int i = 0; i <= seqs; ++i) cu[i] = static_cast<std::int64_t>(i) * T;
    for (int i = 0; i < seqs; ++i) pslots[i] = i;
    hybridcache::device_array<std::int64_t> dcu(cu.size()), dst(starts.size());
    hybridcache::device_array<std::int32_t> dsl(pslots.size());
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(dcu.data(), cu.data(), cu.size() * 8, cudaMemcpyHostToDevice));
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(dst.data(), starts.data(), starts.size() * 8, cudaMemcpyHostToDevice));
    HYBRIDCACHE_CUDA_TRY(cudaMemcpy(dsl.data(), pslots.data(), pslots.size() * 4, cudaMemcpyHostToDevice));
    hc::prefill_io<bf16, float> pio;
    pio.num_seqs = seqs;
    pio.num_k_heads = H;
    pio.num_v_heads = HV;
    pio.chunk = 64;
    pio.cu_seqlens = dcu.data();
    pio.start_positions = dst.data();
    pio.slots = dsl.data();
    pio.q = pq.data();
    pio.k = pk.data();
    pio.v = pv.data();
    pio.log_decay = pg.data();
    pio.beta = pb.data();
    pio.o = po.data();
    pio.workspace = pw.data();
    pio.qk = qk;
    const hc::prefill_host_view host{cu, starts, pslots, {}, {}};
    const double t_pre = time_kernel(o, [&] { hc::launch_chunked_prefill<hc::delta_rule, V, D, D>(pio, pool, host); });
    const rb::work w_pre = rb::chunked_prefill(shape, seqs, T, 64);
    std::printf("prefill %dx%d: %.1f us, %.1f TFLOP/s", seqs, T, t_pre * 1e6, w_pre.flops / t_pre / 1e12);
    if (peaks != nullptr) {
      std::printf(", roofline %.1f us at %s (FP32-bound): eta_peak %.3f", rb::roofline_seconds(w_pre, *peaks) * 1e6,
                  peaks->name, rb::roofline_seconds(w_pre, *peaks) / t_pre);
      const double t_tc = rb::roofline_seconds(rb::chunked_prefill_tensor_cores(shape, seqs, T, 64), *peaks);
      std::printf("; tensor-core roofline %.1f us: %.1fx it (goal <= %.0fx: %s)", t_tc * 1e6, t_pre / t_tc,
                  rb::prefill_tensor_roofline_goal, t_pre <= rb::prefill_tensor_roofline_goal * t_tc ? "met" : "NOT met");
    }
    std::printf("\n");
  }
  if (peaks != nullptr)
    std::printf("goal (recurrent decode >= %.0f %% of %s peak HBM bandwidth at batch >= 64): %s\n",
                rb::decode_bandwidth_goal * 100, peaks->name, goal_met ? "met" : "NOT met");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_linear_attention: %s\n", e.what());
  return 1;
}
