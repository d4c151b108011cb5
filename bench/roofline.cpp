// bench/roofline.cpp — prints the roofline tables of docs/linear-attention.md: for each kernel
// and shape, the bytes it must move, the FLOPs it must do, the time at H100 SXM and H200
// peaks, the bound (memory or FP32), and for recurrent decode the time a GPU run must reach
// (80 % of HBM bandwidth at batch >= 64). No GPU needed.
//   ./build/release/bench/roofline
#include <cstdio>

#include "roofline.hpp"

namespace rb = hybridcache::bench;

namespace {

void row(const char* kernel, const char* shape, const rb::work& w) {
  std::printf("| %s | %s | %.3f | %.3f | %.2f | %.1f %s | %.1f %s |\n", kernel, shape, w.bytes / 1e6, w.flops / 1e9,
              w.flops / w.bytes, rb::roofline_seconds(w, rb::h100_sxm) * 1e6,
              rb::memory_bound(w, rb::h100_sxm) ? "(mem)" : "(fp32)", rb::roofline_seconds(w, rb::h200) * 1e6,
              rb::memory_bound(w, rb::h200) ? "(mem)" : "(fp32)");
}

}  // namespace

int main() {
  const rb::layer_shape s;  // Qwen3-Next, as bench_linear_attention runs it
  std::printf("One GDN layer, Qwen3-Next (H 16, HV 32, d 128), bf16 q/k/v, fp32 state/gates/o, KVBuffer B = 16.\n\n");
  std::printf("| kernel | shape | MB moved | GFLOP | FLOP/B | H100 SXM us | H200 us |\n|---|---|---|---|---|---|---|\n");
  char shape[64];
  for (int b : {1, 8, 64, 128, 256, 512}) {
    std::snprintf(shape, sizeof shape, "batch %d", b);
    row("recurrent_step (decode)", shape, rb::recurrent_decode(s, b));
  }
  for (int b : {1, 64, 256, 512}) {
    std::snprintf(shape, sizeof shape, "batch %d, flush cycle", b);
    row("kv_step (KVBuffer decode)", shape, rb::kvbuffer_decode(s, b, 16));
  }
  for (int b : {64, 256}) {
    std::snprintf(shape, sizeof shape, "batch %d, 4 drafts", b);
    row("recurrent_step (per-draft states)", shape, rb::verify_per_draft_states(s, b, 4));
    std::snprintf(shape, sizeof shape, "batch %d, m 8, 4 drafts", b);
    row("kv_step (verify)", shape, rb::verify_kvbuffer(s, b, 8, 4));
  }
  for (auto [seqs, T] : {std::pair{1, 8192}, std::pair{8, 2048}, std::pair{64, 512}}) {
    std::snprintf(shape, sizeof shape, "%d x %d tokens, chunk 64", seqs, T);
    row("chunk_prepare + chunk_scan", shape, rb::chunked_prefill(s, seqs, T, 64));
  }
  row("qwen3_next_gates", "8192 tokens", rb::qwen3_next_gates(s, 8192));

  std::printf("\nRecurrent decode: time a GPU run must reach (%.0f %% of peak HBM bandwidth) at batch >= 64:\n\n",
              rb::decode_bandwidth_goal * 100);
  std::printf("| batch | H100 SXM: model us | must be <= us | H200: model us | must be <= us |\n|---|---|---|---|---|\n");
  for (int b : {64, 128, 256, 512}) {
    const auto w = rb::recurrent_decode(s, b);
    const double t1 = rb::roofline_seconds(w, rb::h100_sxm) * 1e6, t2 = rb::roofline_seconds(w, rb::h200) * 1e6;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f |\n", b, t1, t1 / rb::decode_bandwidth_goal, t2,
                t2 / rb::decode_bandwidth_goal);
  }
  std::printf("\nChunked prefill on tensor cores (dense BF16 peak; the solve and the decay in FP32), the bound issue #37\n"
              "holds the kernels to within %.0fx of:\n\n", rb::prefill_tensor_roofline_goal);
  std::printf("| shape | tensor-core GFLOP | FP32 GFLOP | MB | H100 SXM us | H200 us | bound by |\n|---|---|---|---|---|---|---|\n");
  for (auto [seqs, T] : {std::pair{1, 8192}, std::pair{8, 2048}, std::pair{64, 512}}) {
    const auto w = rb::chunked_prefill_tensor_cores(s, seqs, T, 64);
    std::printf("| %d x %d tokens, chunk 64 | %.1f | %.2f | %.0f | %.1f | %.1f | %s |\n", seqs, T, w.tensor_flops / 1e9,
                w.fp32_flops / 1e9, w.bytes / 1e6, rb::roofline_seconds(w, rb::h100_sxm) * 1e6,
                rb::roofline_seconds(w, rb::h200) * 1e6, rb::memory_bound(w, rb::h200) ? "memory" : "compute");
  }
  const auto p = rb::chunked_prefill(s, 1, 8192, 64);
  std::printf("\nChunked prefill workspace (chunk tables written then read) for 1 x 8192 tokens: %.1f MB on top of %.1f MB.\n",
              rb::chunked_prefill_workspace_bytes(s, 1, 8192, 64) / 1e6, p.bytes / 1e6);
  return 0;
}
