// cpu/get_rows.cpp: embedding lookup — gathers rows of a table of any readable dtype as f32.
#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

void get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* y,
              ThreadPool& pool) {
  const DequantizeRowFn dequantize_row = type_traits(type).dequantize_row;
  const int64_t table_row_bytes = row_bytes(type, n_cols);
  const auto* base = static_cast<const uint8_t*>(table);
  parallel_for(pool, n_ids, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      dequantize_row(base + int64_t{ids[i]} * table_row_bytes, y + i * n_cols, n_cols);
    }
  });
}

}  // namespace ember::cpu
