// cuda/store_kv.cu: new K/V rows into their cache slots, as f16 or q8_0 (one thread per 32 values
// of a row, for K and V).
#include <algorithm>

#include "cuda/backend_cuda.h"
#include "cuda/dequant.cuh"
#include "cuda/device.h"

namespace ember {

namespace {

// What store_kv_kernel needs of a KVView, with the block table already on the device.
struct Cache {
  uint8_t* k;
  uint8_t* v;
  const int32_t* block_table;  // nullptr: contiguous
  int64_t n_head_kv, head_dim, head_bytes, block_size;

  // KVView::offset: bytes from k (or v) to kv head `head`'s values at position pos.
  __device__ int64_t offset(int64_t pos, int64_t head) const {
    const int64_t block = block_table ? int64_t{block_table[pos / block_size]} : pos / block_size;
    return ((block * n_head_kv + head) * block_size + pos % block_size) * head_bytes;
  }
};

// Values 32g .. 32g+31 of src's row r into the slot of position pos of `cache_base`.
__device__ void store(const Cache& c, bool q8, const float* src, uint8_t* cache_base, int64_t r, int64_t g,
                      int64_t n_kv_dim, int64_t pos) {
  const float* s = src + r * n_kv_dim + 32 * g;
  if (!q8) {
    for (int l = 0; l < 32 && 32 * g + l < n_kv_dim; ++l) {
      const int64_t e = 32 * g + l;
      uint16_t* row = reinterpret_cast<uint16_t*>(cache_base + c.offset(pos, e / c.head_dim));
      row[e % c.head_dim] = cuda::f32_to_f16(s[l]);
    }
    return;
  }
  // quantize_row_q8_0: d = amax / 127 stored as f16, q = x / d rounded half away from zero
  // (gguf-py's np_roundf; roundf), with the unrounded d. head_dim is a multiple of 32 for q8_0,
  // so the 32 values are one block of one head.
  float amax = 0.0f;
  for (int l = 0; l < 32; ++l) amax = fmaxf(amax, fabsf(s[l]));
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  const int64_t e = 32 * g;
  BlockQ8_0* b = reinterpret_cast<BlockQ8_0*>(cache_base + c.offset(pos, e / c.head_dim)) +
                 e % c.head_dim / 32;
  b->d = cuda::f32_to_f16(d);
  for (int l = 0; l < 32; ++l) b->qs[l] = static_cast<int8_t>(roundf(__fmul_rn(s[l], id)));
}

__global__ void store_kv_kernel(Cache c, bool q8, const int32_t* __restrict__ positions, int64_t n_rows,
                                int64_t n_kv_dim, const float* __restrict__ k, const float* __restrict__ v) {
  const int64_t n_groups = (n_kv_dim + 31) / 32;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_groups) return;
  const int64_t r = i / n_groups, g = i % n_groups;
  const int64_t pos = positions[r];
  store(c, q8, k, c.k, r, g, n_kv_dim, pos);
  store(c, q8, v, c.v, r, g, n_kv_dim, pos);
}

}  // namespace

void CudaBackend::store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim,
                           const float* k, const float* v) {
  if (n_rows == 0) return;
  use();
  // Positions of a sequence's rows are consecutive (validate_batch), so the last is the largest.
  const int64_t max_pos = std::max(positions[0], positions[n_rows - 1]);
  const Cache c{kv.k,
                kv.v,
                kv.block_table ? argument(kv.block_table, max_pos / kv.block_size + 1) : nullptr,
                kv.n_head_kv,
                n_kv_dim / kv.n_head_kv,
                kv.head_bytes,
                kv.block_size};
  const int32_t* device_positions = argument(positions, n_rows);
  store_kv_kernel<<<cuda::blocks_for(n_rows * ((n_kv_dim + 31) / 32), 64), 64, 0, stream_>>>(
      c, kv.type == DType::q8_0, device_positions, n_rows, n_kv_dim, k, v);
  launched("store_kv");
}

}  // namespace ember
