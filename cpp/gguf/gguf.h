// gguf/gguf.h: a validated, read-only view of a GGUF file (versions 2 and 3) mapped into memory,
// or of a model split into several (llama.cpp's gguf-split shards, read as one). Owns the
// mappings; knows the container format only, nothing about models or tokenizers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "quant/types.h"

namespace ember {

// Value type ids as stored in the file.
enum class GGUFType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

const char* gguf_type_name(GGUFType type);

// One metadata value. Strings and numeric arrays point into the mapping (no copies), so a
// GGUFValue must not outlive the GGUFFile it came from.
struct GGUFValue {
  GGUFType type = GGUFType::u8;
  // scalars (the member matching `type`; integers are widened)
  uint64_t u = 0;        // u8, u16, u32, u64, bool
  int64_t i = 0;         // i8, i16, i32, i64
  double f = 0.0;        // f32, f64
  std::string_view str;  // string: bytes as stored (UTF-8 by the spec, not checked)
  // arrays
  GGUFType elem_type = GGUFType::u8;
  uint64_t n_elems = 0;
  const uint8_t* elems = nullptr;         // numeric arrays: n_elems packed little-endian values
  std::vector<std::string_view> strings;  // string arrays
  std::vector<GGUFValue> items;           // arrays of arrays

  bool is_integer() const;
  bool is_float() const { return type == GGUFType::f32 || type == GGUFType::f64; }
  int64_t as_int() const;   // any integer or bool; throws FormatError otherwise
  double as_float() const;  // any integer or float
  bool as_bool() const;     // bool or integer
};

struct GGUFTensorInfo {
  std::string name;
  DType type;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous (fastest) dimension
  int64_t n_elements = 0;
  uint64_t offset = 0;       // from the start of its shard's data section
  uint64_t file_offset = 0;  // from the start of its shard's file
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside its shard's mapping, aligned to the file's alignment
  uint32_t shard = 0;             // which file of a split model holds it (0: the first or only one)
};

class GGUFFile {
 public:
  // Maps and validates the whole directory; throws FormatError naming the file, the field and
  // the problem. Tensor data is not read (it is checked to lie inside the file).
  // A shard of a split model (split.count > 1, files named PREFIX-0000i-of-0000n.gguf side by
  // side) opens the whole model: the metadata of the first shard, the tensors of all of them.
  static std::shared_ptr<GGUFFile> open(const std::string& path);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }  // the first shard's for a split model
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_bytes() const;                           // all shards together
  uint64_t data_offset() const { return data_offset_; }  // start of the (first shard's) tensor data
  // The files of the model: just path() unless it is split.
  std::vector<std::string> shard_paths() const;

  // Metadata in file order.
  const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
  const GGUFValue* find(std::string_view key) const;
  // Typed getters: the default when the key is absent; FormatError when it has the wrong type.
  std::string get_string(std::string_view key, std::string_view fallback = "") const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::vector<std::string_view> get_strings(std::string_view key) const;  // empty when absent
  std::vector<float> get_floats(std::string_view key) const;              // empty when absent
  std::vector<int64_t> get_ints(std::string_view key) const;              // empty when absent

  // Drops the whole pages inside [data, data + n_bytes) of the mapping from the process's
  // resident memory (MADV_DONTNEED: read again, they come back from the file): for tensors a
  // backend copied at load and never reads from the file again.
  void drop_pages(const void* data, size_t n_bytes) const;
  // Asks the kernel to start reading the pages of [data, data + n_bytes) into the page cache
  // (MADV_WILLNEED), so that a reader that touches them out of order does not wait on one fault
  // at a time.
  void will_need(const void* data, size_t n_bytes) const;

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  GGUFFile() = default;
  static std::shared_ptr<GGUFFile> open_one(const std::string& path);  // one file, shard or not
  void parse();
  // gguf_split.cpp: with `this` the first shard, opens the others and takes in their tensors.
  void join_shards(std::shared_ptr<GGUFFile> opened, uint32_t opened_index);

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;  // the mapping: size_ bytes
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GGUFTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  std::vector<std::shared_ptr<const GGUFFile>> other_shards_;  // shards 1..n-1 of a split model
  // madvise(advice) on the whole pages of [data, data + n_bytes), in whichever shard maps them.
  void advise(const void* data, size_t n_bytes, int advice) const;
};

}  // namespace ember
