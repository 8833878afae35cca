// cuda/copy_kv.cu: the leading slots of one paged-cache block into another (copy on write of a
// partially shared prefix block), as one strided copy per cache in stream order.
#include "cuda/backend_cuda.h"
#include "cuda/device.h"

namespace ember {

void CudaBackend::copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) {
  if (n_slots == 0) return;
  use();
  // KVView's layout: each kv head's slots of a block lie together, block_size * head_bytes apart
  // from the next head's: n_head_kv rows of n_slots * head_bytes, that pitch apart.
  const size_t pitch = static_cast<size_t>(kv.block_size * kv.head_bytes);
  const size_t width = static_cast<size_t>(n_slots * kv.head_bytes);
  const size_t src = static_cast<size_t>(src_block) * static_cast<size_t>(kv.n_head_kv) * pitch;
  const size_t dst = static_cast<size_t>(dst_block) * static_cast<size_t>(kv.n_head_kv) * pitch;
  for (uint8_t* cache : {kv.k, kv.v}) {
    cuda::check(cudaMemcpy2DAsync(cache + dst, pitch, cache + src, pitch, width,
                                  static_cast<size_t>(kv.n_head_kv), cudaMemcpyDeviceToDevice, stream_),
                "copy_kv (cudaMemcpy2DAsync)", index_);
  }
  launched("copy_kv");
}

}  // namespace ember
