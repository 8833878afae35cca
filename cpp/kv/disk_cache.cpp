// kv/disk_cache.cpp: block files — their index, LRU bound, validation and the writer thread.
#include "kv/disk_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "core/error.h"

namespace ember {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'K', 'V', 'B'};
constexpr const char* kSuffix = ".kvb";

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

// The hash a file name "<16 hex digits>.kvb" stands for, or nullopt for another name.
std::optional<BlockHash> hash_of_name(const std::string& name) {
  if (name.size() != 16 + std::strlen(kSuffix) || !name.ends_with(kSuffix)) return std::nullopt;
  BlockHash h = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    h = h << 4 | static_cast<uint64_t>(d);
  }
  return h;
}

std::span<const uint8_t> bytes_of(std::span<const int32_t> tokens) {
  return {reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size_bytes()};
}

}  // namespace

uint64_t payload_checksum(std::span<const uint8_t> bytes, uint64_t seed) {
  using namespace detail;
  uint64_t lane[4] = {seed + kHashPrime1 + kHashPrime2, seed + kHashPrime2, seed, seed - kHashPrime1};
  const size_t n_words = bytes.size() / 8;
  size_t i = 0;
  for (; i + 4 <= n_words; i += 4) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + (i + l) * 8, 8);
      lane[l] = rotl64(lane[l] + w * kHashPrime2, 31) * kHashPrime1;
    }
  }
  uint64_t h = bytes.size() * kHashPrime4;
  for (int l = 0; l < 4; ++l) h = rotl64(h ^ avalanche64(lane[l]), 27) * kHashPrime1 + kHashPrime4;
  for (size_t off = i * 8; off < bytes.size(); ++off)
    h = rotl64(h ^ (bytes[off] * kHashPrime1), 11) * kHashPrime2;
  return avalanche64(h);
}

DiskFileLayout disk_file_layout(const char (&magic)[8], const DiskCacheLayout& l) {
  DiskFileLayout f{};
  std::memcpy(f.magic, magic, sizeof f.magic);
  f.version = kDiskCacheVersion;
  f.kv_type = l.kv_type;
  f.model_id = l.model_id;
  f.block_size = l.block_size;
  f.n_layer = l.n_layer;
  f.n_head_kv = l.n_head_kv;
  f.head_dim = l.head_dim;
  f.payload_bytes = static_cast<uint64_t>(l.payload_bytes);
  return f;
}

std::string layout_mismatch(const DiskFileLayout& f, const char (&magic)[8], const char* what,
                            const DiskCacheLayout& want) {
  if (std::memcmp(f.magic, magic, sizeof f.magic) != 0) return cat("not an ember ", what);
  if (f.version != kDiskCacheVersion) {
    return cat("format version ", f.version, ", this build reads ", kDiskCacheVersion);
  }
  if (f.model_id != want.model_id) {
    return cat("written for another model (id ", hex(f.model_id), ", this one is ", hex(want.model_id), ")");
  }
  if (f.kv_type != want.kv_type) return cat("KV type ", f.kv_type, ", the cache holds type ", want.kv_type);
  if (f.block_size != want.block_size || f.n_layer != want.n_layer || f.n_head_kv != want.n_head_kv ||
      f.head_dim != want.head_dim || static_cast<int64_t>(f.payload_bytes) != want.payload_bytes) {
    return cat("written for another KV shape: blocks of ", f.block_size, " tokens, ", f.n_layer, " layers, ",
               f.n_head_kv, "x", f.head_dim, " KV heads, ", f.payload_bytes, " bytes; expected ",
               want.block_size, ", ", want.n_layer, ", ", want.n_head_kv, "x", want.head_dim, ", ",
               want.payload_bytes);
  }
  return "";
}

DiskCache::DiskCache(DiskCacheConfig config) : config_(std::move(config)) {
  if (config_.max_bytes < 1) {
    throw InvalidArgument(cat("[kv] the disk cache's size must be >= 1 byte, got ", config_.max_bytes));
  }
  std::error_code ec;
  fs::create_directories(config_.dir, ec);
  if (ec || !fs::is_directory(config_.dir)) {
    throw InvalidArgument(cat("[kv] cache dir '", config_.dir, "' is not a directory it can make (",
                              ec ? ec.message() : "exists as a file", ")"));
  }
  // Existing files, oldest use first: their mtimes order them (a read touches its file).
  std::vector<std::pair<fs::file_time_type, std::pair<BlockHash, int64_t>>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(config_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".tmp")) {  // a write cut short by a crash
      fs::remove(e.path(), ec);
      continue;
    }
    const auto hash = hash_of_name(name);
    if (!hash || !e.is_regular_file(ec)) continue;
    found.push_back({e.last_write_time(ec), {*hash, static_cast<int64_t>(e.file_size(ec))}});
  }
  std::ranges::sort(found, {}, &decltype(found)::value_type::first);
  {
    std::lock_guard lock(mutex_);
    for (const auto& [when, file] : found) touch_locked(file.first, file.second);
    evict_locked();
  }
  writer_ = std::thread([this] { writer_loop(); });
}

DiskCache::~DiskCache() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

std::string DiskCache::path_of(BlockHash hash) const {
  return (fs::path(config_.dir) / (hex(hash) + kSuffix)).string();
}

void DiskCache::warn(const std::string& what) const {
  if (config_.warn) {
    config_.warn(what);
  } else {
    std::cerr << "ember: warning: " << what << std::endl;
  }
}

bool DiskCache::contains(BlockHash hash) const {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  return it != entries_.end() && !it->second.rejected;
}

DiskCache::Stats DiskCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void DiskCache::touch_locked(BlockHash hash, int64_t n_bytes) {
  auto [it, inserted] = entries_.try_emplace(hash);
  Entry& e = it->second;
  if (inserted) {
    ++stats_.n_files;
  } else {
    by_use_.erase(e.last_use);
    stats_.n_bytes -= e.n_bytes;
  }
  e.n_bytes = n_bytes;
  stats_.n_bytes += n_bytes;
  e.last_use = ++clock_;
  by_use_.emplace(e.last_use, hash);
}

void DiskCache::evict_locked() {
  while (stats_.n_bytes > config_.max_bytes && !by_use_.empty()) {
    const auto oldest = by_use_.begin();
    const BlockHash hash = oldest->second;
    by_use_.erase(oldest);
    const auto it = entries_.find(hash);
    stats_.n_bytes -= it->second.n_bytes;
    --stats_.n_files;
    ++stats_.n_evicted;
    entries_.erase(it);
    std::error_code ec;
    fs::remove(path_of(hash), ec);
  }
}

std::optional<std::vector<uint8_t>> DiskCache::read(BlockHash hash, BlockHash parent,
                                                    std::span<const int32_t> tokens) {
  if (!contains(hash)) return std::nullopt;
  const std::string path = path_of(hash);
  const DiskCacheLayout& want = config_.layout;
  const auto reject = [&](const std::string& why) -> std::optional<std::vector<uint8_t>> {
    warn(cat("[kv] cache file ", path, ": ", why, "; ignored"));
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(hash);
    if (it != entries_.end()) it->second.rejected = true;
    ++stats_.n_rejected;
    return std::nullopt;
  };
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return reject("cannot be opened");
  DiskBlockHeader h;
  if (std::fread(&h, sizeof h, 1, f.get()) != 1) return reject("shorter than its header (truncated)");
  if (const std::string why = layout_mismatch(h.layout, kMagic, "KV block file", want); !why.empty()) {
    return reject(why);
  }
  if (h.hash != hash || h.parent_hash != parent) return reject("holds another block (its hashes differ)");
  std::vector<int32_t> file_tokens(static_cast<size_t>(want.block_size));
  std::vector<uint8_t> payload(static_cast<size_t>(want.payload_bytes));
  if (std::fread(file_tokens.data(), sizeof(int32_t), file_tokens.size(), f.get()) != file_tokens.size() ||
      std::fread(payload.data(), 1, payload.size(), f.get()) != payload.size()) {
    return reject("truncated");
  }
  if (std::fgetc(f.get()) != EOF) return reject("longer than a block");
  if (!std::ranges::equal(file_tokens, tokens)) return reject("holds other tokens (a hash collision)");
  if (payload_checksum(payload, payload_checksum(bytes_of(file_tokens))) != h.checksum)
    return reject("its checksum does not match (corrupt)");
  f.reset();
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // the use survives a restart
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it != entries_.end()) touch_locked(hash, it->second.n_bytes);
  ++stats_.n_read;
  return payload;
}

void DiskCache::write(BlockHash hash, BlockHash parent, std::vector<int32_t> tokens,
                      std::vector<uint8_t> payload) {
  if (static_cast<int64_t>(payload.size()) != config_.layout.payload_bytes ||
      static_cast<int64_t>(tokens.size()) != config_.layout.block_size) {
    throw std::logic_error(cat("[kv] a disk block of ", tokens.size(), " tokens and ", payload.size(),
                               " bytes; the layout has ", config_.layout.block_size, " and ",
                               config_.layout.payload_bytes));
  }
  {
    std::lock_guard lock(mutex_);
    const int64_t n = static_cast<int64_t>(payload.size());
    if (n_pending_bytes_ + n > config_.max_pending_bytes) {
      ++stats_.n_dropped;
      return;
    }
    n_pending_bytes_ += n;
    queue_.push_back({hash, parent, std::move(tokens), std::move(payload)});
  }
  wake_.notify_all();
}

void DiskCache::flush() {
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void DiskCache::writer_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything written
    Job job = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    write_file(job);
    lock.lock();
    writing_ = false;
    n_pending_bytes_ -= static_cast<int64_t>(job.payload.size());
    if (queue_.empty()) drained_.notify_all();
  }
}

// Writes to a temporary name and renames, so a reader (or a crash) never sees half a file.
void DiskCache::write_file(const Job& job) {
  const DiskCacheLayout& l = config_.layout;
  DiskBlockHeader h{};
  h.layout = disk_file_layout(kMagic, l);
  h.hash = job.hash;
  h.parent_hash = job.parent;
  h.checksum = payload_checksum(job.payload, payload_checksum(bytes_of(job.tokens)));
  const std::string path = path_of(job.hash), tmp = path + ".tmp";
  bool ok = false;
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (f) {
      ok = std::fwrite(&h, sizeof h, 1, f.get()) == 1 &&
           std::fwrite(job.tokens.data(), sizeof(int32_t), job.tokens.size(), f.get()) == job.tokens.size() &&
           std::fwrite(job.payload.data(), 1, job.payload.size(), f.get()) == job.payload.size();
      ok = std::fclose(f.release()) == 0 && ok;
    }
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    warn(cat("[kv] cache file ", path,
             " could not be written (disk full or not writable); the block stays in memory only"));
    return;
  }
  const int64_t n_bytes = static_cast<int64_t>(sizeof h + job.tokens.size() * sizeof(int32_t) +
                                               job.payload.size());
  std::lock_guard lock(mutex_);
  touch_locked(job.hash, n_bytes);
  entries_[job.hash].rejected = false;
  ++stats_.n_written;
  evict_locked();
}

}  // namespace ember
