// libFuzzer target: the mooncake trace reader (sim/include/hybridcache/sim/mooncake_trace.hpp).
#include <hybridcache/sim/mooncake_trace.hpp>

#include "fuzz_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return hybridcache_fuzz::run_reader(data, size, [](std::istream& in) { return hybridcache::sim::mooncake_reader(in, {.block_size = 16, .synthesize_output_ids = true}); });
}
