// hybridcache/prefix/lock_policy.hpp
//
// Lock policies for `prefix_cache` (concept `lock_policy`): `no_lock` (default; empty,
// inlined away) and `mutex_lock` (one std::mutex held for each whole call).
#pragma once

#include <mutex>

#include "hybridcache/concepts/lock.hpp"

namespace hybridcache::prefix {

/// No synchronisation: the cache is used from one thread at a time.
struct no_lock {
  void lock() noexcept {}
  void unlock() noexcept {}
};
static_assert(lock_policy<no_lock>);

/// One mutex around every public call: concurrent `match`/`commit`/`release` from several
/// threads are serialised (linearisable). Cost: one uncontended lock/unlock per call.
class mutex_lock {
 public:
  void lock() { m_.lock(); }
  void unlock() { m_.unlock(); }

 private:
  std::mutex m_;
};
static_assert(lock_policy<mutex_lock>);

}  // namespace hybridcache::prefix
