// quant/convert_float.cpp: the plain float types (f32, f16, bf16) to and from f32.
// Conversions are exact or IEEE-rounded per element (see blocks.h), identical to numpy's casts.
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember {

// Sources may be unaligned (raw file bytes), so elements are read with memcpy.

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    dst[i] = f16_to_f32(h);
  }
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
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
