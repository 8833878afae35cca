// kv/disk_cache.h: the prefix cache's second tier — full KV blocks as files in one directory,
// named by their chained hash (block_hash.h), so that a restarted engine serves a long prompt it
// saw before from disk instead of recomputing it. Bounded in bytes; the least recently used files
// go first. Knows nothing of block tables or backends: it stores a block's bytes (the runner's
// layout, all layers) with a header that says whose they are, and hands them back only when the
// header, the block's tokens and the payload's checksum all match. Thread-safe: the engine thread
// looks up and reads, one writer thread of its own writes (writes never block the caller).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace ember {

// What every file must match to be read back: the model and the shape of its K/V.
struct DiskCacheLayout {
  uint64_t model_id = 0;  // the model's identity (model_engine.h: model_identity)
  uint32_t kv_type = 0;   // the cache's DType, as its integer value
  int32_t block_size = 0;
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  int64_t payload_bytes = 0;  // one block's K and V, every layer
  bool operator==(const DiskCacheLayout&) const = default;
};

inline constexpr uint32_t kDiskCacheVersion = 1;

// How every file of K/V starts (block files here, state files in state_file.h): its kind, the
// format version and the DiskCacheLayout it was written for.
struct DiskFileLayout {
  char magic[8];      // the kind: "EMBERKVB" (a block file), "EMBERKVS" (a state file)
  uint32_t version;   // kDiskCacheVersion
  uint32_t kv_type;   // DiskCacheLayout's fields, as written
  uint64_t model_id;  //
  int32_t block_size;
  int32_t n_layer;
  int32_t n_head_kv;
  int32_t head_dim;
  uint64_t payload_bytes;
};
static_assert(sizeof(DiskFileLayout) == 48);

// The start of a file of kind `magic` written for `layout`.
DiskFileLayout disk_file_layout(const char (&magic)[8], const DiskCacheLayout& layout);
// Why a file that starts with `file` cannot be read as a `what` (e.g. "KV block file") of kind
// `magic` for `want`: another kind, format version, model, KV type or shape; "" when it can.
std::string layout_mismatch(const DiskFileLayout& file, const char (&magic)[8], const char* what,
                            const DiskCacheLayout& want);

// The header of a block file; then int32 tokens[block_size], then payload_bytes of K/V.
struct DiskBlockHeader {
  DiskFileLayout layout;  // magic "EMBERKVB"
  BlockHash hash;         // the block's chained hash (also its file name)
  BlockHash parent_hash;  // its parent's (kRootBlockHash for a first block)
  uint64_t checksum;      // payload_checksum of the tokens and the payload
};
static_assert(sizeof(DiskBlockHeader) == 72);

// 64-bit checksum of bytes (four xxHash64-style lanes of 8-byte words: ~10 GB/s, so reading a
// 2,000-token SmolLM2 prompt back costs a few ms of it).
uint64_t payload_checksum(std::span<const uint8_t> bytes, uint64_t seed = 0);

struct DiskCacheConfig {
  std::string dir;                                 // created if absent
  int64_t max_bytes = 0;                           // files in dir at most, headers included (>= 1)
  int64_t max_pending_bytes = int64_t{256} << 20;  // writes queued at most; more are dropped
  DiskCacheLayout layout;
  // Where warnings go (a file ignored, a write that failed); unset: stderr.
  std::function<void(const std::string&)> warn;
};

class DiskCache {
 public:
  // Creates dir, lists its block files (their last use is their mtime) and trims them to
  // max_bytes. Throws InvalidArgument for a bad bound or a directory that cannot be made.
  explicit DiskCache(DiskCacheConfig config);
  // Finishes the queued writes, then stops the writer.
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  const DiskCacheLayout& layout() const { return config_.layout; }
  const std::string& dir() const { return config_.dir; }

  // Whether a file named by `hash` exists and has not been found bad.
  bool contains(BlockHash hash) const;
  // The payload of block `hash` after `parent` holding `tokens`, or nullopt — with a warning,
  // and the file never tried again — when the file is truncated, corrupt (checksum), of another
  // model, KV type, shape or format version, or holds other tokens (a hash collision). A hit
  // makes the file the most recently used.
  std::optional<std::vector<uint8_t>> read(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens);
  // Queues the block for the writer (a payload of layout().payload_bytes); dropped, counted,
  // when max_pending_bytes are already queued. Returns at once.
  void write(BlockHash hash, BlockHash parent, std::vector<int32_t> tokens, std::vector<uint8_t> payload);
  // Waits until every queued write is on disk.
  void flush();

  struct Stats {
    int64_t n_files = 0;
    int64_t n_bytes = 0;
    int64_t n_written = 0;   // files written by this process
    int64_t n_read = 0;      // blocks read back
    int64_t n_rejected = 0;  // files ignored as bad
    int64_t n_dropped = 0;   // writes dropped for a full queue
    int64_t n_evicted = 0;   // files deleted for the bound
  };
  Stats stats() const;

 private:
  struct Entry {
    int64_t n_bytes = 0;
    uint64_t last_use = 0;  // key in by_use_
    bool rejected = false;  // found bad: never read again (still counts against the bound)
  };
  struct Job {
    BlockHash hash, parent;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> payload;
  };

  std::string path_of(BlockHash hash) const;
  void warn(const std::string& what) const;
  void writer_loop();
  void write_file(const Job& job);
  // Under mutex_: records a use of `hash`, adding its entry when new.
  void touch_locked(BlockHash hash, int64_t n_bytes);
  void evict_locked();

  DiskCacheConfig config_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, drained_;
  std::unordered_map<BlockHash, Entry> entries_;
  std::map<uint64_t, BlockHash> by_use_;  // last use -> file, oldest first
  uint64_t clock_ = 0;
  std::deque<Job> queue_;
  int64_t n_pending_bytes_ = 0;
  bool writing_ = false;  // the writer holds a job outside the queue
  bool stop_ = false;
  Stats stats_;
  std::thread writer_;  // last: starts after everything above is built
};

}  // namespace ember
