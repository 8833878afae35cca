// kv/block_hash.h: the prefix-cache key of a full KV block — a 64-bit hash chained through the
// block's parent, so equal hashes (almost always) mean equal token prefixes. Lookups still
// compare the tokens and the parent link, so a collision costs a cache miss, never wrong output.
#pragma once

#include <cstdint>
#include <span>

namespace ember {

using BlockHash = uint64_t;

// The "parent" of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x2545F4914F6CDD1DULL;

namespace detail {
inline constexpr uint64_t kHashPrime1 = 0x9E3779B185EBCA87ULL;  // xxHash64's primes
inline constexpr uint64_t kHashPrime2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kHashPrime4 = 0x85EBCA77C2B2AE63ULL;

constexpr uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// murmur3's 64-bit finalizer: every input bit flips each output bit with probability ~1/2.
constexpr uint64_t avalanche64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}
}  // namespace detail

// The "parent" hash of the first block of a chain in namespace ns (see PrefixLink): the root's
// for ns 0, a far-away seed for every other.
constexpr BlockHash root_block_hash(uint64_t ns) { return kRootBlockHash ^ detail::avalanche64(ns); }

// hash(parent, tokens): xxHash64-style rounds over the token ids, seeded with the parent's hash
// and finished with a full avalanche, so neighbouring prefixes land far apart in the table.
constexpr BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  using namespace detail;
  uint64_t h = parent * kHashPrime1 + kHashPrime4 + tokens.size();
  for (int32_t t : tokens) {
    uint64_t k = static_cast<uint64_t>(static_cast<uint32_t>(t)) * kHashPrime2;
    k = rotl64(k, 31) * kHashPrime1;
    h ^= k;
    h = rotl64(h, 27) * kHashPrime1 + kHashPrime4;
  }
  return avalanche64(h ^ (parent >> 29));
}

}  // namespace ember
