// The one doctest main, compiled once and linked into every test executable.
//
// Exit status 77 (ctest's SKIP_RETURN_CODE for the `<part>.shared_data` entries) when
// nothing failed but a test case was skipped because the reference data is missing
// (support/shared_data.hpp), so a checkout without ../shared shows skipped tests rather
// than passed ones.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/shared_data.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases, ...
  if (rc == 0 && hybridcache::test::shared_skips().load() > 0) return 77;
  return rc;
}
