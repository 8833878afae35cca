// tests/cpp/test_disk_cache.cpp: the prefix cache's disk tier without a model — block files
// written and read back byte for byte; truncated, corrupt, foreign (another model, KV type,
// shape) and colliding files ignored with a warning and never loaded; the byte bound evicting
// the least recently used files; and a KVCacheManager that, "restarted" over the same
// directory, serves a prompt's blocks from disk into fresh blocks (BlockLoad) and asks for the
// new ones to be saved (BlockSave).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fake_runner.h"
#include "harness.h"
#include "kv/disk_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_file.h"

using namespace ember;
namespace fs = std::filesystem;

namespace {

constexpr int kBlock = 4;

DiskCacheLayout layout(uint64_t model_id = 0xABCD, uint32_t kv_type = 1) {
  DiskCacheLayout l;
  l.model_id = model_id;
  l.kv_type = kv_type;
  l.block_size = kBlock;
  l.n_layer = 2;
  l.n_head_kv = 1;
  l.head_dim = 8;
  l.payload_bytes = 2 * 2 * kBlock * 8 * 2;  // layers * (K, V) * slots * head_dim * f16
  return l;
}

// A fresh directory under the system's temp dir, named for the case.
std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ember_disk_cache_test_" + name);
  fs::remove_all(dir);
  return dir.string();
}

struct Warnings {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  std::function<void(const std::string&)> sink() {
    auto l = lines;
    return [l](const std::string& w) { l->push_back(w); };
  }
};

DiskCacheConfig config(const std::string& dir, const DiskCacheLayout& l, Warnings& w,
                       int64_t max_bytes = int64_t{1} << 30) {
  DiskCacheConfig c;
  c.dir = dir;
  c.max_bytes = max_bytes;
  c.layout = l;
  c.warn = w.sink();
  return c;
}

std::vector<uint8_t> payload(uint8_t seed, int64_t n) {
  std::vector<uint8_t> p(static_cast<size_t>(n));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return p;
}

std::string file_of(const std::string& dir, BlockHash h) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.kvb", static_cast<unsigned long long>(h));
  return (fs::path(dir) / name).string();
}

TEST(disk_cache_round_trips_blocks_by_hash) {
  const std::string dir = fresh_dir("round_trip");
  Warnings w;
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  const BlockHash h = hash_block(kRootBlockHash, tokens);
  const auto bytes = payload(3, layout().payload_bytes);
  {
    DiskCache disk(config(dir, layout(), w));
    CHECK(!disk.contains(h));
    disk.write(h, kRootBlockHash, tokens, bytes);
    disk.flush();
    CHECK(disk.contains(h));
    CHECK_EQ(disk.stats().n_written, 1);
  }
  // A new cache over the directory (a restart) finds and reads it.
  DiskCache disk(config(dir, layout(), w));
  CHECK(disk.contains(h));
  const auto got = disk.read(h, kRootBlockHash, tokens);
  CHECK(got.has_value());
  CHECK(*got == bytes);
  CHECK_EQ(disk.stats().n_read, 1);
  CHECK_EQ(static_cast<int64_t>(w.lines->size()), 0);
  CHECK_EQ(disk.stats().n_bytes, static_cast<int64_t>(fs::file_size(file_of(dir, h))));
}

// Each bad file is ignored once with a warning naming the problem, then never read again.
TEST(disk_cache_ignores_truncated_corrupt_foreign_and_colliding_files) {
  const std::string dir = fresh_dir("bad_files");
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const BlockHash h = hash_block(kRootBlockHash, tokens);
  const auto bytes = payload(9, layout().payload_bytes);
  const std::string path = file_of(dir, h);
  const auto write_good = [&](const DiskCacheLayout& l) {
    Warnings w;
    DiskCache disk(config(dir, l, w));
    disk.write(h, kRootBlockHash, tokens, bytes);
    disk.flush();
  };
  const auto read_back = [&](const DiskCacheLayout& l, const std::vector<int32_t>& want_tokens,
                             const std::string& want_warning) {
    Warnings w;
    DiskCache disk(config(dir, l, w));
    CHECK(disk.contains(h));
    CHECK(!disk.read(h, kRootBlockHash, want_tokens).has_value());
    CHECK_EQ(static_cast<int64_t>(w.lines->size()), 1);
    EXPECT(w.lines->front().find(want_warning) != std::string::npos, w.lines->front());
    EXPECT(w.lines->front().find("ignored") != std::string::npos, w.lines->front());
    CHECK(!disk.contains(h));  // never tried again
    CHECK(!disk.read(h, kRootBlockHash, want_tokens).has_value());
    CHECK_EQ(static_cast<int64_t>(w.lines->size()), 1);
    CHECK_EQ(disk.stats().n_rejected, 1);
    CHECK_EQ(disk.stats().n_read, 0);
  };
  // Truncated: the last 10 bytes of the payload gone.
  write_good(layout());
  fs::resize_file(path, fs::file_size(path) - 10);
  read_back(layout(), tokens, "truncated");
  // Corrupt: one payload byte flipped.
  write_good(layout());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    const char c = static_cast<char>(0x5A);
    f.write(&c, 1);
  }
  read_back(layout(), tokens, "checksum");
  // Another model's file, another KV type's, another shape's.
  write_good(layout(0x1111));
  read_back(layout(), tokens, "another model");
  write_good(layout(0xABCD, 8));
  read_back(layout(), tokens, "KV type");
  DiskCacheLayout other_shape = layout();
  other_shape.n_layer = 4;
  other_shape.payload_bytes *= 2;
  {
    Warnings w;
    DiskCache disk(config(dir, other_shape, w));
    disk.write(h, kRootBlockHash, tokens, payload(1, other_shape.payload_bytes));
    disk.flush();
  }
  read_back(layout(), tokens, "expected");
  // A hash collision: the file holds other tokens than the lookup's.
  write_good(layout());
  read_back(layout(), {1, 2, 3, 5}, "other tokens");
  // Not an ember file at all.
  { std::ofstream(path, std::ios::binary) << std::string(200, 'x'); }
  read_back(layout(), tokens, "not an ember");
  // A good file again is read.
  write_good(layout());
  Warnings w;
  DiskCache disk(config(dir, layout(), w));
  CHECK(disk.read(h, kRootBlockHash, tokens) == std::optional<std::vector<uint8_t>>(bytes));
}

TEST(disk_cache_bound_evicts_the_least_recently_used_files) {
  const std::string dir = fresh_dir("bound");
  Warnings w;
  const int64_t file_bytes = static_cast<int64_t>(sizeof(DiskBlockHeader)) + kBlock * 4 +
                             layout().payload_bytes;
  std::vector<std::vector<int32_t>> blocks;
  std::vector<BlockHash> hashes;
  for (int32_t i = 0; i < 4; ++i) {
    blocks.push_back({i, i + 1, i + 2, i + 3});
    hashes.push_back(hash_block(kRootBlockHash, blocks.back()));
  }
  {
    DiskCache disk(config(dir, layout(), w, 3 * file_bytes));  // room for 3 files
    for (int i = 0; i < 3; ++i)
      disk.write(hashes[i], kRootBlockHash, blocks[i], payload(i, layout().payload_bytes));
    disk.flush();
    CHECK(disk.read(hashes[0], kRootBlockHash, blocks[0]).has_value());  // 0 is now the newest
    disk.write(hashes[3], kRootBlockHash, blocks[3], payload(3, layout().payload_bytes));
    disk.flush();
    CHECK_EQ(disk.stats().n_files, 3);
    CHECK_EQ(disk.stats().n_evicted, 1);
    CHECK(disk.stats().n_bytes <= 3 * file_bytes);
    CHECK(!disk.contains(hashes[1]));  // the least recently used
    CHECK(!fs::exists(file_of(dir, hashes[1])));
    CHECK(disk.contains(hashes[0]) && disk.contains(hashes[2]) && disk.contains(hashes[3]));
  }
  // A restart with a smaller bound trims to it, oldest use (mtime) first.
  DiskCache disk(config(dir, layout(), w, 2 * file_bytes));
  CHECK_EQ(disk.stats().n_files, 2);
  CHECK(!disk.contains(hashes[2]));
  CHECK(disk.contains(hashes[0]) && disk.contains(hashes[3]));
  CHECK_THROWS(InvalidArgument, DiskCache(config(dir, layout(), w, 0)), "size");
}

// The manager over a disk cache: a first "process" computes a prompt and hands its full blocks
// out to be saved; a second one (a fresh pool over the same directory) finds them on disk, plans
// loads into fresh blocks, counts them as computed and saves nothing it already has.
TEST(manager_serves_a_prompt_from_disk_after_a_restart) {
  const std::string dir = fresh_dir("manager");
  Warnings w;
  const auto prompt = iota_tokens(22, 100);  // 5 full blocks of 4, then 2 tokens
  const auto block_bytes = [](BlockId b) {
    return payload(static_cast<uint8_t>(b + 1), layout().payload_bytes);
  };
  std::vector<std::vector<uint8_t>> saved;
  {
    KVCacheConfig c = kv_config(16, kBlock);
    c.disk = std::make_shared<DiskCache>(config(dir, layout(), w));
    KVCacheManager kv(c);
    SequenceState a{1, prompt, 0};
    CHECK_EQ(kv.get_computed_blocks(a).n_tokens(), 0);
    CHECK(kv.allocate_slots(a, 22).has_value());
    a.n_computed_tokens = 22;
    kv.cache_computed_blocks(a);
    const auto saves = kv.take_block_saves();
    CHECK_EQ(static_cast<int64_t>(saves.size()), 5);
    BlockHash parent = kRootBlockHash;
    for (size_t i = 0; i < saves.size(); ++i) {
      const auto tokens = std::span<const int32_t>(prompt).subspan(i * kBlock, kBlock);
      CHECK_EQ(saves[i].block, kv.block_table(1)[i]);
      CHECK_EQ(saves[i].parent_hash, parent);
      CHECK_EQ(saves[i].hash, hash_block(parent, tokens));
      CHECK(std::ranges::equal(saves[i].tokens, tokens));
      parent = saves[i].hash;
      saved.push_back(block_bytes(saves[i].block));
      c.disk->write(saves[i].hash, saves[i].parent_hash, saves[i].tokens, saved.back());
    }
    c.disk->flush();
    kv.check_invariants();
  }
  KVCacheConfig c = kv_config(16, kBlock);
  c.disk = std::make_shared<DiskCache>(config(dir, layout(), w));
  KVCacheManager kv(c);
  // The same prompt: all 5 blocks from disk (the last token is always recomputed, and the 2
  // tokens after the blocks are computed).
  SequenceState b{2, prompt, 0};
  const PrefixHit hit = kv.get_computed_blocks(b);
  CHECK_EQ(hit.n_tokens(), 20);
  CHECK_EQ(hit.n_disk_tokens(), 20);
  CHECK(kv.allocate_slots(b, 2, hit) == std::optional<int64_t>(6));
  const auto loads = kv.take_block_loads();
  CHECK_EQ(static_cast<int64_t>(loads.size()), 5);
  for (size_t i = 0; i < loads.size(); ++i) {
    CHECK_EQ(loads[i].dst, kv.block_table(2)[i]);
    CHECK(*loads[i].payload == saved[i]);
  }
  CHECK_EQ(kv.n_disk_hit_tokens(), 20);
  b.n_computed_tokens = 22;
  kv.cache_computed_blocks(b);
  CHECK(kv.take_block_saves().empty());  // every block is on disk already
  CHECK_EQ(kv.pool().n_cached(), 5);
  // A prompt sharing 2 blocks then going elsewhere: 2 from memory now, nothing from disk.
  auto other = prompt;
  other[9] = 7;
  SequenceState d{3, other, 0};
  const PrefixHit hit_d = kv.get_computed_blocks(d);
  CHECK_EQ(hit_d.n_tokens(), 9);  // 2 blocks, then the partial row copy of block 3's first token
  CHECK_EQ(hit_d.n_disk_tokens(), 0);
  kv.check_invariants();
  CHECK_EQ(static_cast<int64_t>(w.lines->size()), 0);
}

TEST(state_file_round_trips_and_rejects_bad_files) {
  const std::string dir = fresh_dir("state");
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / "slot.bin").string();
  PrefixState s;
  s.tokens = iota_tokens(10, 3);
  s.blocks = {payload(1, layout().payload_bytes), payload(2, layout().payload_bytes)};
  const int64_t n = write_state_file(path, layout(), s);
  CHECK_EQ(n, static_cast<int64_t>(fs::file_size(path)));
  int64_t n_read = 0;
  const PrefixState back = read_state_file(path, layout(), &n_read);
  CHECK(back.tokens == s.tokens && back.blocks == s.blocks);
  CHECK_EQ(n_read, n);
  CHECK_THROWS(InvalidArgument, read_state_file(path, layout(0x77)), "another model");
  CHECK_THROWS(InvalidArgument, read_state_file(path, layout(0xABCD, 8)), "KV type");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x42');
  }
  CHECK_THROWS(InvalidArgument, read_state_file(path, layout()), "checksum");
  fs::resize_file(path, 100);
  CHECK_THROWS(InvalidArgument, read_state_file(path, layout()), "truncated");
  CHECK_THROWS(InvalidArgument, read_state_file(path + ".missing", layout()), "cannot be opened");
}

}  // namespace
