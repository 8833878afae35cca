// cpu/attention_avx2.cpp: AVX2/FMA/F16C variants of the attention and KV-store inner kernels.
// Compiled with ISA flags and called only behind OpsIsa::avx2_f16c. Shared helpers come from
// math_avx2.h (internal linkage), so no AVX2 code can leak into callers on older CPUs.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/op_kernels.h"
#include "cpu/math_avx2.h"

namespace ember::cpu {

namespace {

constexpr int64_t kTile = 64;  // keys scored per step of the online softmax

// KVView::slot, restated so that no inline function shared with other files is compiled here.
inline int64_t slot_of(const KVView& kv, int64_t pos) {
  return kv.block_table ? int64_t{kv.block_table[pos / kv.block_size]} * kv.block_size + pos % kv.block_size
                        : pos;
}

// Scores, softmax weights and the V accumulation of one head, for N = head_dim / 8 vectors.
// N is a template parameter for the common head sizes, so the accumulator lives in registers.
template <int N>
struct FixedHead {
  __m256 acc[N];

  explicit FixedHead(int64_t) {
    for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  }
  void rescale(__m256 r) {
    for (int i = 0; i < N; ++i) acc[i] = _mm256_mul_ps(acc[i], r);
  }
  void add_weighted(__m256 p, const uint16_t* v) {
    for (int i = 0; i < N; ++i) acc[i] = _mm256_fmadd_ps(p, load_f16x8(v + 8 * i), acc[i]);
  }
  void store(float* out, __m256 inv_sum) const {
    for (int i = 0; i < N; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], inv_sum));
  }
  static int64_t n_vec(int64_t) { return N; }
};

// Any head_dim that is a multiple of 8: the accumulator lives on the stack.
struct AnyHead {
  alignas(32) float acc[kMaxHeadDim];
  int64_t n;

  explicit AnyHead(int64_t head_dim) : n(head_dim / 8) { std::memset(acc, 0, sizeof(float) * head_dim); }
  void rescale(__m256 r) {
    for (int64_t i = 0; i < n; ++i) _mm256_store_ps(acc + 8 * i, _mm256_mul_ps(_mm256_load_ps(acc + 8 * i), r));
  }
  void add_weighted(__m256 p, const uint16_t* v) {
    for (int64_t i = 0; i < n; ++i) {
      _mm256_store_ps(acc + 8 * i, _mm256_fmadd_ps(p, load_f16x8(v + 8 * i), _mm256_load_ps(acc + 8 * i)));
    }
  }
  void store(float* out, __m256 inv_sum) const {
    for (int64_t i = 0; i < n; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_load_ps(acc + 8 * i), inv_sum));
  }
  static int64_t n_vec(int64_t head_dim) { return head_dim / 8; }
};

template <typename Head>
void attention_head(const float* q, int64_t n_keys, const KVView& kv, int64_t kv_offset,
                    int64_t head_dim, float scale, float* out) {
  const int64_t n_vec = Head::n_vec(head_dim);
  alignas(32) float qs[kMaxHeadDim];        // [head_dim] q * scale
  alignas(32) float score[kTile + 8];       // [tile] scores, then softmax weights; padded to 8
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n_vec; ++i) _mm256_store_ps(qs + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(q + 8 * i), scale_v));

  Head head(head_dim);
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t t0 = 0; t0 < n_keys; t0 += kTile) {
    const int64_t n = n_keys - t0 < kTile ? n_keys - t0 : kTile;
    // Scores, four keys at a time for independent FMA chains.
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const uint16_t* k0 = kv.k + slot_of(kv, t0 + j) * kv.row_stride + kv_offset;
      const uint16_t* k1 = kv.k + slot_of(kv, t0 + j + 1) * kv.row_stride + kv_offset;
      const uint16_t* k2 = kv.k + slot_of(kv, t0 + j + 2) * kv.row_stride + kv_offset;
      const uint16_t* k3 = kv.k + slot_of(kv, t0 + j + 3) * kv.row_stride + kv_offset;
      __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
      for (int64_t i = 0; i < n_vec; ++i) {
        const __m256 qv = _mm256_load_ps(qs + 8 * i);
        d0 = _mm256_fmadd_ps(qv, load_f16x8(k0 + 8 * i), d0);
        d1 = _mm256_fmadd_ps(qv, load_f16x8(k1 + 8 * i), d1);
        d2 = _mm256_fmadd_ps(qv, load_f16x8(k2 + 8 * i), d2);
        d3 = _mm256_fmadd_ps(qv, load_f16x8(k3 + 8 * i), d3);
      }
      _mm_storeu_ps(score + j, hsum4_avx2(d0, d1, d2, d3));
    }
    for (; j < n; ++j) {
      const uint16_t* k = kv.k + slot_of(kv, t0 + j) * kv.row_stride + kv_offset;
      __m256 d = _mm256_setzero_ps();
      for (int64_t i = 0; i < n_vec; ++i) d = _mm256_fmadd_ps(_mm256_load_ps(qs + 8 * i), load_f16x8(k + 8 * i), d);
      score[j] = hsum_avx2(d);
    }
    const int64_t n_padded = (n + 7) / 8 * 8;
    for (j = n; j < n_padded; ++j) score[j] = -INFINITY;  // exp gives 0 for the padding

    __m256 max_v = _mm256_set1_ps(-INFINITY);
    for (j = 0; j < n_padded; j += 8) max_v = _mm256_max_ps(max_v, _mm256_load_ps(score + j));
    const float tile_max = hmax_avx2(max_v);
    if (tile_max > running_max) {
      const float rescale = std::exp(running_max - tile_max);  // 0 on the first tile
      head.rescale(_mm256_set1_ps(rescale));
      running_sum *= rescale;
      running_max = tile_max;
    }
    const __m256 m = _mm256_set1_ps(running_max);
    __m256 sum_v = _mm256_setzero_ps();
    for (j = 0; j < n_padded; j += 8) {
      const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_load_ps(score + j), m));
      _mm256_store_ps(score + j, p);
      sum_v = _mm256_add_ps(sum_v, p);
    }
    running_sum += hsum_avx2(sum_v);
    for (j = 0; j < n; ++j) {
      head.add_weighted(_mm256_set1_ps(score[j]), kv.v + slot_of(kv, t0 + j) * kv.row_stride + kv_offset);
    }
  }
  head.store(out, _mm256_set1_ps(1.0f / running_sum));  // n_keys >= 1, so the sum is >= 1
}

}  // namespace

void attention_head_avx2(const float* q, int64_t n_keys, const KVView& kv, int64_t kv_offset,
                         int64_t head_dim, float scale, float* out) {
  switch (head_dim) {
    case 32: return attention_head<FixedHead<4>>(q, n_keys, kv, kv_offset, head_dim, scale, out);
    case 64: return attention_head<FixedHead<8>>(q, n_keys, kv, kv_offset, head_dim, scale, out);
    case 128: return attention_head<FixedHead<16>>(q, n_keys, kv, kv_offset, head_dim, scale, out);
    default: return attention_head<AnyHead>(q, n_keys, kv, kv_offset, head_dim, scale, out);
  }
}

void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
}

}  // namespace ember::cpu
