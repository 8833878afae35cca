// gguf/gguf_split.cpp: models that llama.cpp's gguf-split cut into shards named
// PREFIX-0000i-of-0000n.gguf. The first shard holds all the metadata; every shard holds
// split.no (0-based), split.count and split.tensors.count (the model's total) and some of the
// tensors. Opening any shard opens them all and presents one metadata set and one tensor
// directory; each tensor points into the mapping of the shard that holds it.
#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#include "gguf/gguf.h"

namespace ember {

namespace {

constexpr std::string_view k_split_no = "split.no";
constexpr std::string_view k_split_count = "split.count";
constexpr std::string_view k_split_tensors = "split.tensors.count";

// "-00002-of-00004.gguf" for the shard with split.no 1 of 4.
std::string shard_suffix(int64_t split_no, int64_t count) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.gguf", static_cast<long long>(split_no + 1),
                static_cast<long long>(count));
  return buf;
}

// The path of shard `want` beside `path`, which is shard `split_no` of `count`.
std::string sibling_path(const std::string& path, int64_t split_no, int64_t count, int64_t want) {
  const std::string suffix = shard_suffix(split_no, count);
  if (path.size() <= suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw FormatError(cat("[gguf] ", path, ": shard ", split_no + 1, " of a model split into ", count,
                          " files (split.no = ", split_no, "), but its name does not end in '", suffix,
                          "', so the other shards cannot be found"));
  }
  return path.substr(0, path.size() - suffix.size()) + shard_suffix(want, count);
}

}  // namespace

std::shared_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  std::shared_ptr<GGUFFile> file = open_one(path);
  const int64_t count = file->get_int(k_split_count, 1);
  if (count <= 1) return file;
  const int64_t split_no = file->get_int(k_split_no, -1);
  if (split_no < 0 || split_no >= count) {
    throw FormatError(cat("[gguf] ", path, ": metadata 'split.no' is ", split_no,
                          ", expected 0 <= split.no < ", count, " (split.count)"));
  }
  if (split_no == 0) {
    file->join_shards(file, 0);
    return file;
  }
  const std::string first_path = sibling_path(path, split_no, count, 0);
  if (::access(first_path.c_str(), F_OK) != 0) {
    throw FormatError(cat("[gguf] ", path, ": shard ", split_no + 1, " of ", count,
                          " of a split model; its first shard is missing (expected ", first_path, ")"));
  }
  std::shared_ptr<GGUFFile> first = open_one(first_path);
  first->join_shards(file, static_cast<uint32_t>(split_no));
  return first;
}

void GGUFFile::join_shards(std::shared_ptr<GGUFFile> opened, uint32_t opened_index) {
  const int64_t count = get_int(k_split_count, 1);
  const int64_t n_tensors = get_int(k_split_tensors, -1);
  // Every shard must agree with the first on these; a shard that does not belongs elsewhere.
  auto check = [&](const GGUFFile& shard, int64_t split_no) {
    const int64_t got_no = shard.get_int(k_split_no, -1), got_count = shard.get_int(k_split_count, 1);
    const int64_t got_tensors = shard.get_int(k_split_tensors, -1);
    if (got_no != split_no || got_count != count || got_tensors != n_tensors) {
      throw FormatError(cat("[gguf] ", shard.path(), ": split.no ", got_no, ", split.count ", got_count,
                            ", split.tensors.count ", got_tensors, "; expected ", split_no, ", ", count, ", ",
                            n_tensors, " as shard ", split_no + 1, " of ", path_,
                            " (a shard of another model, or a wrong count?)"));
    }
  };
  check(*this, 0);
  for (int64_t i = 1; i < count; ++i) {
    std::shared_ptr<GGUFFile> shard;
    if (i == opened_index) {
      shard = std::move(opened);
    } else {
      const std::string shard_path = sibling_path(path_, 0, count, i);
      if (::access(shard_path.c_str(), F_OK) != 0) {
        throw FormatError(cat("[gguf] ", path_, ": shard ", i + 1, " of ", count,
                              " of this split model is missing (", "expected ", shard_path, ")"));
      }
      shard = open_one(shard_path);
    }
    check(*shard, i);
    for (const GGUFTensorInfo& t : shard->tensors_) {
      const auto [at, inserted] = tensor_index_.emplace(t.name, tensors_.size());
      if (!inserted) {
        throw FormatError(cat("[gguf] ", shard->path_, ": tensor '", t.name, "' is also in shard ",
                              tensors_[at->second].shard + 1, " of ", path_));
      }
      tensors_.push_back(t);
      tensors_.back().shard = static_cast<uint32_t>(i);
    }
    other_shards_.push_back(std::move(shard));
  }
  if (static_cast<int64_t>(tensors_.size()) != n_tensors) {
    throw FormatError(cat("[gguf] ", path_, ": the ", count, " shards of this split model hold ",
                          tensors_.size(), " tensors, but split.tensors.count is ", n_tensors));
  }
}

uint64_t GGUFFile::file_bytes() const {
  uint64_t total = size_;
  for (const auto& shard : other_shards_) total += shard->size_;
  return total;
}

std::vector<std::string> GGUFFile::shard_paths() const {
  std::vector<std::string> out = {path_};
  for (const auto& shard : other_shards_) out.push_back(shard->path_);
  return out;
}

}  // namespace ember
