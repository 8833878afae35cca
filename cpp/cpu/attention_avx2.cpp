// cpu/attention_avx2.cpp: AVX2/FMA/F16C variants of the attention and KV-store inner kernels.
// Compiled with ISA flags and called only behind OpsIsa::avx2_f16c. Everything here stays in
// this file (no shared inline helpers), so no AVX2 code can leak into callers on older CPUs.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "cpu/attention_kernels.h"

namespace ember::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// KVView::slot, restated so that no inline function shared with other files is compiled here.
inline int64_t slot_of(const KVView& kv, int64_t pos) {
  return kv.block_table ? int64_t{kv.block_table[pos / kv.block_size]} * kv.block_size + pos % kv.block_size
                        : pos;
}

}  // namespace

void attention_head_avx2(const float* q, int64_t n_keys, const KVView& kv, int64_t kv_offset,
                         int64_t head_dim, float scale, float* out) {
  constexpr int64_t kTile = 64;
  alignas(32) float acc[kMaxHeadDim];  // [head_dim] Σ p·v, relative to the running max
  float score[kTile];                  // [tile] scaled q·k of the current tile
  std::memset(acc, 0, sizeof(float) * head_dim);
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t t0 = 0; t0 < n_keys; t0 += kTile) {
    const int64_t n = n_keys - t0 < kTile ? n_keys - t0 : kTile;
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* k = kv.k + slot_of(kv, t0 + j) * kv.row_stride + kv_offset;
      __m256 dot = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8) {
        dot = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16x8(k + d), dot);
      }
      score[j] = hsum(dot) * scale;
      tile_max = score[j] > tile_max ? score[j] : tile_max;
    }
    if (tile_max > running_max) {
      const float rescale = std::exp(running_max - tile_max);  // 0 on the first tile
      const __m256 r = _mm256_set1_ps(rescale);
      for (int64_t d = 0; d < head_dim; d += 8) {
        _mm256_store_ps(acc + d, _mm256_mul_ps(_mm256_load_ps(acc + d), r));
      }
      running_sum *= rescale;
      running_max = tile_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(score[j] - running_max);
      running_sum += p;
      const uint16_t* v = kv.v + slot_of(kv, t0 + j) * kv.row_stride + kv_offset;
      const __m256 pv = _mm256_set1_ps(p);
      for (int64_t d = 0; d < head_dim; d += 8) {
        _mm256_store_ps(acc + d, _mm256_fmadd_ps(pv, load_f16x8(v + d), _mm256_load_ps(acc + d)));
      }
    }
  }
  const __m256 inv_sum = _mm256_set1_ps(1.0f / running_sum);
  for (int64_t d = 0; d < head_dim; d += 8) {
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_load_ps(acc + d), inv_sum));
  }
}

void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
}

}  // namespace ember::cpu
