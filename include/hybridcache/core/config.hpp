// hybridcache/core/config.hpp
//
// Version, execution-space and assertion macros shared by every header.
//
// The execution-space macros expand to CUDA keywords only when a CUDA compiler is
// compiling, and to plain `inline` otherwise, so a function written once is the device
// code under nvcc and the host reference under g++/clang++. Nothing in a signature
// changes between the two passes. This header includes no CUDA header.
#pragma once

#define HYBRIDCACHE_VERSION_MAJOR 0
#define HYBRIDCACHE_VERSION_MINOR 1
#define HYBRIDCACHE_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#define HYBRIDCACHE_CUDA_COMPILER 1
#define HYBRIDCACHE_HOST __host__
#define HYBRIDCACHE_DEVICE __device__
#define HYBRIDCACHE_HOST_DEVICE __host__ __device__
#define HYBRIDCACHE_FORCEINLINE __forceinline__
#define HYBRIDCACHE_GLOBAL __global__
#else
#define HYBRIDCACHE_CUDA_COMPILER 0
#define HYBRIDCACHE_HOST
#define HYBRIDCACHE_DEVICE
#define HYBRIDCACHE_HOST_DEVICE
#if defined(__GNUC__) || defined(__clang__)
#define HYBRIDCACHE_FORCEINLINE inline __attribute__((always_inline))
#else
#define HYBRIDCACHE_FORCEINLINE inline
#endif
#define HYBRIDCACHE_GLOBAL
#endif

// Host+device function that is always inline: the spelling every shared math function uses.
#define HYBRIDCACHE_HD_INLINE HYBRIDCACHE_HOST_DEVICE HYBRIDCACHE_FORCEINLINE

// Loop unrolling hint with the right spelling for each compiler.
#if defined(__CUDA_ARCH__)
#define HYBRIDCACHE_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define HYBRIDCACHE_UNROLL  // nvcc's host pass warns on GCC's spelling (#1675-D)
#elif defined(__clang__)
#define HYBRIDCACHE_UNROLL _Pragma("clang loop unroll(enable)")
#elif defined(__GNUC__)
#define HYBRIDCACHE_UNROLL _Pragma("GCC unroll 8")
#else
#define HYBRIDCACHE_UNROLL
#endif

// Internal invariants: checked only when HYBRIDCACHE_ENABLE_ASSERTIONS is defined (the
// Debug presets define it). Preconditions on user input are never assertions: they
// throw (see error.hpp) or return an error value on hot paths (see expected.hpp).
#if defined(HYBRIDCACHE_ENABLE_ASSERTIONS)
#if defined(__CUDA_ARCH__)
#define HYBRIDCACHE_ASSERT(cond)                                                             \
  do {                                                                                       \
    if (!(cond)) __trap();                                                                   \
  } while (0)
#else
#include <cstdio>
#include <cstdlib>
#define HYBRIDCACHE_ASSERT(cond)                                                             \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "hybridcache: assertion failed: %s (%s:%d)\n", #cond, __FILE__,  \
                   __LINE__);                                                                \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
#endif
#else
#define HYBRIDCACHE_ASSERT(cond) ((void)0)
#endif
