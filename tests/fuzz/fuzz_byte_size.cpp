// libFuzzer target: the byte-size grammar (include/hybridcache/core/byte_size.hpp).
// parse_byte_size never throws; parse_byte_size_or_throw throws only hybridcache::error and
// agrees with it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <hybridcache/core/byte_size.hpp>
#include <hybridcache/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto r = hybridcache::parse_byte_size(text);
  try {
    const std::int64_t v = hybridcache::parse_byte_size_or_throw(text, "size");
    if (!r || *r != v) std::abort();
  } catch (const hybridcache::error&) {
    if (r) std::abort();
  }
  return 0;
}
