// kv/state_file.cpp: a sequence's tokens and K/V blocks in one checked file.
#include "kv/state_file.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace ember {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'K', 'V', 'S'};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

uint64_t state_checksum(const PrefixState& s) {
  uint64_t h = payload_checksum(
      {reinterpret_cast<const uint8_t*>(s.tokens.data()), s.tokens.size() * sizeof(int32_t)});
  for (const auto& b : s.blocks) h = payload_checksum(b, h);
  return h;
}

}  // namespace

int64_t write_state_file(const std::string& path, const DiskCacheLayout& l, const PrefixState& state) {
  StateFileHeader h{};
  h.layout = disk_file_layout(kMagic, l);
  h.n_tokens = state.tokens.size();
  h.n_blocks = state.blocks.size();
  h.checksum = state_checksum(state);
  const std::string tmp = path + ".tmp";
  bool ok = false;
  if (File f{std::fopen(tmp.c_str(), "wb")}) {
    ok = std::fwrite(&h, sizeof h, 1, f.get()) == 1 &&
         std::fwrite(state.tokens.data(), sizeof(int32_t), state.tokens.size(), f.get()) ==
             state.tokens.size();
    for (const auto& b : state.blocks) {
      ok = ok && static_cast<int64_t>(b.size()) == l.payload_bytes &&
           std::fwrite(b.data(), 1, b.size(), f.get()) == b.size();
    }
    ok = std::fclose(f.release()) == 0 && ok;
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    throw InvalidArgument(cat("[kv] state file '", path, "' could not be written"));
  }
  return static_cast<int64_t>(sizeof h + state.tokens.size() * sizeof(int32_t) +
                              state.blocks.size() * static_cast<size_t>(l.payload_bytes));
}

PrefixState read_state_file(const std::string& path, const DiskCacheLayout& want, int64_t* n_bytes) {
  const auto bad = [&](const auto&... why) {
    return InvalidArgument(cat("[kv] state file '", path, "': ", why...));
  };
  File f{std::fopen(path.c_str(), "rb")};
  if (!f) throw bad("cannot be opened (", std::strerror(errno), ")");
  StateFileHeader h;
  if (std::fread(&h, sizeof h, 1, f.get()) != 1) throw bad("shorter than its header (truncated)");
  if (const std::string why = layout_mismatch(h.layout, kMagic, "state file", want); !why.empty()) {
    throw bad(why);
  }
  if (h.n_blocks > h.n_tokens / static_cast<uint64_t>(want.block_size) || h.n_tokens > (uint64_t{1} << 31))
    throw bad(h.n_blocks, " blocks for ", h.n_tokens, " tokens");
  PrefixState s;
  s.tokens.resize(h.n_tokens);
  if (std::fread(s.tokens.data(), sizeof(int32_t), s.tokens.size(), f.get()) != s.tokens.size())
    throw bad("truncated");
  s.blocks.resize(h.n_blocks);
  for (auto& b : s.blocks) {
    b.resize(static_cast<size_t>(want.payload_bytes));
    if (std::fread(b.data(), 1, b.size(), f.get()) != b.size()) throw bad("truncated");
  }
  if (std::fgetc(f.get()) != EOF) throw bad("longer than its header says");
  if (state_checksum(s) != h.checksum) throw bad("its checksum does not match (corrupt)");
  if (n_bytes) {
    *n_bytes = static_cast<int64_t>(sizeof h + s.tokens.size() * sizeof(int32_t) +
                                    s.blocks.size() * static_cast<size_t>(want.payload_bytes));
  }
  return s;
}

}  // namespace ember
