// cuda/attention.cu: causal attention over a (paged) KV cache in device memory, one block per
// (row, head). Each of the block's 8 warps takes every 8th key with a running (online) softmax;
// a warp's lanes split the head: lane l holds dims l, l + 32, ..., so a key's K or V row is read
// by the warp as whole 32-value runs (for q8_0, one block of the row each). The warps' partial
// maxima, sums and outputs are merged at the end.
#include <algorithm>

#include "cuda/backend_cuda.h"
#include "cuda/dequant.cuh"
#include "cuda/device.h"
#include "cuda/reduce.cuh"

namespace ember {

namespace {

constexpr int kWarps = 8;  // decode has few (row, head) blocks: more warps per block keep more keys in flight
constexpr int kPerLane = static_cast<int>(kMaxHeadDim / 32);  // dims per lane, at most

struct Params {
  const float* q;              // [n_rows, n_head * head_dim]
  float* out;                  // [n_rows, n_head * head_dim]
  const uint8_t* k;            // KVView::k
  const uint8_t* v;            // KVView::v
  const int32_t* positions;    // [n_rows]
  const int32_t* block_table;  // nullptr: contiguous
  int64_t n_head, n_head_kv, head_dim, head_bytes, block_size, window;
  float scale, softcap;
};

// Dim 32i + lane of the cached K or V row at `row` (f16, or q8_0 whose block i holds dims
// 32i .. 32i+31).
template <bool kQ8>
__device__ __forceinline__ float cached(const uint8_t* row, int i, int lane) {
  if constexpr (kQ8) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + i;
    return __fmul_rn(cuda::f16_to_f32(b->d), static_cast<float>(b->qs[lane]));
  } else {
    return cuda::f16_to_f32(reinterpret_cast<const uint16_t*>(row)[32 * i + lane]);
  }
}

template <bool kQ8>
__global__ void __launch_bounds__(32 * kWarps) attention_kernel(Params p) {
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const int64_t r = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
  const int64_t kv_head = h / (p.n_head / p.n_head_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_i = static_cast<int>((p.head_dim + 31) / 32);
  const float* q = p.q + (r * p.n_head + h) * p.head_dim;
  float qs[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    qs[i] = i < n_i && 32 * i + lane < p.head_dim ? q[32 * i + lane] : 0.0f;
    acc[i] = 0.0f;
  }
  const int64_t pos = p.positions[r];
  const int64_t first = p.window > 0 && pos + 1 > p.window ? pos + 1 - p.window : 0;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t key = first + warp; key <= pos; key += kWarps) {
    const int64_t block = p.block_table ? int64_t{p.block_table[key / p.block_size]} : key / p.block_size;
    const int64_t offset = ((block * p.n_head_kv + kv_head) * p.block_size + key % p.block_size) *
                           p.head_bytes;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i < n_i && 32 * i + lane < p.head_dim) dot = fmaf(qs[i], cached<kQ8>(p.k + offset, i, lane), dot);
    }
    dot = cuda::warp_sum(dot);
    float score = dot * p.scale;
    if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);  // 0 on the first key
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i < n_i && 32 * i + lane < p.head_dim) {
        acc[i] = fmaf(weight, cached<kQ8>(p.v + offset, i, lane), acc[i] * correction);
      }
    }
    running_max = new_max;
  }
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (i < n_i && 32 * i + lane < p.head_dim) warp_acc[warp][32 * i + lane] = acc[i];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w]);
  float sum = 0.0f, factor[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - m);  // a warp with no keys: 0
    sum += warp_sum[w] * factor[w];
  }
  const float inv = 1.0f / sum;
  float* out = p.out + (r * p.n_head + h) * p.head_dim;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += 32 * kWarps) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o = fmaf(warp_acc[w][d], factor[w], o);
    out[d] = o * inv;
  }
}

}  // namespace

void CudaBackend::attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                            const AttentionParams& params, float* out) {
  if (n_rows == 0) return;
  use();
  const int64_t max_pos = std::max(positions[0], positions[n_rows - 1]);
  const Params p{q,
                 out,
                 kv.k,
                 kv.v,
                 argument(positions, n_rows),
                 kv.block_table ? argument(kv.block_table, max_pos / kv.block_size + 1) : nullptr,
                 params.n_head,
                 params.n_head_kv,
                 params.head_dim,
                 kv.head_bytes,
                 kv.block_size,
                 params.window,
                 params.scale,
                 params.softcap};
  const unsigned n_blocks = static_cast<unsigned>(n_rows * params.n_head);
  if (kv.type == DType::q8_0) {
    attention_kernel<true><<<n_blocks, 32 * kWarps, 0, stream_>>>(p);
  } else {
    attention_kernel<false><<<n_blocks, 32 * kWarps, 0, stream_>>>(p);
  }
  launched("attention");
}

}  // namespace ember
