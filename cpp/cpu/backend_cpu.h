// cpu/backend_cpu.h: the CPU backend — the reference every other backend is tested against.
// Owns the thread pool its ops run on and their scratch; buffers are plain host memory, and
// weights are read in place from the GGUF mapping.
#pragma once

#include <memory>
#include <vector>

#include "backend.h"
#include "core/thread_pool.h"
#include "cpu/matmul_workspace.h"
#include "cpu/ops.h"

namespace ember {

class CpuBackend final : public Backend {
 public:
  // n_threads <= 0 means ThreadPool::default_n_threads().
  explicit CpuBackend(int n_threads = 0);

  const char* name() const override { return "cpu"; }
  bool supports(Op op, DType dtype) const override;
  int64_t matmul_exact_min_rows(DType wtype) const override;
  void reserve_matmul(int64_t max_rows, int64_t max_n_in) override;
  // The matmul scratch (tests check that a loaded model's steps never grow it).
  const cpu::MatmulWorkspace& matmul_workspace() const { return matmul_workspace_; }
  void synchronize() override {}
  int n_threads() const override { return pool_.n_threads(); }
  ThreadPool& pool() { return pool_; }

  Buffer alloc(size_t n_bytes) override;
  Buffer wrap_host(const void* data, size_t n_bytes) override;
  Buffer prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) override;
  void upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) override;
  void download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) override;

  void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
              float* y) override;
  void matmul_many(const MatmulOut* outs, int n_outs, int64_t n_in, const float* x, int64_t n_rows) override;
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
  void softcap(float* x, int64_t n, float cap) override;
  void softmax(float* x, int64_t n_rows, int64_t n_cols) override;
  void add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids, int64_t n_cols,
                       float* y) override;
  void add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                    const float* x, int64_t n_in, const LowRankScratch& scratch) override;
  void store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim, const float* k,
                const float* v) override;
  void copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) override;
  void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                 const AttentionParams& params, float* out) override;

 protected:
  void free_buffer(void* data, size_t n_bytes) override;

 private:
  // n_bytes of repacked weights, 64-byte aligned, from the weight arena (see the .cpp).
  void* alloc_weight(size_t n_bytes);

  ThreadPool pool_;
  const cpu::OpKernels& op_kernels_;       // the ops' inner kernels of the active ISA level
  cpu::MatmulWorkspace matmul_workspace_;  // every matmul's scratch, sized by reserve_matmul
  std::vector<Buffer> weight_chunks_;      // the weight arena's chunks, filled in order
  size_t chunk_used_ = 0;                  // bytes of the last chunk handed out
};

}  // namespace ember
