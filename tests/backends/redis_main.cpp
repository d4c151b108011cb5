// doctest main of the Redis tier's tests: exits 77 (ctest SKIP_RETURN_CODE) when
// redis-server or redis-cli is not installed, so a machine without them reports the Redis
// tests as skipped, not passed. scripts/install-deps.sh installs both.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "../support/redis_server.hpp"

int main(int argc, char** argv) {
  if (!hybridcache::test::redis_tools_available()) {
    std::printf("hybridcache Redis tests: redis-server / redis-cli not found; skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
