// bench/roofline.hpp — the roofline model of the linear-attention / Gated DeltaNet kernels:
// for each kernel and shape, the bytes it must move to and from HBM and the FLOPs it must do,
// and the time that takes at a device's published peaks. It is the bound a GPU run is held
// to: efficiency eta = model time at peak / measured time (bench_linear_attention prints it;
// roofline.cpp prints the tables of docs/linear-attention.md). Formulas follow
// shared/anchors/linear_attention.md §1.3-1.6 and §4; no GPU is needed to evaluate them.
//
// "Must move" counts each byte once: the state read (and written when it changes), the
// token I/O, the KVBuffer's buffered tokens; re-reads that hit L2 and the chunked prefill's
// table workspace are what an implementation adds on top (reported apart).
#pragma once

#include <algorithm>
#include <cstdint>

namespace hybridcache::bench {

/// Published peaks (NVIDIA data sheets): HBM bandwidth, non-tensor FP32 throughput and dense
/// BF16 tensor-core throughput (the sheets' 1,979 TFLOP/s is with 2:4 sparsity; dense is half).
struct device_peaks {
  const char* name;
  double hbm_bytes_per_s;
  double fp32_flops_per_s;
  double tensor_bf16_flops_per_s;
};
inline constexpr device_peaks h100_sxm{"H100 SXM", 3.35e12, 66.9e12, 989.5e12};
inline constexpr device_peaks h200{"H200", 4.8e12, 66.9e12, 989.5e12};

/// The fraction of peak HBM bandwidth recurrent GDN decode must reach at batch >= 64.
inline constexpr double decode_bandwidth_goal = 0.8;

/// One GDN layer and the element sizes its kernels read and write. Defaults: Qwen3-Next
/// (H 16, HV 32, d 128) as bench_linear_attention runs it: bf16 q/k/v, fp32 state, fp32
/// g and beta, fp32 o, KVBuffer with bf16 keys and fp32 u and g.
struct layer_shape {
  int H = 16, HV = 32, dk = 128, dv = 128;
  double in_bytes = 2;                ///< q, k, v element
  double out_bytes = 4;               ///< o element
  double gate_bytes = 8;              ///< g and beta of one (token, value head)
  double state_bytes = 4;             ///< state element
  double buffered_value_bytes = 4;    ///< u element in the KVBuffer
  double buffered_gate_bytes = 4;     ///< per buffered (token, value head): g
};

/// Bytes and FLOPs of one launch.
struct work {
  double bytes = 0;
  double flops = 0;
};
inline work operator+(work a, work b) { return {a.bytes + b.bytes, a.flops + b.flops}; }
inline work operator*(work a, double k) { return {a.bytes * k, a.flops * k}; }

/// Seconds at the device's peaks: the larger of the memory and the compute time.
inline double roofline_seconds(const work& w, const device_peaks& d) {
  return std::max(w.bytes / d.hbm_bytes_per_s, w.flops / d.fp32_flops_per_s);
}
/// True when the memory time dominates.
inline bool memory_bound(const work& w, const device_peaks& d) {
  return w.bytes / d.hbm_bytes_per_s >= w.flops / d.fp32_flops_per_s;
}

/// One entry's state (all value heads).
inline double state_bytes(const layer_shape& s) { return s.state_bytes * s.HV * s.dk * s.dv; }
/// One token's I/O of one entry: q, k (H heads), v (HV heads), g and beta, o.
inline double token_io_bytes(const layer_shape& s) {
  return s.in_bytes * (2.0 * s.H * s.dk + static_cast<double>(s.HV) * s.dv) + s.gate_bytes * s.HV +
         s.out_bytes * s.HV * s.dv;
}
/// One buffered token of one entry: its key once per key head, u and g per value head.
inline double buffered_token_bytes(const layer_shape& s) {
  return s.in_bytes * s.H * s.dk + s.buffered_value_bytes * s.HV * s.dv + s.buffered_gate_bytes * s.HV;
}

/// Recurrent decode, one token per entry: the state read and written, the token's I/O.
/// FLOPs per (entry, value head): per value column k.s and q.s (2 d_k each) and the fold
/// (mul + fma: 3 d_k), plus the q/k norms.
inline work recurrent_decode(const layer_shape& s, int batch) {
  const double per_head = 7.0 * s.dk * s.dv + 4.0 * s.dk;
  return {batch * (2 * state_bytes(s) + token_io_bytes(s)), static_cast<double>(batch) * s.HV * per_head};
}

/// KVBuffer decode with flush interval B, averaged over a whole flush cycle (m = 0..B-1
/// tokens buffered; the last step folds and writes the state): the state read every step
/// and written once per cycle, m buffered tokens read and one appended, the token's I/O.
inline work kvbuffer_decode(const layer_shape& s, int batch, int B) {
  work w;
  for (int m = 0; m < B; ++m) {
    const bool flush = m == B - 1;
    const double bytes = state_bytes(s) * (flush ? 2 : 1) + buffered_token_bytes(s) * (m + 1) + token_io_bytes(s);
    // Per (entry, head): q.k_j and k.k_j over the m + 1 positions (4 d_k each); per value
    // column k.s, q.s (4 d_k) and the sums over the buffer (4 (m + 1)); a flush folds the
    // m + 1 tokens into every column (3 d_k each) and reads the output from the new state.
    double per_head = 4.0 * s.dk * (m + 1) + s.dv * (4.0 * s.dk + 4.0 * (m + 1));
    if (flush) per_head += s.dv * (3.0 * s.dk * (m + 1) + 2.0 * s.dk);
    w = w + work{batch * bytes, static_cast<double>(batch) * s.HV * per_head};
  }
  return w * (1.0 / B);
}

/// Verification of n drafts with a stored state per draft (SGLang/vLLM's target_verify):
/// the state read once, n states written, n tokens' I/O; n recurrent steps of FLOPs.
inline work verify_per_draft_states(const layer_shape& s, int batch, int n) {
  const work one = recurrent_decode(s, batch);
  return {batch * ((1 + n) * state_bytes(s) + n * token_io_bytes(s)), one.flops * n};
}

/// KVBuffer verification of n drafts with m tokens buffered: the state read, m buffered
/// tokens read and n appended, n tokens' I/O; dots over m + n positions per draft.
inline work verify_kvbuffer(const layer_shape& s, int batch, int m, int n) {
  const double per_head = n * (4.0 * s.dk * (m + n) + s.dv * (4.0 * s.dk + 4.0 * (m + n)));
  return {batch * (state_bytes(s) + buffered_token_bytes(s) * (m + n) + n * token_io_bytes(s)),
          static_cast<double>(batch) * s.HV * per_head};
}

/// Chunked prefill of `seqs` sequences of T tokens with chunk C (chunkwise form through the
/// UT transform): the tokens' I/O, each state read and written once. FLOPs per (sequence,
/// head, chunk): the Gram K K^T and Q K^T (2 C^2 d_k), the triangular solve (C^3 / 3), per
/// value column k.s and q.s (4 C d_k), T w and P u (2 C^2) and the roll (3 C d_k).
inline work chunked_prefill(const layer_shape& s, int seqs, std::int64_t T, int C) {
  const double chunks = static_cast<double>((T + C - 1) / C);
  const double per_head_chunk =
      2.0 * C * C * s.dk + C * C * C / 3.0 + s.dv * (7.0 * C * s.dk + 2.0 * C * C);
  return {seqs * (static_cast<double>(T) * token_io_bytes(s) + 2 * state_bytes(s)),
          seqs * chunks * s.HV * per_head_chunk};
}
/// Bytes and FLOPs of one launch whose products may run on tensor cores: `tensor_flops` at
/// the tensor-core peak, `fp32_flops` (what has no matrix form) at the FP32 one.
struct tensor_work {
  double bytes = 0;
  double tensor_flops = 0;
  double fp32_flops = 0;
};

/// Seconds at the device's peaks with tensor cores: the memory time, or the two kinds of
/// FLOPs one after the other (they share the SM's issue slots), whichever is larger.
inline double roofline_seconds(const tensor_work& w, const device_peaks& d) {
  return std::max(w.bytes / d.hbm_bytes_per_s,
                  w.tensor_flops / d.tensor_bf16_flops_per_s + w.fp32_flops / d.fp32_flops_per_s);
}
/// True when the memory time dominates.
inline bool memory_bound(const tensor_work& w, const device_peaks& d) {
  return w.bytes / d.hbm_bytes_per_s >= w.tensor_flops / d.tensor_bf16_flops_per_s + w.fp32_flops / d.fp32_flops_per_s;
}

/// `chunked_prefill` as a tensor-core implementation must do it at least (issue #37's
/// "tensor-core roofline"; flash-linear-attention's form): the same bytes; on tensor cores the
/// Gram K K^T and Q K^T (2 C^2 d_k), per value column K S and Q S (4 C d_k), T w and P u
/// (2 C^2) and the state update K^T u as a product (2 C d_k, where the FP32 form's
/// token-by-token roll is 3 C d_k); in FP32 the triangular solve (C^3 / 3) and the state's
/// decay (d_k per column).
inline tensor_work chunked_prefill_tensor_cores(const layer_shape& s, int seqs, std::int64_t T, int C) {
  const double chunks = static_cast<double>((T + C - 1) / C);
  const double tensor = 2.0 * C * C * s.dk + s.dv * (6.0 * C * s.dk + 2.0 * C * C);
  const double fp32 = C * C * C / 3.0 + static_cast<double>(s.dv) * s.dk;
  return {chunked_prefill(s, seqs, T, C).bytes, seqs * chunks * s.HV * tensor, seqs * chunks * s.HV * fp32};
}
/// The goal of issue #37 for the chunked prefill: within this factor of its tensor-core roofline.
inline constexpr double prefill_tensor_roofline_goal = 3.0;

/// What this implementation adds to `chunked_prefill`: the chunk tables written by
/// chunk_prepare and read back by chunk_scan (4 C + 2 C (C + 1) floats per chunk and head).
inline double chunked_prefill_workspace_bytes(const layer_shape& s, int seqs, std::int64_t T, int C) {
  const double chunks = static_cast<double>((T + C - 1) / C);
  return 2.0 * seqs * chunks * s.HV * 4.0 * (4.0 * C + 2.0 * C * (C + 1));
}

/// Qwen3-Next gates for `tokens` tokens: a and b in, g and beta out (fp32).
inline work qwen3_next_gates(const layer_shape& s, std::int64_t tokens) {
  return {static_cast<double>(tokens) * s.HV * (2 * s.in_bytes + 8.0), static_cast<double>(tokens) * s.HV * 30.0};
}

}  // namespace hybridcache::bench
