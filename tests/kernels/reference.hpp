// tests/kernels/reference.hpp — fp64 host oracle and random problems for the
// linear-attention / Gated DeltaNet tests (host path of include/hybridcache/cuda/).
//
// The oracle is the token-by-token recurrence in fla's convention (anchors/linear_attention.md
// §1.1, §2.1) in double precision, written independently of the library's row decomposition.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hybridcache/attention/linear_attention_common.hpp"

namespace hctest {

namespace hc = hybridcache::attention;

/// One sequence: q, k [T][H][dk], v [T][HV][dv], g, beta [T][HV], initial states [HV][dk][dv]
/// (K-major, double). Values are random and never zero.
struct problem {
  int T = 0, H = 0, HV = 0, dk = 0, dv = 0;
  std::vector<float> q, k, v, g, beta;
  std::vector<double> s0;  // [HV][dk][dv]
  hc::qk_options opt;

  /// Elements of an output tensor [T][HV][dv].
  [[nodiscard]] std::size_t o_size() const { return static_cast<std::size_t>(T) * HV * dv; }
};

/// Random problem. `gate_norm` > 0: g = logsigmoid(U(0,1)) / gate_norm with a fraction
/// `zero_gate` of rows forced to g = 0 (fla's test recipe); gate_norm = 0: no decay.
inline problem make_problem(std::uint64_t seed, int T, int H, int HV, int dk, int dv, double gate_norm,
                            double zero_gate, bool l2) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), u01(0.0f, 1.0f);
  auto nz = [&] {
    float x = u(rng);
    return std::fabs(x) < 1e-3f ? 0.5f : x;
  };
  problem p;
  p.T = T;
  p.H = H;
  p.HV = HV;
  p.dk = dk;
  p.dv = dv;
  p.q.resize(static_cast<std::size_t>(T) * H * dk);
  p.k.resize(p.q.size());
  p.v.resize(static_cast<std::size_t>(T) * HV * dv);
  p.g.resize(static_cast<std::size_t>(T) * HV);
  p.beta.resize(p.g.size());
  for (auto& x : p.q) x = nz();
  for (auto& x : p.k) x = nz();
  for (auto& x : p.v) x = nz();
  for (auto& x : p.g) {
    if (gate_norm <= 0) {
      x = 0.0f;
      continue;
    }
    const float r = 0.02f + 0.96f * u01(rng);
    x = u01(rng) < zero_gate ? 0.0f : static_cast<float>(-std::log1p(std::exp(-r)) / gate_norm);
  }
  for (auto& x : p.beta) x = 0.05f + 0.9f * u01(rng);
  p.s0.resize(static_cast<std::size_t>(HV) * dk * dv);
  for (auto& x : p.s0) x = 0.3 * nz();
  p.opt = l2 ? hc::qwen3_next_qk(dk) : hc::qk_options{false, 1.0f / std::sqrt(static_cast<float>(dk)), 1e-6f};
  return p;
}

/// Rounds every input through `In` (so the oracle sees exactly what a 16-bit kernel reads).
template <class In>
std::vector<In> to_io(const std::vector<float>& x) {
  std::vector<In> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = hc::from_float<In>(x[i]);
  return out;
}
template <class In>
void round_inputs(problem& p) {
  for (auto* vec : {&p.q, &p.k, &p.v})
    for (auto& x : *vec) x = hc::to_float(hc::from_float<In>(x));
}

/// fp64 recurrence over tokens [t_begin, t_end) for value head hv, state `s` ([dk][dv], K-major,
/// updated in place); outputs o [T][HV][dv] (double). `delta` selects the rule.
inline void reference_run(const problem& p, bool delta, int hv, std::vector<double>& s, std::vector<double>& o,
                          int t_begin, int t_end) {
  const int h = hv / (p.HV / p.H);
  std::vector<double> q(p.dk), k(p.dk), x(p.dv);
  for (int t = t_begin; t < t_end; ++t) {
    double qq = 0, kk = 0;
    for (int i = 0; i < p.dk; ++i) {
      q[i] = p.q[(static_cast<std::size_t>(t) * p.H + h) * p.dk + i];
      k[i] = p.k[(static_cast<std::size_t>(t) * p.H + h) * p.dk + i];
      qq += q[i] * q[i];
      kk += k[i] * k[i];
    }
    const double qf = p.opt.l2_normalize ? p.opt.scale / std::sqrt(qq + p.opt.eps) : p.opt.scale;
    const double kf = p.opt.l2_normalize ? 1.0 / std::sqrt(kk + p.opt.eps) : 1.0;
    for (int i = 0; i < p.dk; ++i) {
      q[i] *= qf;
      k[i] *= kf;
    }
    const double alpha = std::exp(static_cast<double>(p.g[static_cast<std::size_t>(t) * p.HV + hv]));
    const double beta = p.beta[static_cast<std::size_t>(t) * p.HV + hv];
    for (int c = 0; c < p.dv; ++c) {
      const double v = p.v[(static_cast<std::size_t>(t) * p.HV + hv) * p.dv + c];
      double u = v;
      if (delta) {
        double sk = 0;
        for (int i = 0; i < p.dk; ++i) sk += s[static_cast<std::size_t>(i) * p.dv + c] * k[i];
        u = beta * (v - alpha * sk);
      }
      double out = 0;
      for (int i = 0; i < p.dk; ++i) {
        double& e = s[static_cast<std::size_t>(i) * p.dv + c];
        e = alpha * e + k[i] * u;
        out += e * q[i];
      }
      x[c] = out;
    }
    for (int c = 0; c < p.dv; ++c) o[(static_cast<std::size_t>(t) * p.HV + hv) * p.dv + c] = x[c];
  }
}

/// Initial state of value head hv (K-major, double).
inline std::vector<double> initial_state(const problem& p, int hv) {
  const auto n = static_cast<std::size_t>(p.dk) * p.dv;
  return {p.s0.begin() + static_cast<std::ptrdiff_t>(hv * n), p.s0.begin() + static_cast<std::ptrdiff_t>((hv + 1) * n)};
}

/// Writes a K-major double state into a float state of the given layout.
inline void store_state(hc::state_layout layout, int dk, int dv, const std::vector<double>& s, float* out) {
  for (int i = 0; i < dk; ++i)
    for (int c = 0; c < dv; ++c)
      out[layout == hc::state_layout::k_major ? i * dv + c : c * dk + i] =
          static_cast<float>(s[static_cast<std::size_t>(i) * dv + c]);
}
/// Reads a float state of the given layout as K-major double.
inline std::vector<double> load_state(hc::state_layout layout, int dk, int dv, const float* in) {
  std::vector<double> s(static_cast<std::size_t>(dk) * dv);
  for (int i = 0; i < dk; ++i)
    for (int c = 0; c < dv; ++c)
      s[static_cast<std::size_t>(i) * dv + c] = in[layout == hc::state_layout::k_major ? i * dv + c : c * dk + i];
  return s;
}

/// fla's metric, without its `max |diff| <= 1e-6` shortcut (which would hide errors on small
/// outputs): relative RMS error of `got` against `ref`.
template <class A, class B>
double rel_rms(const A& got, const B& ref) {
  double num = 0, den = 0, maxd = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(static_cast<double>(got[i]))) return HUGE_VAL;
    const double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
    maxd = std::max(maxd, std::fabs(d));
  }
  if (maxd == 0.0) return 0.0;
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace hctest
