// A hybrid prefix cache whose KV pages and SSM checkpoints live in an asymmetric pool:
// the composition a runtime uses. Three conversations share a system prompt; turns after
// the first reuse the whole earlier conversation, and the shared prompt hits from its
// third occurrence on (Marconi's judicious admission checkpoints the branch point on the
// second).
#include <cstdio>
#include <vector>

#include <hybridcache/hybridcache.hpp>

int main() {
  using namespace hybridcache;
  const cost_model model(presets::jamba_1_5_mini());

  // 2 GiB of host memory shared by KV pages (16 tokens x one attention layer) and SSM
  // blocks (one layer of one sequence); capacity moves between the two on demand.
  using pool_t = memory::host_asymmetric_pool<memory::threshold_rebalancer>;
  using store_t = stores::pool_state_store<pool_t>;
  pool_t pool({.capacity_bytes = std::uint64_t{2} << 30,
               .kv_page_bytes = memory::kv_page_bytes(model),
               .ssm_block_bytes = memory::checkpoint_block_bytes(model)});
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::flop_aware_scorer, store_t> cache(
      model, store_t(pool, 16, model.attention_layers(), model.recurrent_layers()),
      prefix::flop_aware_scorer(model, {.alpha = 1.0}));

  std::vector<token_id> system_prompt(2000);
  for (std::size_t i = 0; i < system_prompt.size(); ++i) system_prompt[i] = static_cast<token_id>(100 + i % 997);

  for (int user = 0; user < 3; ++user) {
    std::vector<token_id> history = system_prompt;
    for (int turn = 0; turn < 3; ++turn) {
      std::vector<token_id> input = history;
      for (int k = 0; k < 50; ++k) input.push_back(5000 + 100 * user + 10 * turn + k % 7);  // user message

      auto hit = cache.match(input).value();         // pins what it returns
      auto plan = cache.plan(input, hit).value();    // where this prefill must save SSM states
      std::printf("user %d turn %d: %5zu input tokens, %5lld reused, %zu checkpoint(s) to capture\n", user, turn,
                  input.size(), static_cast<long long>(hit.reusable_tokens), plan.sites.size());
      // ... the engine prefills input[hit.reusable_tokens:], saving states at plan.sites,
      //     then decodes the answer:
      std::vector<token_id> sequence = input;
      for (int k = 0; k < 40; ++k) sequence.push_back(9000 + k);
      (void)cache.commit(sequence, static_cast<std::int64_t>(input.size()), &hit).value();
      history = sequence;
    }
  }
  const auto kv = pool.stats(pool_kind::kv);
  const auto ssm = pool.stats(pool_kind::ssm);
  std::printf("pool: KV %llu/%llu pages used, SSM %llu/%llu blocks used; %lld tokens and %lld checkpoints cached\n",
              static_cast<unsigned long long>(kv.used_units), static_cast<unsigned long long>(kv.total_units),
              static_cast<unsigned long long>(ssm.used_units), static_cast<unsigned long long>(ssm.total_units),
              static_cast<long long>(cache.tokens_cached()), static_cast<long long>(cache.checkpoints_cached()));
  return cache.counters().tokens_skipped > 0 ? 0 : 1;  // the example must actually reuse state
}
