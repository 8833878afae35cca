// quant/convert.cpp: argument checks and block-parallel splitting around the row converters.
// Blocks are independent, so any split of the block range gives identical bytes.
#include "quant/convert.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace ember {
namespace {

constexpr uint32_t kMaxTypeId = 64;                // above every ggml type id
constexpr int64_t kMinParallelElements = 1 << 18;  // below this a second thread costs more than it saves

// "f32, f16, q4_0, ..." for the types that have the given converter.
template <typename Has>
std::string type_names(Has has) {
  std::string names;
  for (uint32_t id = 0; id < kMaxTypeId; ++id) {
    const TypeTraits* t = find_type_traits(id);
    if (t == nullptr || !has(*t)) continue;
    if (!names.empty()) names += ", ";
    names += t->name;
  }
  return names;
}

bool can_dequantize(const TypeTraits& t) { return t.dequantize_row != nullptr; }
bool can_quantize(const TypeTraits& t) { return t.quantize_row != nullptr; }

template <typename Has>
const TypeTraits& lookup(std::string_view name, const char* verb, Has has) {
  const std::optional<DType> type = dtype_from_name(name);
  if (!type) {
    throw InvalidArgument(cat("[quant] unknown type name '", name,
                              "'; expected one of: ", type_names([](const TypeTraits&) { return true; })));
  }
  const TypeTraits& t = type_traits(*type);
  if (!has(t)) {
    throw InvalidArgument(
        cat("[quant] type '", t.name, "' cannot be ", verb, "; types that can: ", type_names(has)));
  }
  return t;
}

// Runs convert(first_block, n_blocks) over [0, n_blocks), split across the pool's threads.
template <typename Convert>
void for_block_ranges(int64_t n_blocks, ThreadPool* pool, const Convert& convert) {
  if (pool == nullptr || pool->n_threads() == 1) {
    convert(int64_t{0}, n_blocks);
    return;
  }
  pool->run([&](int ith, int nth) {
    int64_t begin, end;
    split_range(n_blocks, ith, nth, &begin, &end);
    if (end > begin) convert(begin, end - begin);
  });
}

}  // namespace

const TypeTraits& dequantizable_type(std::string_view name) {
  return lookup(name, "dequantized", can_dequantize);
}

const TypeTraits& quantizable_type(std::string_view name) { return lookup(name, "quantized", can_quantize); }

int64_t quantized_size(const TypeTraits& t, int64_t n) {
  if (n < 0 || n % t.block_size != 0) {
    throw InvalidArgument(
        cat("[quant] ", t.name, ": ", n, " elements is not a whole number of blocks of ", t.block_size));
  }
  return n / t.block_size * t.type_size;
}

void dequantize(const TypeTraits& t, const void* src, int64_t src_bytes, float* dst, int64_t n,
                ThreadPool* pool) {
  if (!can_dequantize(t)) (void)dequantizable_type(t.name);  // throws the listing message
  const int64_t n_bytes = quantized_size(t, n);
  if (src_bytes < n_bytes) {
    throw InvalidArgument(
        cat("[quant] ", t.name, ": ", n, " elements need ", n_bytes, " bytes of data, got ", src_bytes));
  }
  // Row converters read blocks as structs with 2-byte fields; data at an odd address (a numpy
  // slice) is copied once to aligned memory first.
  std::vector<uint16_t> aligned;
  if (reinterpret_cast<uintptr_t>(src) % alignof(uint16_t) != 0) {
    aligned.resize(static_cast<size_t>(n_bytes + 1) / 2);
    std::memcpy(aligned.data(), src, static_cast<size_t>(n_bytes));
    src = aligned.data();
  }
  const auto* bytes = static_cast<const uint8_t*>(src);
  for_block_ranges(n / t.block_size, pool, [&](int64_t first, int64_t count) {
    t.dequantize_row(bytes + first * t.type_size, dst + first * t.block_size, count * t.block_size);
  });
}

void quantize(const TypeTraits& t, const float* src, int64_t n, void* dst, ThreadPool* pool) {
  if (!can_quantize(t)) (void)quantizable_type(t.name);  // throws the listing message
  (void)quantized_size(t, n);                            // throws unless whole blocks
  auto* bytes = static_cast<uint8_t*>(dst);
  for_block_ranges(n / t.block_size, pool, [&](int64_t first, int64_t count) {
    t.quantize_row(src + first * t.block_size, bytes + first * t.type_size, count * t.block_size);
  });
}

std::unique_ptr<ThreadPool> make_convert_pool(int64_t n) {
  const int n_threads = ThreadPool::default_n_threads();
  if (n < kMinParallelElements || n_threads < 2) return nullptr;
  return std::make_unique<ThreadPool>(n_threads);
}

}  // namespace ember
