// hybridcache/core/byte_count.hpp
//
// The one type of a byte amount in the library's API: capacities (every budget is spelled
// `capacity_bytes`), unit sizes, byte counters, bytes moved. Signed, like every size and
// token count in the runtime (`std::int64_t`), so a difference of two amounts needs no
// cast and a negative input is caught by a check rather than wrapped into a huge budget;
// 2^63 B (8 EiB) is no practical limit. Unit and page counts are `std::int64_t` too.
#pragma once

#include <cstdint>

namespace hybridcache {

/// A number of bytes (see the file comment).
using byte_count = std::int64_t;

}  // namespace hybridcache
