// quant/types.h: the tensor element types of GGUF/ggml and a constexpr table of their block
// layouts. Per-type behaviour is looked up in this table, never switched on elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ember {

// Values are the ggml type ids stored in GGUF tensor infos; gaps are ids ggml retired.
enum class DType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

// dst[n] = dequantized src, n a multiple of the block size.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// dst = n/block_size blocks quantized from src[n], n a multiple of the block size.
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct TypeTraits {
  DType type;
  const char* name;                // lower case, as gguf-py spells it in lower case: "q4_k", "bf16"
  int64_t block_size;              // elements per block (1 for plain types)
  int64_t type_size;               // bytes per block
  DequantizeRowFn dequantize_row;  // nullptr: this build cannot read the type's values
  QuantizeRowFn quantize_row;      // nullptr: this build cannot write the type
};

// The traits of a raw type id from a file; nullptr for an id ggml does not define.
const TypeTraits* find_type_traits(uint32_t raw_type);
// The traits of a known type.
const TypeTraits& type_traits(DType type);
// "q4_0" / "Q4_0" -> DType::q4_0; nullopt for unknown names.
std::optional<DType> dtype_from_name(std::string_view name);

inline const char* dtype_name(DType type) { return type_traits(type).name; }

// Bytes of a row of n elements (n a multiple of the block size).
inline int64_t row_bytes(DType type, int64_t n) {
  const TypeTraits& t = type_traits(type);
  return n / t.block_size * t.type_size;
}

}  // namespace ember
