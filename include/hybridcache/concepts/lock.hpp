// hybridcache/concepts/lock.hpp
//
// `lock_policy`: how concurrent calls into one prefix cache are serialised. Models:
// prefix/lock_policy.hpp (no_lock, mutex_lock).
#pragma once

#include <concepts>

namespace hybridcache {

/// Serialises `match`, `plan`, `commit` and `release` when several threads share a cache.
/// The cache holds the lock for the whole call (`lock()` ... `unlock()`); `no_lock` makes
/// both empty so a single-threaded cache pays nothing.
template <class L>
concept lock_policy = std::default_initializable<L> && requires(L& l) {
  { l.lock() } -> std::same_as<void>;
  { l.unlock() } -> std::same_as<void>;
};

}  // namespace hybridcache
