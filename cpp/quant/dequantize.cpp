// quant/dequantize.cpp: reference dequantizers of the 32-element block types (q4_0, q4_1, q5_0,
// q5_1, q8_0, iq4_nl, mxfp4). Each reproduces gguf-py's numpy arithmetic bit for bit: the integer quant
// is formed first, converted to f32, then scaled with one rounded multiply (and one rounded add
// for the types with a minimum), in that order.
// Each block is copied to a local first: the float stores to dst could otherwise alias the
// source bytes, and the compiler would reload every byte instead of vectorizing the loops.
#include "quant/blocks.h"
#include "quant/no_contract.h"
#include "quant/quant.h"

namespace ember {

// src holds n / 32 blocks (2-byte aligned); dst[n].

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockQ4_0 x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int j = 0; j < kQK / 2; ++j) dst[j] = d * static_cast<float>((x.qs[j] & 0x0f) - 8);
    for (int j = 0; j < kQK / 2; ++j) dst[j + kQK / 2] = d * static_cast<float>((x.qs[j] >> 4) - 8);
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockQ4_1 x = blocks[b];
    const float d = f16_to_f32(x.d), m = f16_to_f32(x.m);
    for (int j = 0; j < kQK / 2; ++j) dst[j] = d * static_cast<float>(x.qs[j] & 0x0f) + m;
    for (int j = 0; j < kQK / 2; ++j) dst[j + kQK / 2] = d * static_cast<float>(x.qs[j] >> 4) + m;
  }
}

namespace {

// The 32 fifth bits of a q5 block, element i at bit i.
uint32_t load_qh(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

// q[32] = the 5-bit quants: nibbles of qs (element j low, j + 16 high) with bit j of qh on top.
void unpack_5bit(const uint8_t qs[kQK / 2], uint32_t qh, uint8_t q[kQK]) {
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
    q[j + kQK / 2] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}

}  // namespace

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockQ5_0 x = blocks[b];
    const float d = f16_to_f32(x.d);
    uint8_t q[kQK];
    unpack_5bit(x.qs, load_qh(x.qh), q);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q[j] - 16);
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockQ5_1 x = blocks[b];
    const float d = f16_to_f32(x.d), m = f16_to_f32(x.m);
    uint8_t q[kQK];
    unpack_5bit(x.qs, load_qh(x.qh), q);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q[j]) + m;
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockQ8_0 x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(x.qs[j]);
  }
}

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockIQ4_NL x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int j = 0; j < kQK / 2; ++j) dst[j] = d * static_cast<float>(kIq4nlValues[x.qs[j] & 0x0f]);
    for (int j = 0; j < kQK / 2; ++j) dst[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[x.qs[j] >> 4]);
  }
}

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockMXFP4*>(src);
  for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
    const BlockMXFP4 x = blocks[b];
    const float d = e8m0_to_f32_half(x.e);
    for (int j = 0; j < kQK / 2; ++j) dst[j] = d * static_cast<float>(kMxfp4Values[x.qs[j] & 0x0f]);
    for (int j = 0; j < kQK / 2; ++j) dst[j + kQK / 2] = d * static_cast<float>(kMxfp4Values[x.qs[j] >> 4]);
  }
}

}  // namespace ember
