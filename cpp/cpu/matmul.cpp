// cpu/matmul.cpp: threading and kernel choice for y = x · Wᵀ.
// Placeholder: dequantizes each weight row through the type table and does f32 dots.
#include "cpu/matmul.h"

#include <vector>

namespace ember::cpu {

bool matmul_supports(DType wtype) { return type_traits(wtype).dequantize_row != nullptr; }

void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out,
            const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  const TypeTraits& traits = type_traits(wtype);
  const int64_t w_row_bytes = row_bytes(wtype, n_in);
  pool.run([&](int ith, int nth) {
    int64_t begin, end;
    split_range(n_out, ith, nth, &begin, &end);
    std::vector<float> w_row(n_in);  // [n_in] one dequantized weight row
    for (int64_t o = begin; o < end; ++o) {
      traits.dequantize_row(static_cast<const uint8_t*>(w) + o * w_row_bytes, w_row.data(), n_in);
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * n_in;
        float sum = 0.0f;
        for (int64_t i = 0; i < n_in; ++i) sum += xr[i] * w_row[i];
        y[r * n_out + o] = sum;
      }
    }
  });
}

}  // namespace ember::cpu
