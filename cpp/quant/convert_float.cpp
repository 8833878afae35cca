// quant/convert_float.cpp: the plain float types (f32, f16, bf16) to and from f32.
// Conversions are exact or IEEE-rounded per element (see blocks.h), identical to numpy's casts.
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember {

// Sources and destinations may be unaligned (raw file bytes), so elements go through memcpy.

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

namespace {

constexpr int64_t kChunk = 256;  // elements staged in a local buffer at a time

// dst[n] = convert(16-bit values at src). The values are staged in a local array: reading them
// straight from src would let every float store to dst alias the source and block vectorizing.
template <typename Convert>
void dequantize_16bit(const void* src, float* dst, int64_t n, Convert convert) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  uint16_t chunk[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = n - i < kChunk ? n - i : kChunk;
    std::memcpy(chunk, bytes + 2 * i, static_cast<size_t>(2 * m));
    for (int64_t j = 0; j < m; ++j) dst[i + j] = convert(chunk[j]);
  }
}

}  // namespace

// Lambdas, not function pointers, so the conversion inlines into the loop.
void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  dequantize_16bit(src, dst, n, [](uint16_t h) { return f16_to_f32(h); });
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  dequantize_16bit(src, dst, n, [](uint16_t h) { return bf16_to_f32(h); });
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* bytes = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_f16(src[i]);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  auto* bytes = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

}  // namespace ember
