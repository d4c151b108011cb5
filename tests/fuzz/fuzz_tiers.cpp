// libFuzzer target: the tier spec parser (include/hybridcache/tiered/tier.hpp parse_tiers),
// as `--tiers` hands it a command-line string. Any result must pass validate_tiers.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <hybridcache/core/error.hpp>
#include <hybridcache/tiered/tier.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  try {
    const auto tiers = hybridcache::tiered::parse_tiers(spec, 16384, 50.0);
    hybridcache::tiered::validate_tiers(tiers, 16384);
  } catch (const hybridcache::error&) {
  }
  return 0;
}
