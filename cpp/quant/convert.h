// quant/convert.h: whole-array quantize / dequantize for callers at the edge (the Python binding,
// the HF converter): looks types up by name, validates sizes with messages a user can act on,
// and splits the blocks over a thread pool. The per-row kernels themselves live in quant.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "quant/types.h"

namespace ember {

class ThreadPool;

// The traits of a type this build can dequantize / quantize, by name ("q4_0", "Q4_0").
// InvalidArgument naming the types that can be used when the name is unknown or not supported.
const TypeTraits& dequantizable_type(std::string_view name);
const TypeTraits& quantizable_type(std::string_view name);

// Bytes that n elements of type t occupy. InvalidArgument unless n >= 0 and a multiple of t's
// block size.
int64_t quantized_size(const TypeTraits& t, int64_t n);

// dst[n] = the values stored in the first quantized_size(t, n) bytes of src[src_bytes]; longer
// sources are fine (a slice of a file), shorter ones are an InvalidArgument. src may have any
// alignment. pool may be nullptr (runs on the calling thread).
void dequantize(const TypeTraits& t, const void* src, int64_t src_bytes, float* dst, int64_t n,
                ThreadPool* pool);

// dst[quantized_size(t, n)] = the n values of src as blocks of t (t.quantize_row must be set).
void quantize(const TypeTraits& t, const float* src, int64_t n, void* dst, ThreadPool* pool);

// A pool with one thread per core when converting n elements is worth splitting, else nullptr.
// Starting threads costs ~100 us, so small arrays run on the caller's thread.
std::unique_ptr<ThreadPool> make_convert_pool(int64_t n);

}  // namespace ember
