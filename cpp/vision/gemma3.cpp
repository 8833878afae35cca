// vision/gemma3.cpp: Gemma 3's image encoder (clip.projector_type "gemma3") — a SigLIP vision
// transformer (patch embedding, learned position embeddings, pre-LayerNorm blocks of full
// bidirectional attention and a tanh-gelu MLP, a final LayerNorm) and the Gemma 3 multimodal
// projector (average pooling of n_merge x n_merge patches into one token, an RMSNorm, a linear
// map into the language model's width). Every op runs on the language model's backend.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "vision/vision_model.h"

namespace ember {

namespace {

// The MLP runs on at most this many rows at a time, so that gelu's factor of ones (gelu_mul of
// the pre-activation and 1: the tanh gelu, which every backend has) stays small.
constexpr int64_t kMlpRows = 512;

struct SiglipLayer {
  WeightTensor ln1_w, ln1_b;  // [n_embd] f32
  WeightTensor wq, wk, wv;    // {n_embd, n_embd}
  WeightTensor bq, bk, bv;    // [n_embd] f32
  WeightTensor wo, bo;        // {n_embd, n_embd}, [n_embd]
  WeightTensor ln2_w, ln2_b;  // [n_embd]
  WeightTensor up, up_b;      // {n_embd, n_ff} (fc1), [n_ff]
  WeightTensor down, down_b;  // {n_ff, n_embd} (fc2), [n_embd]
};

class Gemma3Tower : public VisionTower {
 public:
  explicit Gemma3Tower(const VisionModel& model);

  std::array<int64_t, 2> preprocessed_size(int64_t, int64_t) const override {
    return {c_.image_size, c_.image_size};
  }
  int64_t n_tokens(int64_t, int64_t) const override { return n_tokens_side_ * n_tokens_side_; }
  void encode(const float* pixels, int64_t width, int64_t height, float* out) override;
  bool image_attends_both_ways() const override { return true; }

 private:
  const VisionConfig& c_;
  Backend& be_;
  VisionBinder bind_;
  int64_t n_side_ = 0;         // patches per side
  int64_t n_patches_ = 0;      // n_side_²
  int64_t n_merge_ = 4;        // patches per side pooled into one token
  int64_t n_tokens_side_ = 0;  // n_side_ / n_merge_

  WeightTensor patch_w, patch_b;  // {3 * patch², n_embd} (the conv kernel), [n_embd]
  WeightTensor pos;               // [n_patches, n_embd] f32
  std::vector<SiglipLayer> layers;
  WeightTensor post_w, post_b;  // [n_embd] the final LayerNorm
  WeightTensor soft_norm;       // [n_embd] mm.soft_emb_norm (Gemma's 1 + w, as llama.cpp writes it)
  WeightTensor proj;            // {n_embd, n_embd_out} mm.input_projection, transposed at load

  // Scratch, sized at load for one image.
  Buffer patches_;                // f32 [n_patches, 3 * patch²]
  Buffer x_;                      // f32 [n_patches, n_embd] residual stream
  Buffer h_;                      // f32 [n_patches, n_embd] normed input, then a block's output
  Buffer q_, k_, v_, attn_;       // f32 [n_patches, n_embd]
  Buffer ff_;                     // f32 [kMlpRows, n_ff]
  Buffer ones_;                   // f32 [kMlpRows, n_ff] of 1
  Buffer kv_k_, kv_v_;            // f16 [n_head][n_patches][head_dim]: one block holding every key
  Buffer pooled_;                 // f32 [n_tokens, n_embd]
  Buffer y_;                      // f32 [n_tokens, n_embd_out]
  std::vector<int32_t> bounds_;   // [n_patches] every row sees every key: n_patches - 1
  std::vector<int32_t> key_pos_;  // [n_patches] 0 .. n_patches - 1
  std::vector<float> host_;       // host staging: patches, then the states to pool
};

Gemma3Tower::Gemma3Tower(const VisionModel& model)
    : c_(model.config()), be_(model.backend()), bind_(model.file(), model.backend()) {
  const std::string where = cat("[vision] ", model.file().path(), ": ");
  if (c_.image_size % c_.patch_size != 0) {
    throw FormatError(
        cat(where, "image_size ", c_.image_size, " is not a multiple of patch_size ", c_.patch_size));
  }
  n_side_ = c_.image_size / c_.patch_size;
  n_patches_ = n_side_ * n_side_;
  if (c_.n_merge > 0) n_merge_ = c_.n_merge;
  if (n_side_ % n_merge_ != 0) {
    throw FormatError(cat(where, n_side_, " patches per side do not pool by ", n_merge_));
  }
  n_tokens_side_ = n_side_ / n_merge_;
  for (Op op : {Op::layer_norm, Op::gelu_mul, Op::attention}) {
    if (!be_.supports(op, op == Op::attention ? DType::f16 : DType::f32)) {
      throw Unsupported(cat(where, "the gemma3 encoder needs the ", op_name(op), " op, which the ",
                            be_.name(), " backend lacks"));
    }
  }
  const int64_t d = c_.n_embd, n_in = 3 * c_.patch_size * c_.patch_size;
  patch_w = bind_.matmul("v.patch_embd.weight", n_in, d);
  patch_b = bind_.f32("v.patch_embd.bias", d);
  pos = bind_.f32("v.position_embd.weight", n_patches_ * d);
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    const std::string b = cat("v.blk.", il, ".");
    SiglipLayer& l = layers.emplace_back();
    l.ln1_w = bind_.f32(b + "ln1.weight", d);
    l.ln1_b = bind_.f32(b + "ln1.bias", d);
    l.wq = bind_.matmul(b + "attn_q.weight", d, d);
    l.bq = bind_.f32(b + "attn_q.bias", d);
    l.wk = bind_.matmul(b + "attn_k.weight", d, d);
    l.bk = bind_.f32(b + "attn_k.bias", d);
    l.wv = bind_.matmul(b + "attn_v.weight", d, d);
    l.bv = bind_.f32(b + "attn_v.bias", d);
    l.wo = bind_.matmul(b + "attn_out.weight", d, d);
    l.bo = bind_.f32(b + "attn_out.bias", d);
    l.ln2_w = bind_.f32(b + "ln2.weight", d);
    l.ln2_b = bind_.f32(b + "ln2.bias", d);
    l.up = bind_.matmul(b + "ffn_up.weight", d, c_.n_ff);
    l.up_b = bind_.f32(b + "ffn_up.bias", c_.n_ff);
    l.down = bind_.matmul(b + "ffn_down.weight", c_.n_ff, d);
    l.down_b = bind_.f32(b + "ffn_down.bias", d);
  }
  post_w = bind_.f32("v.post_ln.weight", d);
  post_b = bind_.f32("v.post_ln.bias", d);
  soft_norm = bind_.f32("mm.soft_emb_norm.weight", d);
  proj = bind_.matmul_transposed("mm.input_projection.weight", d, c_.n_embd_out);

  const int64_t n = n_patches_, n_tok = n_tokens_side_ * n_tokens_side_;
  auto f32s = [&](int64_t count) { return be_.alloc(static_cast<size_t>(count) * sizeof(float)); };
  patches_ = f32s(n * n_in);
  x_ = f32s(n * d);
  h_ = f32s(n * d);
  q_ = f32s(n * d);
  k_ = f32s(n * d);
  v_ = f32s(n * d);
  attn_ = f32s(n * d);
  const int64_t mlp_rows = std::min(n, kMlpRows);
  ff_ = f32s(mlp_rows * c_.n_ff);
  ones_ = f32s(mlp_rows * c_.n_ff);
  const std::vector<float> ones(static_cast<size_t>(mlp_rows * c_.n_ff), 1.0f);
  be_.upload(ones_, 0, ones.data(), ones.size() * sizeof(float));
  const size_t kv_bytes = static_cast<size_t>(row_bytes(DType::f16, c_.head_dim()) * c_.n_head * n);
  kv_k_ = be_.alloc(kv_bytes);
  kv_v_ = be_.alloc(kv_bytes);
  pooled_ = f32s(n_tok * d);
  y_ = f32s(n_tok * c_.n_embd_out);
  bounds_.assign(static_cast<size_t>(n), static_cast<int32_t>(n - 1));
  key_pos_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) key_pos_[i] = static_cast<int32_t>(i);
  be_.reserve_matmul(n, std::max(c_.n_ff, n_in));
}

void Gemma3Tower::encode(const float* pixels, int64_t width, int64_t height, float* out) {
  const int64_t d = c_.n_embd, ps = c_.patch_size, n = n_patches_, n_in = 3 * ps * ps;
  // --- patches [n, 3 * ps * ps]: patch (gy, gx) is row gy * n_side + gx, its values in the conv
  // kernel's order (channel, y, x) ---
  host_.resize(static_cast<size_t>(n * n_in));
  for (int64_t gy = 0; gy < n_side_; ++gy) {
    for (int64_t gx = 0; gx < n_side_; ++gx) {
      float* row = host_.data() + (gy * n_side_ + gx) * n_in;
      for (int64_t ch = 0; ch < 3; ++ch) {
        for (int64_t y = 0; y < ps; ++y) {
          const float* src = pixels + (ch * height + (gy * ps + y)) * width + gx * ps;
          std::copy(src, src + ps, row + (ch * ps + y) * ps);
        }
      }
    }
  }
  be_.upload(patches_, 0, host_.data(), host_.size() * sizeof(float));
  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();

  // --- embeddings: x = conv(patches) + bias + position embedding ---
  be_.matmul(patch_w.type, patch_w.data, n_in, d, patches_.as<float>(), n, x);
  be_.add_bias(x, patch_b.f32(), n, d);
  be_.add(x, pos.f32(), n * d, x);

  KVView kv;
  kv.type = DType::f16;
  kv.k = kv_k_.as<uint8_t>();
  kv.v = kv_v_.as<uint8_t>();
  kv.n_head_kv = c_.n_head;
  kv.head_bytes = row_bytes(DType::f16, c_.head_dim());
  kv.block_size = n;  // one block, no table
  AttentionParams params;
  params.n_head = params.n_head_kv = c_.n_head;
  params.head_dim = c_.head_dim();
  params.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim()));

  for (const SiglipLayer& l : layers) {
    // --- attention: x += out(attention(q, k, v) of ln1(x)), every patch seeing every patch ---
    be_.layer_norm(x, l.ln1_w.f32(), l.ln1_b.f32(), n, d, c_.eps, h);
    const MatmulOut qkv[] = {l.wq.into(q), l.wk.into(k), l.wv.into(v)};
    be_.matmul_many(qkv, 3, d, h, n);
    be_.add_bias(q, l.bq.f32(), n, d);
    be_.add_bias(k, l.bk.f32(), n, d);
    be_.add_bias(v, l.bv.f32(), n, d);
    be_.store_kv(kv, key_pos_.data(), n, d, k, v);
    be_.attention(q, bounds_.data(), n, kv, params, attn);
    be_.matmul(l.wo.type, l.wo.data, d, d, attn, n, h);
    be_.add_bias(h, l.bo.f32(), n, d);
    be_.add(x, h, n * d, x);

    // --- MLP: x += fc2(gelu_tanh(fc1(ln2(x)))) ---
    be_.layer_norm(x, l.ln2_w.f32(), l.ln2_b.f32(), n, d, c_.eps, h);
    float* ff = ff_.as<float>();
    for (int64_t r = 0; r < n; r += kMlpRows) {
      const int64_t rows = std::min(kMlpRows, n - r);
      be_.matmul(l.up.type, l.up.data, d, c_.n_ff, h + r * d, rows, ff);
      be_.add_bias(ff, l.up_b.f32(), rows, c_.n_ff);
      be_.gelu_mul(ff, ones_.as<float>(), rows * c_.n_ff, ff);
      be_.matmul(l.down.type, l.down.data, c_.n_ff, d, ff, rows, q + r * d);
    }
    be_.add_bias(q, l.down_b.f32(), n, d);
    be_.add(x, q, n * d, x);
  }
  be_.layer_norm(x, post_w.f32(), post_b.f32(), n, d, c_.eps, x);

  // --- projector: token (ty, tx) = the mean of its n_merge x n_merge patches (on the host: a
  // pooling the ops lack), then RMSNorm and the linear map into the language model's width ---
  host_.resize(static_cast<size_t>(n * d));
  be_.download(x_, 0, host_.data(), static_cast<size_t>(n * d) * sizeof(float));
  const int64_t n_tok = n_tokens_side_ * n_tokens_side_;
  std::vector<float> pooled(static_cast<size_t>(n_tok * d), 0.0f);
  const float inv = 1.0f / static_cast<float>(n_merge_ * n_merge_);
  for (int64_t gy = 0; gy < n_side_; ++gy) {
    for (int64_t gx = 0; gx < n_side_; ++gx) {
      const float* src = host_.data() + (gy * n_side_ + gx) * d;
      float* dst = pooled.data() + ((gy / n_merge_) * n_tokens_side_ + gx / n_merge_) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] += src[i];
    }
  }
  for (float& p : pooled) p *= inv;
  be_.upload(pooled_, 0, pooled.data(), pooled.size() * sizeof(float));
  float* pl = pooled_.as<float>();
  be_.rms_norm(pl, soft_norm.f32(), n_tok, d, c_.eps, pl);
  be_.matmul(proj.type, proj.data, d, c_.n_embd_out, pl, n_tok, y_.as<float>());
  be_.download(y_, 0, out, static_cast<size_t>(n_tok * c_.n_embd_out) * sizeof(float));
}

}  // namespace

std::unique_ptr<VisionTower> make_gemma3_tower(const VisionModel& model) {
  return std::make_unique<Gemma3Tower>(model);
}

}  // namespace ember
