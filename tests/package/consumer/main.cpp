// Uses the installed/added library the way a downstream runtime would.
#include <hybridcache/hybridcache.hpp>

#include <cstdio>

int main() {
  const hybridcache::cost_model m(hybridcache::presets::marconi_7b());
  if (m.ssm_checkpoint_bytes() != 26'787'840 || m.kv_bytes_per_token() != 65'536) return 1;
  std::printf("consumer ok: checkpoint %lld B\n", static_cast<long long>(m.ssm_checkpoint_bytes()));
  return 0;
}
