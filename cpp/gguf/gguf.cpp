// gguf/gguf.cpp: parses and validates a GGUF file's header, metadata and tensor directory over
// an mmap. Every count and length read from the file is checked against the bytes that remain
// before anything is sized by it, so a corrupt file fails with a message, never a crash or OOM.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace ember {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;              // ggml tensors have at most 4 dimensions
constexpr int kMaxArrayDepth = 8;        // arrays of arrays nest at most this deep

// Size in bytes of one scalar of a value type; 0 for string/array (variable size) and unknown.
uint64_t scalar_bytes(GGUFType t) {
  switch (t) {
    case GGUFType::u8:
    case GGUFType::i8:
    case GGUFType::boolean: return 1;
    case GGUFType::u16:
    case GGUFType::i16: return 2;
    case GGUFType::u32:
    case GGUFType::i32:
    case GGUFType::f32: return 4;
    case GGUFType::u64:
    case GGUFType::i64:
    case GGUFType::f64: return 8;
    default: return 0;
  }
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::f64); }

// Strict UTF-8 check (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned c = *p;
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++p;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      cp = c & 0x07;
    } else return false;
    if (end - p <= n) return false;
    for (int k = 1; k <= n; ++k) {
      if ((p[k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[k] & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    p += n + 1;
  }
  return true;
}

// Bounds-checked reading from the mapping. `where` names the field being read for messages.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw FormatError(cat("[gguf] ", path_, ": ", where, ": ", what));
  }

  const uint8_t* take(uint64_t n, const std::string& where) {
    if (n > remaining()) {
      fail(where, cat("needs ", n, " bytes at offset ", pos_, " but the file ends at ", size_,
                      " (truncated file?)"));
    }
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T read(const std::string& where) {
    T v;
    std::memcpy(&v, take(sizeof(T), where), sizeof(T));
    return v;
  }

  std::string_view read_string(const std::string& where) {
    const uint64_t n = read<uint64_t>(where + " (string length)");
    if (n > remaining()) {
      fail(where, cat("string length ", n, " exceeds the ", remaining(), " bytes left in the file"));
    }
    return {reinterpret_cast<const char*>(take(n, where)), static_cast<size_t>(n)};
  }

  // A count of items each at least min_item_bytes long must fit in what is left of the file.
  void check_count(uint64_t n, uint64_t min_item_bytes, const std::string& where) const {
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) {
      fail(where, cat("count ", n, " cannot fit in the ", remaining(), " bytes left in the file"));
    }
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

GGUFValue read_value(Cursor& in, GGUFType type, const std::string& where, int depth);

GGUFValue read_array(Cursor& in, const std::string& where, int depth) {
  if (depth >= kMaxArrayDepth) in.fail(where, cat("arrays nested deeper than ", kMaxArrayDepth));
  GGUFValue v;
  v.type = GGUFType::array;
  const uint32_t raw_elem = in.read<uint32_t>(where + " (array element type)");
  if (!valid_type(raw_elem)) in.fail(where, cat("unknown array element type ", raw_elem));
  v.elem_type = static_cast<GGUFType>(raw_elem);
  v.n_elems = in.read<uint64_t>(where + " (array length)");
  const uint64_t elem_bytes = scalar_bytes(v.elem_type);
  if (elem_bytes > 0) {
    in.check_count(v.n_elems, elem_bytes, where + " (array length)");
    v.elems = in.take(v.n_elems * elem_bytes, where);
  } else if (v.elem_type == GGUFType::string) {
    in.check_count(v.n_elems, sizeof(uint64_t), where + " (array length)");
    v.strings.reserve(v.n_elems);
    for (uint64_t k = 0; k < v.n_elems; ++k) v.strings.push_back(in.read_string(where));
  } else {  // array of arrays: each needs at least its type and length
    in.check_count(v.n_elems, sizeof(uint32_t) + sizeof(uint64_t), where + " (array length)");
    v.items.reserve(v.n_elems);
    for (uint64_t k = 0; k < v.n_elems; ++k) v.items.push_back(read_array(in, where, depth + 1));
  }
  return v;
}

GGUFValue read_value(Cursor& in, GGUFType type, const std::string& where, int depth) {
  GGUFValue v;
  v.type = type;
  switch (type) {
    case GGUFType::u8: v.u = in.read<uint8_t>(where); break;
    case GGUFType::i8: v.i = in.read<int8_t>(where); break;
    case GGUFType::u16: v.u = in.read<uint16_t>(where); break;
    case GGUFType::i16: v.i = in.read<int16_t>(where); break;
    case GGUFType::u32: v.u = in.read<uint32_t>(where); break;
    case GGUFType::i32: v.i = in.read<int32_t>(where); break;
    case GGUFType::u64: v.u = in.read<uint64_t>(where); break;
    case GGUFType::i64: v.i = in.read<int64_t>(where); break;
    case GGUFType::f32: v.f = in.read<float>(where); break;
    case GGUFType::f64: v.f = in.read<double>(where); break;
    case GGUFType::boolean: v.u = in.read<uint8_t>(where) != 0; break;
    case GGUFType::string: v.str = in.read_string(where); break;
    case GGUFType::array: return read_array(in, where, depth);
  }
  return v;
}

}  // namespace

const char* gguf_type_name(GGUFType type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

bool GGUFValue::is_integer() const {
  switch (type) {
    case GGUFType::u8:
    case GGUFType::i8:
    case GGUFType::u16:
    case GGUFType::i16:
    case GGUFType::u32:
    case GGUFType::i32:
    case GGUFType::u64:
    case GGUFType::i64: return true;
    default: return false;
  }
}

int64_t GGUFValue::as_int() const {
  switch (type) {
    case GGUFType::i8:
    case GGUFType::i16:
    case GGUFType::i32:
    case GGUFType::i64: return i;
    case GGUFType::u8:
    case GGUFType::u16:
    case GGUFType::u32:
    case GGUFType::boolean: return static_cast<int64_t>(u);
    case GGUFType::u64:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw FormatError(cat("[gguf] value ", u, " does not fit in a signed 64-bit integer"));
      }
      return static_cast<int64_t>(u);
    default: throw FormatError(cat("[gguf] expected an integer, got ", gguf_type_name(type)));
  }
}

double GGUFValue::as_float() const {
  if (is_float()) return f;
  if (is_integer()) return static_cast<double>(as_int());
  throw FormatError(cat("[gguf] expected a number, got ", gguf_type_name(type)));
}

bool GGUFValue::as_bool() const {
  if (type == GGUFType::boolean) return u != 0;
  if (is_integer()) return as_int() != 0;
  throw FormatError(cat("[gguf] expected a bool, got ", gguf_type_name(type)));
}

std::shared_ptr<GGUFFile> GGUFFile::open_one(const std::string& path) {
  std::shared_ptr<GGUFFile> file(new GGUFFile());
  file->path_ = path;
  file->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd_ < 0) {
    throw FormatError(cat("[gguf] ", path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(file->fd_, &st) != 0) {
    throw FormatError(cat("[gguf] ", path, ": cannot stat: ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) throw FormatError(cat("[gguf] ", path, ": is a directory, not a file"));
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ == 0) throw FormatError(cat("[gguf] ", path, ": file is empty"));
  void* map = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, file->fd_, 0);
  if (map == MAP_FAILED) {
    throw FormatError(cat("[gguf] ", path, ": cannot mmap: ", std::strerror(errno)));
  }
  file->base_ = static_cast<const uint8_t*>(map);
  file->parse();
  return file;
}

GGUFFile::~GGUFFile() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void GGUFFile::parse() {
  Cursor in(path_, base_, size_);
  const uint32_t magic = in.read<uint32_t>("header (magic)");
  if (magic != kMagic) {
    char got[5] = {};
    std::memcpy(got, base_, 4);
    for (int k = 0; k < 4; ++k) got[k] = (got[k] >= 32 && got[k] < 127) ? got[k] : '?';
    in.fail("header", cat("not a GGUF file: magic is '", got, "', expected 'GGUF'"));
  }
  version_ = in.read<uint32_t>("header (version)");
  if (version_ == 1)
    in.fail("header", "GGUF version 1 is not supported (versions 2 and 3 are); re-convert the model");
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped_version = __builtin_bswap32(version_);
    const bool swapped = swapped_version >= 1 && swapped_version <= 3;
    in.fail("header", swapped ? cat("big-endian GGUF files are not supported")
                              : cat("unsupported GGUF version ", version_, " (supported: 2, 3)"));
  }
  const uint64_t n_tensors = in.read<uint64_t>("header (tensor count)");
  const uint64_t n_kv = in.read<uint64_t>("header (metadata count)");
  // A key-value pair needs at least a key length, a type and one byte; a tensor info at least a
  // name length, n_dims, a type and an offset.
  in.check_count(n_kv, 8 + 4 + 1, "header (metadata count)");
  in.check_count(n_tensors, 8 + 4 + 4 + 8, "header (tensor count)");

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string where = cat("metadata entry ", k);
    std::string key(in.read_string(where + " (key)"));
    if (!valid_utf8(key)) in.fail(where + " (key)", "key is not valid UTF-8");
    const std::string key_where = cat("metadata '", key, "'");
    const uint32_t raw_type = in.read<uint32_t>(key_where + " (type)");
    if (!valid_type(raw_type)) in.fail(key_where, cat("unknown value type ", raw_type));
    GGUFValue value = read_value(in, static_cast<GGUFType>(raw_type), key_where, 0);
    if (!kv_index_.emplace(key, kv_.size()).second) in.fail(key_where, "duplicate key");
    kv_.emplace_back(std::move(key), std::move(value));
  }

  if (const GGUFValue* a = find("general.alignment")) {
    if (a->type != GGUFType::u32) {
      in.fail("metadata 'general.alignment'", cat("expected u32, got ", gguf_type_name(a->type)));
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      in.fail("metadata 'general.alignment'", cat("must be a power of two, got ", a->u));
    }
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensorInfo t;
    t.name = std::string(in.read_string(cat("tensor ", k, " (name)")));
    if (!valid_utf8(t.name)) in.fail(cat("tensor ", k, " (name)"), "name is not valid UTF-8");
    const std::string where = cat("tensor '", t.name, "'");
    const uint32_t n_dims = in.read<uint32_t>(where + " (n_dims)");
    if (n_dims > kMaxDims) in.fail(where, cat("has ", n_dims, " dimensions, at most ", kMaxDims, " allowed"));
    t.n_elements = 1;
    int64_t nonzero_product = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = in.read<uint64_t>(where + " (shape)");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        in.fail(where, cat("dimension ", d, " is ", dim, ", too large"));
      }
      // Zero dims are legal (an empty tensor) but must not hide an overflow of the others,
      // which numpy would reject when the tensor's shape is handed to it.
      // (bounded by 2^60 so that even 8-byte elements keep a byte count within 64 bits).
      if (__builtin_mul_overflow(nonzero_product, std::max<int64_t>(dim, 1), &nonzero_product) ||
          nonzero_product > (int64_t{1} << 60)) {
        in.fail(where, "element count overflows 64 bits");
      }
      t.n_elements *= static_cast<int64_t>(dim);
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t raw_type = in.read<uint32_t>(where + " (type)");
    const TypeTraits* traits = find_type_traits(raw_type);
    if (traits == nullptr) in.fail(where, cat("unknown tensor type id ", raw_type));
    t.type = traits->type;
    t.offset = in.read<uint64_t>(where + " (offset)");
    const int64_t row = t.shape.empty() ? 1 : t.shape[0];
    if (row % traits->block_size != 0) {
      in.fail(where, cat("first dimension ", row, " is not a multiple of the ", traits->name, " block size ",
                         traits->block_size));
    }
    // n_elements / block_size * type_size cannot overflow: n_elements < 2^63 and type_size is
    // at most 292 bytes per block of at least 1 element — but check the multiply anyway.
    uint64_t n_bytes;
    if (__builtin_mul_overflow(static_cast<uint64_t>(t.n_elements / traits->block_size),
                               static_cast<uint64_t>(traits->type_size), &n_bytes)) {
      in.fail(where, "byte size overflows 64 bits");
    }
    t.n_bytes = n_bytes;
    if (t.offset % alignment_ != 0) {
      in.fail(where, cat("data offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) in.fail(where, "duplicate tensor name");
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the directory.
  const uint64_t end_of_directory = in.pos();
  data_offset_ = (end_of_directory + alignment_ - 1) / alignment_ * alignment_;
  for (GGUFTensorInfo& t : tensors_) {
    uint64_t begin, end;
    if (__builtin_add_overflow(data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > size_) {
      in.fail(cat("tensor '", t.name, "'"),
              cat("data [", t.offset, ", +", t.n_bytes, ") ends past the end of the file (data section at ",
                  data_offset_, ", file has ", size_, " bytes)"));
    }
    t.file_offset = begin;
    t.data = base_ + begin;
  }
}

const GGUFValue* GGUFFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const char* expected,
                             const GGUFValue& v) {
  std::string got = gguf_type_name(v.type);
  if (v.type == GGUFType::array) got = cat("array of ", gguf_type_name(v.elem_type));
  throw FormatError(cat("[gguf] ", path, ": metadata '", key, "': expected ", expected, ", got ", got));
}
}  // namespace

std::string GGUFFile::get_string(std::string_view key, std::string_view fallback) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return std::string(fallback);
  if (v->type != GGUFType::string) wrong_type(path_, key, "string", *v);
  return std::string(v->str);
}

int64_t GGUFFile::get_int(std::string_view key, int64_t fallback) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return fallback;
  if (!v->is_integer() && v->type != GGUFType::boolean) wrong_type(path_, key, "an integer", *v);
  return v->as_int();
}

double GGUFFile::get_float(std::string_view key, double fallback) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return fallback;
  if (!v->is_integer() && !v->is_float()) wrong_type(path_, key, "a number", *v);
  return v->as_float();
}

bool GGUFFile::get_bool(std::string_view key, bool fallback) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return fallback;
  if (!v->is_integer() && v->type != GGUFType::boolean) wrong_type(path_, key, "a bool", *v);
  return v->as_bool();
}

std::vector<std::string_view> GGUFFile::get_strings(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return {};
  if (v->type != GGUFType::array || v->elem_type != GGUFType::string) {
    wrong_type(path_, key, "array of string", *v);
  }
  return v->strings;
}

namespace {
// Reads element k of a numeric array as T (the array's elements are packed, maybe unaligned).
template <typename T>
T array_elem(const GGUFValue& v, uint64_t k) {
  auto load = [&](auto tag) {
    decltype(tag) x;
    std::memcpy(&x, v.elems + k * sizeof(x), sizeof(x));
    return static_cast<T>(x);
  };
  switch (v.elem_type) {
    case GGUFType::u8: return load(uint8_t{});
    case GGUFType::i8: return load(int8_t{});
    case GGUFType::u16: return load(uint16_t{});
    case GGUFType::i16: return load(int16_t{});
    case GGUFType::u32: return load(uint32_t{});
    case GGUFType::i32: return load(int32_t{});
    case GGUFType::u64: return load(uint64_t{});
    case GGUFType::i64: return load(int64_t{});
    case GGUFType::f32: return load(float{});
    case GGUFType::f64: return load(double{});
    case GGUFType::boolean: return load(uint8_t{});
    default: return T{};
  }
}
}  // namespace

std::vector<float> GGUFFile::get_floats(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return {};
  if (v->type != GGUFType::array || v->elems == nullptr) wrong_type(path_, key, "array of numbers", *v);
  std::vector<float> out(v->n_elems);
  for (uint64_t k = 0; k < v->n_elems; ++k) out[k] = array_elem<float>(*v, k);
  return out;
}

std::vector<int64_t> GGUFFile::get_ints(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (v == nullptr) return {};
  if (v->type != GGUFType::array || v->elems == nullptr || v->elem_type == GGUFType::f32 ||
      v->elem_type == GGUFType::f64) {
    wrong_type(path_, key, "array of integers", *v);
  }
  std::vector<int64_t> out(v->n_elems);
  for (uint64_t k = 0; k < v->n_elems; ++k) out[k] = array_elem<int64_t>(*v, k);
  return out;
}

const GGUFTensorInfo* GGUFFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GGUFFile::drop_pages(const void* data, size_t n_bytes) const { advise(data, n_bytes, MADV_DONTNEED); }

void GGUFFile::will_need(const void* data, size_t n_bytes) const { advise(data, n_bytes, MADV_WILLNEED); }

void GGUFFile::advise(const void* data, size_t n_bytes, int advice) const {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + n_bytes) / page * page;
  const auto map_begin = reinterpret_cast<uintptr_t>(base_), map_end = map_begin + size_;
  if (begin < end && begin >= map_begin && end <= map_end) {
    madvise(reinterpret_cast<void*>(begin), end - begin, advice);  // advice: failure is harmless
    return;
  }
  for (const auto& shard : other_shards_) shard->advise(data, n_bytes, advice);  // the one holding it acts
}

}  // namespace ember
