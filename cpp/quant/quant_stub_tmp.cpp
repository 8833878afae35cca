// TEMPORARY stubs so the tree links until quant/ is written; the quant owner deletes this file.
#include "quant/quant.h"
#include "core/error.h"
namespace ember {
#define EMBER_STUB_DQ(t) void dequantize_row_##t(const void*, float*, int64_t) { throw Unsupported("stub"); }
#define EMBER_STUB_Q(t) void quantize_row_##t(const float*, void*, int64_t) { throw Unsupported("stub"); }
EMBER_STUB_DQ(f32) EMBER_STUB_DQ(f16) EMBER_STUB_DQ(bf16) EMBER_STUB_DQ(q4_0) EMBER_STUB_DQ(q4_1)
EMBER_STUB_DQ(q5_0) EMBER_STUB_DQ(q5_1) EMBER_STUB_DQ(q8_0) EMBER_STUB_DQ(q2_k) EMBER_STUB_DQ(q3_k)
EMBER_STUB_DQ(q4_k) EMBER_STUB_DQ(q5_k) EMBER_STUB_DQ(q6_k) EMBER_STUB_DQ(iq4_nl) EMBER_STUB_DQ(iq4_xs)
EMBER_STUB_Q(f32) EMBER_STUB_Q(f16) EMBER_STUB_Q(bf16) EMBER_STUB_Q(q4_0) EMBER_STUB_Q(q4_1)
EMBER_STUB_Q(q5_0) EMBER_STUB_Q(q5_1) EMBER_STUB_Q(q8_0)
}
