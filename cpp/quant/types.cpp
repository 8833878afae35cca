// quant/types.cpp: the one table of element types; sizes match ggml's type_traits.
#include "quant/types.h"

#include <array>
#include <cctype>
#include <string>

#include "quant/quant.h"

namespace ember {
namespace {

constexpr TypeTraits kTypes[] = {
    {DType::f32, "f32", 1, 4, dequantize_row_f32, quantize_row_f32},
    {DType::f16, "f16", 1, 2, dequantize_row_f16, quantize_row_f16},
    {DType::q4_0, "q4_0", 32, 18, dequantize_row_q4_0, quantize_row_q4_0},
    {DType::q4_1, "q4_1", 32, 20, dequantize_row_q4_1, quantize_row_q4_1},
    {DType::q5_0, "q5_0", 32, 22, dequantize_row_q5_0, quantize_row_q5_0},
    {DType::q5_1, "q5_1", 32, 24, dequantize_row_q5_1, quantize_row_q5_1},
    {DType::q8_0, "q8_0", 32, 34, dequantize_row_q8_0, quantize_row_q8_0},
    {DType::q8_1, "q8_1", 32, 36, nullptr, nullptr},
    {DType::q2_k, "q2_k", 256, 84, dequantize_row_q2_k, quantize_row_q2_k},
    {DType::q3_k, "q3_k", 256, 110, dequantize_row_q3_k, quantize_row_q3_k},
    {DType::q4_k, "q4_k", 256, 144, dequantize_row_q4_k, quantize_row_q4_k},
    {DType::q5_k, "q5_k", 256, 176, dequantize_row_q5_k, quantize_row_q5_k},
    {DType::q6_k, "q6_k", 256, 210, dequantize_row_q6_k, quantize_row_q6_k},
    {DType::q8_k, "q8_k", 256, 292, nullptr, nullptr},
    {DType::iq2_xxs, "iq2_xxs", 256, 66, dequantize_row_iq2_xxs, nullptr},
    {DType::iq2_xs, "iq2_xs", 256, 74, dequantize_row_iq2_xs, nullptr},
    {DType::iq3_xxs, "iq3_xxs", 256, 98, dequantize_row_iq3_xxs, nullptr},
    {DType::iq1_s, "iq1_s", 256, 50, dequantize_row_iq1_s, nullptr},
    {DType::iq4_nl, "iq4_nl", 32, 18, dequantize_row_iq4_nl, quantize_row_iq4_nl},
    {DType::iq3_s, "iq3_s", 256, 110, dequantize_row_iq3_s, nullptr},
    {DType::iq2_s, "iq2_s", 256, 82, dequantize_row_iq2_s, nullptr},
    {DType::iq4_xs, "iq4_xs", 256, 136, dequantize_row_iq4_xs, quantize_row_iq4_xs},
    {DType::i8, "i8", 1, 1, nullptr, nullptr},
    {DType::i16, "i16", 1, 2, nullptr, nullptr},
    {DType::i32, "i32", 1, 4, nullptr, nullptr},
    {DType::i64, "i64", 1, 8, nullptr, nullptr},
    {DType::f64, "f64", 1, 8, nullptr, nullptr},
    {DType::iq1_m, "iq1_m", 256, 56, dequantize_row_iq1_m, nullptr},
    {DType::bf16, "bf16", 1, 2, dequantize_row_bf16, quantize_row_bf16},
    {DType::tq1_0, "tq1_0", 256, 54, dequantize_row_tq1_0, quantize_row_tq1_0},
    {DType::tq2_0, "tq2_0", 256, 66, dequantize_row_tq2_0, quantize_row_tq2_0},
    {DType::mxfp4, "mxfp4", 32, 17, dequantize_row_mxfp4, quantize_row_mxfp4},
};

}  // namespace

const TypeTraits* find_type_traits(uint32_t raw_type) {
  for (const TypeTraits& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw_type) return &t;
  }
  return nullptr;
}

const TypeTraits& type_traits(DType type) {
  // Every DType enumerator has a row, so the lookup cannot fail.
  return *find_type_traits(static_cast<uint32_t>(type));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const TypeTraits& t : kTypes) {
    if (lower == t.name) return t.type;
  }
  return std::nullopt;
}

}  // namespace ember
