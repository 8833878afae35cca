// vulkan/backend_vulkan.h: the Vulkan compute backend. Buffers are device memory (see
// vulkan/device.h for how their pointers work); weights are uploaded once, at load; every op
// records a dispatch into the device's command stream, which download() and synchronize()
// submit — one submission and one wait per engine step, when the step's only download is its
// logits. Small host tables an op reads (token ids, positions, block tables, RoPE frequencies)
// may stay host pointers: they are copied into the stream as the op is recorded.
// Each op's recording is in the file named as its CPU implementation (matmul.cpp, rms_norm.cpp,
// rope.cpp, elementwise.cpp, softmax.cpp, get_rows.cpp, store_kv.cpp, copy_kv.cpp, attention.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "vulkan/device.h"

namespace ember {

class VulkanBackend final : public Backend {
 public:
  // Device `index` of vulkan_devices(); throws Unsupported saying why it cannot be used.
  explicit VulkanBackend(int index);

  const char* name() const override { return "vulkan"; }
  std::string device_name() const override;
  std::optional<DeviceMemory> device_memory() const override;
  int n_threads() const override { return 1; }
  bool supports(Op op, DType dtype) const override;
  int64_t matmul_exact_min_rows(DType wtype) const override;
  void reserve_matmul(int64_t max_rows, int64_t max_n_in) override;
  void synchronize() override { device_.submit_and_wait(); }
  int64_t n_submissions() const override { return device_.n_submissions(); }

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
  // One dispatch of the elementwise shader (elementwise.cpp).
  void elementwise(uint32_t op, const float* a, const float* b, int64_t n, int64_t n_cols, float s, float* y);

  vk::Device device_;
  int index_;
  Buffer act_;  // f32 [max_rows, max_n_in] activations rounded for quantized weights (matmul.cpp)
};

// The Vulkan devices of this machine, with what ember can use; throws Unsupported saying why
// there are none to list (no loader, no driver).
std::vector<BackendDevice> vulkan_devices();

}  // namespace ember
