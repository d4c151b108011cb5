// Prints the dynamic shared memory each shipped kernel instantiation (ptxas_kernels.def) asks
// for at the largest shape the library supports, through the launchers' own shape functions:
// chunk 64 for the chunked prefill; for the KVBuffer kernels Qwen3-Next's defaults at the
// largest draft count (B = 16, KV-only crossover 171, 8 drafts: 178 positions). Compiled with
// g++ by .ci/check-ptxas.sh; one line per kernel: "name|rule|layout|d_k|input bytes".
#include <cstdio>

#include "hybridcache/attention/kernel_bodies.hpp"

using namespace hybridcache::attention;

namespace {
constexpr int kv_positions = 171 - 1 + 8, drafts = 8, chunk = 64;
void print(const char* kernel, const char* rule, const char* layout, int dk, const char* in, std::size_t bytes) {
  std::printf("%s|%s|%s|%d|%s %zu\n", kernel, rule, layout, dk, in, bytes);
}
}  // namespace

int main() {
#define HC_KERNEL_CONFIG(R, L, DK, DV, IN)                                                                        \
  print("recurrent_step", #R, #L, DK, #IN, recurrent_step_shape(1, 1).shared_bytes);                             \
  print("kv_step", #R, #L, DK, #IN,                                                                                \
        kv_step_shape<kv_step_program<R, state_layout::L, DK, DV, IN, float, float>>(1, 1, kv_positions, drafts)     \
            .shared_bytes);                                                                                        \
  print("kv_commit", #R, #L, DK, #IN,                                                                              \
        kv_commit_shape<kv_commit_program<R, state_layout::L, DK, DV, IN, float>>(1, 1, kv_positions).shared_bytes); \
  print("chunk_prepare", #R, #L, DK, #IN, chunk_prepare_shape<R, DK, IN>(1 << 20, 1, 1, chunk).shared_bytes);     \
  print("chunk_scan", #R, #L, DK, #IN, chunk_scan_shape<R, state_layout::L, DK, DV, IN, float>(1, 1, chunk).shared_bytes);
#define HC_IO_TYPE(IN)                                                          \
  print("kv_buffer_append", "-", "-", 0, #IN, kv_buffer_append_shape(1, 1).shared_bytes); \
  print("count_nonfinite", "-", "-", 0, #IN, elementwise_shape(1, 1).shared_bytes);       \
  print("qwen3_next_gates", "-", "-", 0, #IN, elementwise_shape(1, 1).shared_bytes);
#include "ptxas_kernels.def"
  return 0;
}
