// kv/state_file.h: one sequence's prompt state in one file — its token ids and the K/V of its
// leading full blocks (each block as the disk cache stores it), with the same checks as a block
// file: format, model, KV type, block shape and a checksum. What llama-server's slot save and
// restore and LLM.save_state/load_state read and write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/disk_cache.h"

namespace ember {

struct PrefixState {
  std::vector<int32_t> tokens;               // every token of the sequence
  std::vector<std::vector<uint8_t>> blocks;  // [<= tokens / block_size] K/V of its first blocks
};

// The header of a state file; then int32 tokens[n_tokens], then n_blocks payloads.
struct StateFileHeader {
  DiskFileLayout layout;  // magic "EMBERKVS"
  uint64_t n_tokens;
  uint64_t n_blocks;
  uint64_t checksum;  // payload_checksum of the tokens, then of each block, chained
};
static_assert(sizeof(StateFileHeader) == 72);

// Writes `state` to path (through a temporary file and a rename). Returns the bytes written.
// Throws InvalidArgument when the file cannot be written.
int64_t write_state_file(const std::string& path, const DiskCacheLayout& layout, const PrefixState& state);
// Reads a state file written for `layout`. Throws InvalidArgument naming the file and what is
// wrong with it (missing, truncated, corrupt, another model, KV type or shape).
PrefixState read_state_file(const std::string& path, const DiskCacheLayout& layout,
                            int64_t* n_bytes = nullptr);

}  // namespace ember
