// tokenizer/flat_index.h: two open-addressing hash tables for the tokenizers' hot lookups —
// token text -> id (every encode step asks it) and token-id pair -> BPE merge. Node-based
// std::unordered_map costs a cache miss per node and an allocation per entry; these keep all
// slots in one array (linear probing, load factor <= 1/2), built once at load, read-only after.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ember {

// 64-bit FNV-1a mixed with a final avalanche; token texts are short, so this beats
// std::hash's generic routine.
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

inline uint64_t hash_u64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline size_t table_capacity(size_t n_entries) {
  size_t cap = 16;
  while (cap < 2 * n_entries) cap *= 2;
  return cap;
}

// Maps strings to ids. Stores only (hash tag, id); the strings themselves are read back
// through `text_of(id)`, so the caller's storage must outlive the index and not move.
template <typename TextOf>
class TextIndex {
 public:
  explicit TextIndex(TextOf text_of) : text_of_(text_of) {}

  // Builds the table for ids [0, n); a later id replaces an earlier one with the same text.
  void build(int32_t n) {
    slots_.assign(table_capacity(static_cast<size_t>(n)), Slot{0, -1});
    mask_ = slots_.size() - 1;
    for (int32_t id = 0; id < n; ++id) {
      const std::string_view text = text_of_(id);
      if (text.empty()) continue;
      const uint64_t h = hash_bytes(text);
      size_t i = h & mask_;
      while (slots_[i].id >= 0 && !(slots_[i].tag == tag(h) && text_of_(slots_[i].id) == text))
        i = (i + 1) & mask_;
      slots_[i] = Slot{tag(h), id};
    }
  }

  // The id spelled `text`, -1 when none.
  int32_t find(std::string_view text) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(text);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag(h) && text_of_(s.id) == text) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high bits of the hash: most mismatches are rejected without the string
    int32_t id;    // -1: empty
  };
  static uint32_t tag(uint64_t h) { return static_cast<uint32_t>(h >> 32); }

  TextOf text_of_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Maps a pair of token ids to a BPE merge (its rank and the token it produces).
class MergeIndex {
 public:
  struct Merge {
    int32_t rank;
    int32_t result;
  };

  void reserve(size_t n_entries) {
    slots_.assign(table_capacity(n_entries), Slot{k_empty, {0, 0}});
    mask_ = slots_.size() - 1;
  }

  // Keeps the first (lowest-rank) merge of a pair. reserve() must have room for it.
  void insert(int32_t left, int32_t right, Merge merge) {
    const uint64_t k = key(left, right);
    size_t i = hash_u64(k) & mask_;
    while (slots_[i].key != k_empty && slots_[i].key != k) i = (i + 1) & mask_;
    if (slots_[i].key == k_empty) slots_[i] = Slot{k, merge};
  }

  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = hash_u64(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == k_empty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t k_empty = ~0ull;  // ids are non-negative, so no real key is this
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace ember
