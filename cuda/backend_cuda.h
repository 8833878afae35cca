// cuda/backend_cuda.h: the CUDA backend. Buffers are device memory from cudaMalloc (real device
// addresses, so model code's pointer arithmetic works on them as on host memory); weights are
// uploaded once, at load, in the file's layout (the kernels dequantize blocks in registers);
// every op launches its kernels on the backend's one stream, which download() and synchronize()
// wait for — one wait per engine step, when the step's only download is its logits. Small host
// tables an op reads (token ids, positions, block tables, RoPE frequencies, expert rows) may stay
// host pointers: they are copied into a pinned per-step argument arena and on to the device, in
// stream order, as the op is launched.
// Each op's kernels are in the file named as its CPU implementation (matmul.cu, rms_norm.cu,
// layer_norm.cu, rope.cu, elementwise.cu, softmax.cu, get_rows.cu, store_kv.cu, copy_kv.cu,
// attention.cu). This header includes no CUDA header: the registry includes it from plain C++.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ember {

class CudaBackend final : public Backend {
 public:
  // Device `index` of cuda_devices(); throws Unsupported saying why it cannot be used.
  explicit CudaBackend(int index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  std::string device_name() const override;
  std::optional<DeviceMemory> device_memory() const override;
  int n_threads() const override { return 1; }
  bool supports(Op op, DType dtype) const override;
  int64_t matmul_exact_min_rows(DType wtype) const override;
  void reserve_matmul(int64_t max_rows, int64_t max_n_in) override;
  void synchronize() override;
  int64_t n_submissions() const override { return n_submissions_; }

  Buffer alloc(size_t n_bytes) override;
  Buffer wrap_host(const void* data, size_t n_bytes) override;
  Buffer prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) override;
  void upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) override;
  void download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) override;

  void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
              float* y) override;
  void get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids,
                float* y) override;
  void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps,
                float* y) override;
  void layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows, int64_t n_cols,
                  float eps, float* y) override;
  void rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& params) override;
  void add(const float* a, const float* b, int64_t n, float* y) override;
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* y) override;
  void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) override;
  void gelu_mul(const float* gate, const float* up, int64_t n, float* y) override;
  void gelu(const float* x, int64_t n, float* y) override;
  void scale(float* x, int64_t n, float s) override;
  void add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids, int64_t n_cols,
                       float* y) override;
  void softcap(float* x, int64_t n, float cap) override;
  void softmax(float* x, int64_t n_rows, int64_t n_cols) override;
  void store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim, const float* k,
                const float* v) override;
  void copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) override;
  void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                 const AttentionParams& params, float* out) override;

 protected:
  void free_buffer(void* data, size_t n_bytes) override;

 private:
  // Makes this backend's device current for the calling thread (engine and loader threads differ).
  void use() const;
  // The device address of n_bytes read from p: p itself when it is this backend's memory, else a
  // copy of the host bytes in this step's argument arena, made now in stream order, so the caller
  // may reuse its memory at once.
  const void* argument_bytes(const void* p, size_t n_bytes);
  template <typename T>
  const T* argument(const T* p, int64_t n) {
    return static_cast<const T*>(argument_bytes(p, sizeof(T) * static_cast<size_t>(n)));
  }
  // Records that work was queued on the stream (a kernel launch or an async copy) and checks the
  // launch itself (a bad configuration fails here; faults inside kernels surface at finish()).
  void launched(const char* what);
  // Waits for the stream; a wait that had work counts as one submission. Throws Error naming the
  // first failure the stream met.
  void finish(const char* what);
  // One launch of the elementwise kernel (elementwise.cu).
  void elementwise(int op, const float* a, const float* b, int64_t n, int64_t n_cols, float s, float* y);

  int index_;
  std::string device_label_;  // "NVIDIA H100 80GB HBM3 (compute 9.0)"
  int64_t memory_bytes_ = 0;
  CUstream_st* stream_ = nullptr;
  bool pending_ = false;  // work queued since the last finish()
  int64_t n_submissions_ = 0;
  std::map<uintptr_t, size_t> allocations_;  // base -> bytes, of alloc()'s device memory
  uint8_t* host_arena_ = nullptr;            // pinned host staging of this step's host tables
  uint8_t* device_arena_ = nullptr;          // their device copies
  size_t arena_used_ = 0;
  Buffer act_;  // f32 [max_rows, max_n_in] activations rounded for quantized weights (matmul.cu)
};

// The CUDA devices of this machine, with what ember can use; throws Unsupported saying why there
// are none to list (no driver, no device, a driver older than the runtime).
std::vector<BackendDevice> cuda_devices();

}  // namespace ember
