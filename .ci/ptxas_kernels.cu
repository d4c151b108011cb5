// Explicit instantiation of every kernel the library ships (ptxas_kernels.def), compiled by
// .ci/check-ptxas.sh with -Xptxas -v for sm_80 and sm_90. Also a probe of fold_row, whose
// PTX must show the explicit FMA (fma.rn.f32 + mul.rn.f32, nothing nvcc may re-contract).
#include "hybridcache/attention/cuda/linear_attention_kernels.cuh"

using namespace hybridcache::attention;

#define HC_KERNEL_CONFIG(R, L, DK, DV, IN)                                                                         \
  template __global__ void hybridcache::attention::kernels::recurrent_step<                                           \
      recurrent_program<R, state_layout::L, DK, DV, IN, float>>(recurrent_program<R, state_layout::L, DK, DV, IN, float>); \
  template __global__ void hybridcache::attention::kernels::kv_step<kv_step_program<R, state_layout::L, DK, DV, IN, float, float>>( \
      kv_step_program<R, state_layout::L, DK, DV, IN, float, float>);                                              \
  template __global__ void hybridcache::attention::kernels::kv_commit<kv_commit_program<R, state_layout::L, DK, DV, IN, float>>( \
      kv_commit_program<R, state_layout::L, DK, DV, IN, float>);                                                   \
  template __global__ void hybridcache::attention::kernels::chunk_prepare<R, state_layout::L, DK, DV, IN, float>(      \
      prefill_io<IN, float>);                                                                                      \
  template __global__ void hybridcache::attention::kernels::chunk_scan<R, state_layout::L, DK, DV, IN, float>(prefill_io<IN, float>);
#define HC_IO_TYPE(IN)                                                                                             \
  template __global__ void hybridcache::attention::kernels::kv_buffer_append<IN, float>(                              \
      kv_buffer_ref<IN, float>, int, int, const IN*, const float*, const float*);                                  \
  template __global__ void hybridcache::attention::kernels::count_nonfinite<IN>(const IN*, std::int64_t, bool, std::uint32_t*); \
  template __global__ void hybridcache::attention::kernels::qwen3_next_gates<IN>(const IN*, const IN*, const float*,      \
                                                                            const float*, float*, float*, std::int64_t, int);
#include "ptxas_kernels.def"

// fold_row as every fold compiles it: must be fma.rn(k, u, mul.rn(alpha, s)) per element.
__global__ void fold_row_probe(float* s, const float* k, float alpha, float u) {
  float x[4], kk[4];
  for (int e = 0; e < 4; ++e) x[e] = s[e], kk[e] = k[e];
  fold_row(x, alpha, kk, u);
  for (int e = 0; e < 4; ++e) s[e] = x[e];
}
