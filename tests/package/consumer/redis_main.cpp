// Builds against the opt-in Redis tier (hybridcache::redis): compiles its header and links
// hiredis. Built, not run, by the packaging test (it would need a server).
#include <hybridcache/tiered/redis/redis_backend.hpp>

int main() {
  hybridcache::tiered::redis_backend<> tier({.server = {.endpoints = {{"127.0.0.1", 6379}}}, .capacity_bytes = 1 << 20});
  return tier.capacity_bytes() == (1 << 20) ? 0 : 1;
}
