// Size a cache for a hybrid model: how many SSM checkpoints and KV tokens fit in a budget,
// and what a cached prefix is worth in FLOPs per byte.
#include <cstdio>

#include <hybridcache/hybridcache.hpp>

int main() {
  using namespace hybridcache;
  const cost_model model(presets::qwen3_next_80b_a3b());
  const std::int64_t budget = std::int64_t{8} << 30;  // 8 GiB of HBM for the prefix cache

  const std::int64_t ckpt = model.ssm_checkpoint_bytes();
  const std::int64_t per_token = model.kv_bytes_per_token();
  std::printf("%s: one checkpoint = %lld B (%lld tokens of KV), KV = %lld B/token\n", model.spec().name.c_str(),
              static_cast<long long>(ckpt), static_cast<long long>(ckpt / per_token),
              static_cast<long long>(per_token));

  // A 4k-token system prompt with one checkpoint at its end:
  const std::int64_t prompt = 4096;
  const std::int64_t bytes = model.state_bytes(prompt);
  std::printf("a %lld-token prefix takes %lld B; %lld of them fit in 8 GiB\n", static_cast<long long>(prompt),
              static_cast<long long>(bytes), static_cast<long long>(budget / bytes));
  std::printf("reusing it saves %.3g FLOPs (%.0f FLOPs per cached byte)\n",
              static_cast<double>(model.prefill_flops(prompt)), model.flop_efficiency(prompt));

  const marconi_reference_ttft ttft;
  std::printf("modelled TTFT: %.1f ms cold, %.1f ms after a hit on the prefix (+256 new tokens)\n",
              ttft.prefill_ms(prompt + 256), ttft.prefill_ms(256));
  return 0;
}
