// hybridcache/core/cuda/cuda_check.cuh
//
// Host-side error checking for CUDA runtime calls: `HYBRIDCACHE_CUDA_TRY(call)` throws
// `hybridcache::cuda_error` naming the call, the error and where it happened; small owners
// (a device array, an event, a current-device guard) used by the launchers, the copy engine
// and the tests. nvcc (or a host compiler with the CUDA runtime headers) only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "hybridcache/core/error.hpp"

namespace hybridcache {

/// Throws `cuda_error` when `status` is not cudaSuccess. `call` is the failing expression.
inline void throw_on_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky launch error so it does not leak into later calls
  throw cuda_error(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                   ") at " + file + ":" + std::to_string(line));
}

/// Makes `device` current for its lifetime and gives the caller back its own current device
/// afterwards, also when an exception leaves the scope (CUDA's current device is per host
/// thread: a library call must not change it).
class scoped_device {
 public:
  /// @throws cuda_error when the device cannot be made current.
  explicit scoped_device(int device) {
    throw_on_cuda_error(cudaGetDevice(&previous_), "cudaGetDevice", __FILE__, __LINE__);
    if (previous_ != device) {
      throw_on_cuda_error(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__);
      switched_ = true;
    }
  }
  scoped_device(const scoped_device&) = delete;
  scoped_device& operator=(const scoped_device&) = delete;
  ~scoped_device() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// An owned CUDA event (destroyed with the owner, also when an exception leaves).
class owned_event {
 public:
  /// @throws cuda_error.
  explicit owned_event(unsigned int flags = cudaEventDefault) {
    throw_on_cuda_error(cudaEventCreateWithFlags(&e_, flags), "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  owned_event(const owned_event&) = delete;
  owned_event& operator=(const owned_event&) = delete;
  ~owned_event() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// Owning, move-only device allocation of `count` elements of T (cudaMalloc / cudaFree).
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(std::size_t count) : count_(count) {
    if (count > 0) throw_on_cuda_error(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)), "cudaMalloc",
                                       __FILE__, __LINE__);
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~device_array() { reset(); }

  [[nodiscard]] T* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }

 private:
  void reset() noexcept {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);  // never throws: release paths must not
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace hybridcache

/// Evaluates a CUDA runtime call and throws hybridcache::cuda_error if it fails.
#ifndef HYBRIDCACHE_CUDA_TRY
#define HYBRIDCACHE_CUDA_TRY(call) ::hybridcache::throw_on_cuda_error((call), #call, __FILE__, __LINE__)
#endif
