// cuda/get_rows.cu: rows of a table, dequantized bit for bit as the CPU's reference
// dequantizers (one block per id, a thread per group of 32).
#include "cuda/backend_cuda.h"
#include "cuda/dequant.cuh"
#include "cuda/device.h"

namespace ember {

namespace {

// y[n_ids, n_cols] = table[ids[i], :]; grid n_ids, block 64.
template <DType T>
__global__ void get_rows_kernel(const uint8_t* __restrict__ table, const int32_t* __restrict__ ids,
                                float* __restrict__ y, int64_t n_cols) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = table + int64_t{ids[i]} * cuda::Weight<T>::row_bytes(n_cols);
  const int64_t n_groups = (n_cols + 31) / 32;
  for (int64_t g = threadIdx.x; g < n_groups; g += blockDim.x) {
    float v[32];
    cuda::Weight<T>::dq32(row, g, n_cols, v);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      if (32 * g + l < n_cols) y[i * n_cols + 32 * g + l] = v[l];
    }
  }
}

}  // namespace

void CudaBackend::get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids,
                           float* y) {
  if (n_ids == 0) return;
  use();
  const int32_t* device_ids = argument(ids, n_ids);
  const bool known = cuda::with_weight_type(type, [&]<DType T>() {
    get_rows_kernel<T><<<static_cast<unsigned>(n_ids), 64, 0, stream_>>>(static_cast<const uint8_t*>(table),
                                                                         device_ids, y, n_cols);
  });
  if (!known)
    throw std::logic_error(cat("[cuda] get_rows of a ", dtype_name(type), " table (see supports())"));
  launched("get_rows");
}

}  // namespace ember
