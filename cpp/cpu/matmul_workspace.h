// cpu/matmul_workspace.h: the scratch memory of cpu::matmul — the activations quantized to
// BlockQ8A rows, their tiled copy for the AMX GEMM, and one weight panel per thread — owned by
// the CPU backend and reused by every call instead of being allocated per call.
//
// Invariant: reserve() is the only code that allocates, and cpu::matmul calls it once at its
// entry, before any kernel or worker thread runs. The backend reserves at load for the largest
// matmul its models will issue (Backend::reserve_matmul, from each activation Scratch), so a
// loaded model's matmuls never allocate; a larger call (a test, a benchmark) grows the memory
// once, there, and later calls reuse it. Not thread-safe: one matmul at a time per workspace
// (the backend runs one op at a time on its pool).
#pragma once

#include <cstdint>
#include <new>

namespace ember::cpu {

class MatmulWorkspace {
 public:
  MatmulWorkspace() = default;
  ~MatmulWorkspace() { release(); }
  MatmulWorkspace(const MatmulWorkspace&) = delete;
  MatmulWorkspace& operator=(const MatmulWorkspace&) = delete;

  // At least n_bytes of 64-byte aligned memory; the contents are not kept when it grows.
  uint8_t* reserve(int64_t n_bytes) {
    if (n_bytes > n_bytes_) {
      release();
      data_ = static_cast<uint8_t*>(::operator new (static_cast<size_t>(n_bytes), std::align_val_t{64}));
      n_bytes_ = n_bytes;
      ++n_allocations_;
    }
    return data_;
  }
  int64_t n_bytes() const { return n_bytes_; }
  // How many times reserve() allocated (tests check that a loaded model's steps add none).
  int64_t n_allocations() const { return n_allocations_; }

 private:
  void release() {
    if (data_) ::operator delete (data_, std::align_val_t{64});
    data_ = nullptr;
    n_bytes_ = 0;
  }

  uint8_t* data_ = nullptr;
  int64_t n_bytes_ = 0;
  int64_t n_allocations_ = 0;
};

}  // namespace ember::cpu
