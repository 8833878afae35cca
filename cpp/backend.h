// backend.h: the interface every compute backend (cpu/, vulkan/, later cuda/ and metal/)
// implements — buffers, the ops a model's forward pass needs, a capability query, a command
// stream (ops are recorded; synchronize() and download() finish them) and device memory.
// Model code calls ops only through this interface; it knows nothing of threads or ISAs.
//
// Conventions shared by every op:
//  - activations are float32, row-major, and live in the backend's memory (alloc(): host memory
//    on the CPU, device memory on a GPU, where data() is an address only ops understand — model
//    code may offset it, never dereference it);
//  - small index tables an op reads (token ids, positions, output rows, block tables, RoPE
//    frequencies) may be host pointers: a device backend copies them as it records the op, so the
//    caller may change them afterwards;
//  - weights are GGUF tensors in any dtype the backend supports, laid out as in the file, except
//    matmul weights, which go through prepare_matmul_weight() once (the backend may repack them);
//  - ops may run asynchronously: a device backend records them into one command stream, which
//    synchronize() submits and waits for (once per engine step), as does download() (the CPU
//    runs each op to completion before returning, so its synchronize() does nothing);
//  - ops never throw and never allocate: callers check supports() and sizes once, at load, and
//    size the ops' scratch there (reserve_matmul).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace ember {

class Backend;

// The ops of the Backend interface, for supports().
enum class Op {
  matmul,
  get_rows,
  rms_norm,
  layer_norm,
  rope,
  add,
  add_bias,
  silu_mul,
  gelu_mul,
  gelu,
  scale,
  softmax,
  store_kv,
  attention,
  add_rows_scaled,
  swiglu_oai,      // gpt-oss's clamped SwiGLU
  attention_sinks  // attention with AttentionParams::sinks (gpt-oss)
};

const char* op_name(Op op);

// Memory owned by (or wrapped into) a backend. Move-only; frees itself through its backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, void* data, size_t n_bytes, bool owned)
      : backend_(backend), data_(data), n_bytes_(n_bytes), owned_(owned) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t n_bytes() const { return n_bytes_; }
  void reset();

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t n_bytes_ = 0;
  bool owned_ = false;  // false: wraps memory someone else owns (e.g. the GGUF mapping)
};

// One output of Backend::matmul_many: y[n_rows, n_out] = x · Wᵀ, with w as matmul() takes it.
struct MatmulOut {
  DType wtype;
  const void* w;
  int64_t n_out;
  float* y;
};

// Backend::add_low_rank takes up to this many outputs of one input (a layer's q, k and v).
inline constexpr int kMaxLowRankOuts = 3;

// A low-rank pair of add_low_rank: prepare_matmul_weight()'s buffers of A {n_in, rank} and of
// B {rank, n_out}, both `type` (f32 or f16); rank 0: no pair.
struct LowRankPair {
  DType type = DType::f32;
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t rank = 0;
};

// Rows that add the same pairs (one LoRA adapter's rows of a pass). The rows and scales are host
// tables.
struct LowRankGroup {
  const int32_t* rows = nullptr;  // [n_rows] rows of x and of every output, ascending
  const float* scales = nullptr;  // [n_rows] each row's factor
  int64_t n_rows = 0;
  bool contiguous = false;             // rows[i] == rows[0] + i
  LowRankPair pairs[kMaxLowRankOuts];  // output j's pair
};

// One output of add_low_rank: y [*, n_out].
struct LowRankOut {
  float* y;
  int64_t n_out;
};

// add_low_rank's scratch (backend memory, f32), where the groups' rows lie end to end (group g's
// first row at the sum of the groups' n_rows before it).
struct LowRankScratch {
  float* x_rows;     // [rows, n_in] the groups' input rows, gathered
  float* t;          // [kMaxLowRankOuts][t_stride] of [rows, max_rank]: A · x of each output
  float* y_rows;     // [max group rows, max n_out] B · (A · x)
  int64_t t_stride;  // floats of t per output
  int64_t max_rank;  // the largest rank of any pair, t's row stride
};

// How RoPE pairs up the dimensions of a head.
enum class RopeLayout {
  interleaved,  // pairs (2i, 2i+1): llama.cpp's "normal" mode (GGUF llama Q/K rows are permuted for it)
  neox,         // pairs (i, i + n_rot/2): GPT-NeoX / HF rotate_half (qwen2, qwen3)
};

struct RopeParams {
  RopeLayout layout = RopeLayout::interleaved;
  int64_t n_rot = 0;                // leading dims of each head that rotate (even, <= head_dim)
  const float* inv_freq = nullptr;  // [n_rot/2] angle per position of pair i, scaling included:
                                    // freq_scale * freq_base^(-2i/n_rot) / freq_factor[i]
  float mscale = 1.0f;              // multiplies cos and sin (LongRoPE's attention factor)
};

// Where one layer's cached keys and values of one sequence live. Each slot holds one K row and
// one V row of n_kv_dim = n_head_kv * head_dim values, stored as `type`:
//   f16:  IEEE binary16 values (2 bytes each);
//   q8_0: BlockQ8_0 (quant/blocks.h: an f16 scale and 32 int8, 34 bytes) of 32 values each, as
//         quantize_row_q8_0 writes them; head_dim must be a multiple of 32, so a block never
//         straddles two heads.
// The token at position t sits in slot t % block_size of block b(t) = block_table[t /
// block_size] (paged cache), or t / block_size without a table (contiguous cache). A block of
// block_size slots keeps each kv head's rows together: [n_head_kv][block_size][head_bytes], so
// that attention, which reads one kv head at a time, streams contiguous memory. With every head
// of a slot side by side, a SmolLM2 head's 128 bytes sat 384 bytes apart: attention of one row
// over 800 keys in 30 SmolLM2-shaped layers took 2.6-3.3 ms at 1 thread against 1.9-2.3 this way
// (Zen 4, a stand-alone benchmark of cpu::attention).
struct KVView {
  DType type = DType::f16;  // f16 or q8_0
  uint8_t* k = nullptr;     // [n_blocks][n_head_kv][block_size][head_bytes] keys
  uint8_t* v = nullptr;     // the same of values
  int64_t n_head_kv = 1;
  int64_t head_bytes = 0;                // one kv head's values of one slot: row_bytes(type, head_dim)
  const int32_t* block_table = nullptr;  // [n_blocks of the sequence] or nullptr
  int64_t block_size = 0;                // slots per block (>= 1)

  int64_t row_bytes() const { return n_head_kv * head_bytes; }  // one slot's K (or V), all heads
  // Bytes from k (or v) to kv head `head`'s values at position pos.
  int64_t offset(int64_t pos, int64_t head) const {
    const int64_t block = block_table ? int64_t{block_table[pos / block_size]} : pos / block_size;
    return ((block * n_head_kv + head) * block_size + pos % block_size) * head_bytes;
  }
};

// The largest head_dim any backend's attention must handle (kernels keep a head in registers or
// on the stack); models with larger heads are rejected at load.
inline constexpr int64_t kMaxHeadDim = 512;

// The attention of one sequence's new rows over its cache (which already holds those rows).
struct AttentionParams {
  int64_t n_head = 0;     // query heads
  int64_t n_head_kv = 0;  // key/value heads; query head h reads kv head h / (n_head / n_head_kv)
  int64_t head_dim = 0;
  float scale = 1.0f;    // applied to q·k before the softmax, usually 1/sqrt(head_dim)
  int64_t window = 0;    // > 0: sliding window, a row at position p sees keys p - window + 1 .. p
  float softcap = 0.0f;  // > 0: each scaled score s becomes softcap * tanh(s / softcap) (Gemma 2)
  // [n_head] f32, or nullptr: head h's sink, a logit that joins every row's softmax without a
  // value, so a row's weights sum to less than 1 (gpt-oss; Op::attention_sinks says who has it).
  const float* sinks = nullptr;
};

// Memory of a backend's device (a GPU's device-local heap).
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // what the driver says is left for this process (its budget), else total
};

// One device a backend can run on, for listings (`ember info --devices`).
struct BackendDevice {
  std::string backend;  // "cpu", "vulkan"
  int index = 0;        // the N of "vulkan:N"
  std::string name;     // e.g. "AMD Radeon RX 7900 XTX", "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;     // "cpu", "discrete", "integrated", "virtual", "other"
  int64_t memory_bytes = 0;
  int64_t memory_free_bytes = 0;
  std::string unusable;  // empty: usable; else why ember cannot run on it
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // The device it runs on, for people: "cpu", "vulkan:0 (llvmpipe ...)".
  virtual std::string device_name() const { return name(); }
  // The device's memory; nullopt for the CPU (host memory, no budget to ask).
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  // Command submissions so far (a device backend: one per synchronize() that had work; tests
  // check one per engine step). 0 for the CPU.
  virtual int64_t n_submissions() const { return 0; }
  // Host threads the backend's ops run on (the CPU's pool; 1 for a device driven by one thread).
  virtual int n_threads() const = 0;
  // True if `op` runs with weights/tables of `dtype` (activation-only ops accept f32 only); for
  // store_kv and attention, `dtype` is the KV cache's element type (KVView::type).
  virtual bool supports(Op op, DType dtype) const = 0;
  // The smallest row count from which each row of matmul() with `wtype` weights gives the same
  // bits whatever the call's n_rows (>= this count) is: 1 if a row's result never depends on the
  // rows batched with it. A caller that needs batch-invariant rows pads smaller calls to it.
  virtual int64_t matmul_exact_min_rows(DType wtype) const = 0;
  // Sizes matmul()'s scratch for calls of up to max_rows rows of up to max_n_in inputs, so that
  // those calls never allocate. Called at load (once per activation scratch); grows, never shrinks.
  virtual void reserve_matmul(int64_t max_rows, int64_t max_n_in) = 0;
  // Submits the ops recorded so far (if the backend records them) and waits until they finished.
  virtual void synchronize() = 0;

  // --- buffers ---
  // Uninitialized memory of n_bytes, 64-byte aligned. Pages may be committed lazily.
  virtual Buffer alloc(size_t n_bytes) = 0;
  // Host memory (weights in the file mapping) made readable by ops, once, at load: the same
  // memory where the backend reads host memory in place (the CPU never copies), else a device
  // copy (uploaded before this returns).
  virtual Buffer wrap_host(const void* data, size_t n_bytes) = 0;
  // Host -> buffer and buffer -> host copies; both have finished when they return (download
  // first finishes the ops recorded before it: on a device, that is the step's one submission).
  virtual void upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) = 0;
  virtual void download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) = 0;

  // The weights matmul() reads for the GGUF tensor {n_in, n_out} of `wtype` at `data` (in the
  // file mapping), made once at load: a view of `data` where the backend reads the file's layout
  // (no copy), else memory of its own holding the layout its kernels read fastest (a repacked
  // copy, valid while the returned buffer and the backend live: the CPU's is a view into a weight
  // arena it owns). matmul() must be given the returned buffer's data().
  virtual Buffer prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) = 0;

  // --- ops ---
  // y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ; W is prepare_matmul_weight()'s buffer of a GGUF
  // tensor {n_in, n_out} of `wtype`.
  virtual void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
                      float* y) = 0;
  // matmul() of one x[n_rows, n_in] by each of several weights (a layer's q, k and v; gate and
  // up), each output as its own matmul() gives it. One by one here; the CPU backend shares the
  // activations' quantization and one job on its threads between them.
  virtual void matmul_many(const MatmulOut* outs, int n_outs, int64_t n_in, const float* x, int64_t n_rows) {
    for (int i = 0; i < n_outs; ++i)
      matmul(outs[i].wtype, outs[i].w, n_in, outs[i].n_out, x, n_rows, outs[i].y);
  }
  // y_j[rows[i], :] += scales[i] · B · (A · x[rows[i], :]) for every row i of every group and
  // every output j the group has a pair for (LoRA adapters' products, each row with its own
  // adapter), x [*, n_in]. Made here of get_rows, matmul_many, matmul and add_rows_scaled, one
  // group after another (their supports() answer for it); the CPU backend runs every A product in
  // one job, then every B product with its sum in another, each row's result the same bits
  // whatever rows come with it.
  virtual void add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                            const float* x, int64_t n_in, const LowRankScratch& scratch);
  // y[n_ids, n_cols] = table[ids[i], :] dequantized; table is {n_cols, n_table_rows} of `type`.
  virtual void get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids,
                        float* y) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight; x, y [n_rows, n_cols], weight [n_cols].
  // y may alias x.
  virtual void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps,
                        float* y) = 0;
  // y[r, :] = (x[r, :] - mean(x[r, :])) / sqrt(var(x[r, :]) + eps) * weight + bias (LayerNorm, the
  // population variance); x, y [n_rows, n_cols], weight and bias [n_cols]. y may alias x.
  virtual void layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows,
                          int64_t n_cols, float eps, float* y) = 0;
  // Rotates x[n_rows, n_heads, head_dim] in place; row r is at position positions[r].
  virtual void rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
                    const RopeParams& params) = 0;
  // y[n] = a[n] + b[n]; y may alias a or b.
  virtual void add(const float* a, const float* b, int64_t n, float* y) = 0;
  // x[r, :] += bias[:] for x [n_rows, n_cols].
  virtual void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols) = 0;
  // y[n] = silu(gate[n]) * up[n]; y may alias gate or up.
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* y) = 0;
  // y[n] = g * sigmoid(alpha * g) * (clamp(up[n], -limit, limit) + 1), g = min(gate[n], limit):
  // gpt-oss's clamped SwiGLU; y may alias gate or up.
  virtual void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit,
                          float* y) = 0;
  // y[n] = gelu(gate[n]) * up[n] (GeGLU), gelu in its tanh form:
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); y may alias gate or up.
  virtual void gelu_mul(const float* gate, const float* up, int64_t n, float* y) = 0;
  // y[n] = gelu(x[n]) in its exact form, 0.5 x (1 + erf(x / sqrt(2))) (BERT's); y may alias x.
  virtual void gelu(const float* x, int64_t n, float* y) = 0;
  // x[n] *= s in place.
  virtual void scale(float* x, int64_t n, float s) = 0;
  // x[n] = cap * tanh(x[n] / cap) in place (logit soft-capping), cap > 0.
  virtual void softcap(float* x, int64_t n, float cap) = 0;
  // x[r, :] = softmax(x[r, :]) in place, x [n_rows, n_cols].
  virtual void softmax(float* x, int64_t n_rows, int64_t n_cols) = 0;
  // y[ids[i], :] += scales[i] * x[i, :] for i = 0 .. n_ids - 1 in that order (a row of y named
  // twice accumulates in order of i); x [n_ids, n_cols], y [*, n_cols]; ids and scales are host
  // tables. Mixture-of-experts layers scatter each expert's weighted rows back with it.
  virtual void add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids,
                               int64_t n_cols, float* y) = 0;
  // Writes k, v [n_rows, n_kv_dim] (f32, n_kv_dim = n_head_kv * head_dim) into the cache slots of
  // positions[n_rows], converted to kv.type (q8_0: n_kv_dim a multiple of 32, quantized exactly
  // as quantize_row_q8_0).
  virtual void store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim,
                        const float* k, const float* v) = 0;
  // Copies the K and V of slots [0, n_slots) of cache block src_block into the same slots of
  // block dst_block (another block), every kv head, in one layer's cache `kv` (its block_table
  // is not read: the ids are the cache's own). Recorded in order with the other ops. The rows a
  // new sequence shares with a partly filled cached block reach it this way (copy on write).
  virtual void copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) = 0;
  // out[n_rows, n_head * head_dim] = causal attention of q[n_rows, n_head * head_dim] over the
  // cached keys/values at positions 0..positions[r] of `kv` (f16, or q8_0 with head_dim a
  // multiple of 32), accumulated in f32.
  virtual void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                         const AttentionParams& params, float* out) = 0;

 protected:
  friend class Buffer;
  // Frees memory alloc() returned.
  virtual void free_buffer(void* data, size_t n_bytes) = 0;
};

// The registry of the backends compiled into this build (backend_registry.cpp is the one file,
// besides CMake, that knows which those are).
// A backend by device name: "cpu", "vulkan" (device 0) or "vulkan:N", or "auto": the first
// usable GPU (a Vulkan device that is not a CPU emulation), else the CPU. n_threads <= 0 picks
// the CPU's default. Throws Unsupported, saying why, for a device this build or machine lacks.
std::unique_ptr<Backend> make_backend(std::string_view name, int n_threads = 0);
std::vector<std::string> available_backends();
// Every device of the compiled-in backends (the CPU first); `notes` gets one line per backend
// that has none to offer, saying why (not built in, no loader, no driver).
std::vector<BackendDevice> list_devices(std::vector<std::string>* notes);

}  // namespace ember
