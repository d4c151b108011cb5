// Uses the installed/added library the way a downstream runtime would.
#include <hybridcache/hybridcache.hpp>

#include <cstdio>
#include <vector>

int main() {
  const hybridcache::cost_model m(hybridcache::presets::marconi_7b());
  if (m.ssm_checkpoint_bytes() != 26'787'840 || m.kv_bytes_per_token() != 65'536) return 1;
  // A Marconi cache through the named composition (compose/bundles.hpp), single-threaded:
  // the consumer links hybridcache::hybridcache alone.
  namespace pc = hybridcache::prefix;
  hybridcache::compose::marconi_cache<> cache(m, hybridcache::stores::counting_store(10 * m.ssm_checkpoint_bytes(), m.kv_bytes_per_token(),
                                                  m.ssm_checkpoint_bytes()),
                            pc::flop_aware_scorer(m, {.alpha = 1.0}));
  const std::vector<hybridcache::token_id> seq(300, 7);
  auto miss = cache.match(seq);
  if (!miss || miss->hit() || !cache.commit(seq, 300, &*miss)) return 1;
  auto hit = cache.match(seq);
  if (!hit || hit->reusable_tokens != 300 || !cache.release(*hit)) return 1;
  std::printf("consumer ok: checkpoint %lld B\n", static_cast<long long>(m.ssm_checkpoint_bytes()));
  return 0;
}
