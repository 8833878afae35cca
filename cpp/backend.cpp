// backend.cpp: the backend-independent parts of backend.h (buffer ownership, op names).
#include "backend.h"

namespace ember {

const char* op_name(Op op) {
  constexpr const char* kNames[] = {
      "matmul",   "get_rows",  "rms_norm",        "layer_norm", "rope",           "add",
      "add_bias", "silu_mul",  "gelu_mul",        "gelu",       "scale",          "softmax",
      "store_kv", "attention", "add_rows_scaled", "swiglu_oai", "attention_sinks"};
  return kNames[static_cast<int>(op)];
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = other.backend_;
    data_ = other.data_;
    n_bytes_ = other.n_bytes_;
    owned_ = other.owned_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.n_bytes_ = 0;
    other.owned_ = false;
  }
  return *this;
}

void Buffer::reset() {
  if (owned_ && backend_ && data_) backend_->free_buffer(data_, n_bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  n_bytes_ = 0;
  owned_ = false;
}

}  // namespace ember
