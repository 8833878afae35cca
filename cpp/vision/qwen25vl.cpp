// vision/qwen25vl.cpp: Qwen2.5-VL's image encoder (clip.projector_type "qwen2.5vl_merger") — a
// ViT over 14x14 patches of an image at its own (dynamic) resolution: the patch embedding (the
// Conv3d's two temporal kernels applied to the one frame, added), pre-RMSNorm blocks of
// attention with 2-D RoPE (heads' pair i < head_dim/4 turned by the patch's row, the next
// head_dim/4 by its column) and a SwiGLU MLP with biases, window attention in most blocks and full
// attention in every n_wa_pattern-th, then the merger: RMSNorm, each 2x2 patches concatenated,
// an MLP (exact GELU) into the language model's width. Every op runs on the language model's
// backend; the patch and window orders are host tables.
//
// Orders, as transformers' Qwen2_5_VisionTransformerPretrainedModel computes them: patches are
// laid out merged-block major (the 2x2 patches of merged token (by, bx) consecutive, row-major
// within), merged tokens then regrouped window by window (windows of window_size pixels, i.e.
// window_size / patch / merge merged tokens a side, row-major; the image's edge windows smaller).
// A windowed block attends within each window's consecutive rows, a full block over all; the
// merger's outputs come back to merged row-major order at the end.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "vision/vision_model.h"

namespace ember {

namespace {

// llama.cpp's limits for Qwen2-VL-family images (clip.cpp: set_limit_image_tokens(8, 4096)),
// in merged tokens; a file's clip.vision.image_min_pixels / image_max_pixels override them.
constexpr int64_t kMinTokens = 8;
constexpr int64_t kMaxTokens = 4096;
constexpr int64_t kDefaultWindow = 112;  // pixels; what llama.cpp assumes and the checkpoints use

struct QwenVitLayer {
  WeightTensor ln1, ln2;        // [n_embd] RMSNorm weights
  WeightTensor wq, wk, wv, wo;  // {n_embd, n_embd}
  WeightTensor bq, bk, bv, bo;  // [n_embd]
  WeightTensor gate, up;        // {n_embd, n_ff}
  WeightTensor gate_b, up_b;    // [n_ff]
  WeightTensor down, down_b;    // {n_ff, n_embd}, [n_embd]
  bool full_attention = false;  // else windowed
};

class Qwen25VLTower : public VisionTower {
 public:
  explicit Qwen25VLTower(const VisionModel& model);

  std::array<int64_t, 2> preprocessed_size(int64_t width, int64_t height) const override;
  int64_t n_tokens(int64_t width, int64_t height) const override {
    return (width / unit_) * (height / unit_);
  }
  void encode(const float* pixels, int64_t width, int64_t height, float* out) override;

 private:
  // Sizes the scratch for n patches (grows only).
  void reserve(int64_t n);
  // The window order of the merged tokens of a gh x gw merged grid: order[i] is the merged
  // row-major index of the i-th merged token the tower processes; window_ends the exclusive end
  // (in merged tokens) of each window.
  void window_order(int64_t gh, int64_t gw);

  const VisionConfig& c_;
  Backend& be_;
  VisionBinder bind_;
  int64_t merge_ = 2;   // patches per side of one merged token
  int64_t unit_ = 28;   // pixels per side of one merged token: patch * merge
  int64_t window_ = 2;  // merged tokens per side of one attention window
  int64_t min_pixels_ = 0, max_pixels_ = 0;
  std::vector<float> inv_freq_h_, inv_freq_w_;  // [head_dim / 2] the 2-D RoPE's, others' pairs 0

  WeightTensor patch0, patch1;  // {3 * patch², n_embd}: the Conv3d's kernels of frames 0 and 1
  std::vector<QwenVitLayer> layers;
  WeightTensor post_ln;     // [n_embd] the merger's ln_q
  WeightTensor mm0, mm0_b;  // {4 n_embd, 4 n_embd}, [4 n_embd]
  WeightTensor mm2, mm2_b;  // {4 n_embd, n_embd_out}, [n_embd_out]

  // Scratch for the largest image so far (n patches).
  int64_t n_reserved_ = 0;
  Buffer patches_;                   // f32 [n, 3 * patch²]
  Buffer x_, h_, q_, k_, v_, attn_;  // f32 [n, n_embd]
  Buffer gate_, up_;                 // f32 [n, n_ff]
  Buffer kv_k_, kv_v_;               // f16 [n_head][n][head_dim]: one block holding every key
  Buffer merged_;                    // f32 [n / 4, 4 n_embd]
  Buffer y_, y_ordered_;             // f32 [n / 4, n_embd_out]
  std::vector<int32_t> order_, window_ends_, inverse_;  // merged-token tables (window_order)
  std::vector<int32_t> pos_h_, pos_w_;                  // [n] each processed patch's row and column
  std::vector<int32_t> key_pos_, bounds_;               // [n] 0 .. n - 1; a window's rows' last key
  std::vector<float> host_;
};

Qwen25VLTower::Qwen25VLTower(const VisionModel& model)
    : c_(model.config()), be_(model.backend()), bind_(model.file(), model.backend()) {
  const GGUFFile& f = model.file();
  const std::string where = cat("[vision] ", f.path(), ": ");
  if (c_.spatial_merge_size > 0) merge_ = c_.spatial_merge_size;
  unit_ = c_.patch_size * merge_;
  const int64_t window_px = f.get_int("clip.vision.window_size", kDefaultWindow);
  window_ = window_px / unit_;
  const int64_t n_wa_pattern = f.get_int("clip.vision.n_wa_pattern", 0);
  const int64_t hd = c_.head_dim();
  if (merge_ != 2 || window_ <= 0 || window_px % unit_ != 0 || n_wa_pattern < 0 || hd % 4 != 0) {
    throw FormatError(cat(where, "spatial_merge_size ", merge_, " (2 expected), window_size ", window_px,
                          " (a positive multiple of ", unit_, "), n_wa_pattern ", n_wa_pattern,
                          " (>= 0) and head size ", hd,
                          " (a multiple of 4) do not describe a Qwen2.5-VL tower"));
  }
  min_pixels_ = f.get_int("clip.vision.image_min_pixels", kMinTokens * unit_ * unit_);
  max_pixels_ = f.get_int("clip.vision.image_max_pixels", kMaxTokens * unit_ * unit_);
  if (min_pixels_ <= 0 || max_pixels_ < min_pixels_) {
    throw FormatError(cat(where, "image_min_pixels ", min_pixels_, " and image_max_pixels ", max_pixels_,
                          " must be > 0 and ordered"));
  }
  if (!be_.supports(Op::gelu, DType::f32) || !be_.supports(Op::attention, DType::f16)) {
    throw Unsupported(cat(where, "the qwen2.5vl encoder needs the gelu and attention ops, which the ",
                          be_.name(), " backend lacks"));
  }
  // 2-D RoPE: inv_freq[j] = 10000^(-2j / (head_dim/2)) for j < head_dim/4, as transformers'
  // axial rope; pair j is turned by the row, pair head_dim/4 + j by the column. Two NeoX rope
  // passes, each with the other half's frequencies 0 (a rotation by 0 is exactly the identity),
  // compose to it.
  const int64_t quarter = hd / 4;
  inv_freq_h_.assign(static_cast<size_t>(hd / 2), 0.0f);
  inv_freq_w_.assign(static_cast<size_t>(hd / 2), 0.0f);
  for (int64_t j = 0; j < quarter; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(hd / 2);
    const float inv = 1.0f / std::pow(10000.0f, exponent);
    inv_freq_h_[j] = inv;
    inv_freq_w_[quarter + j] = inv;
  }

  const int64_t d = c_.n_embd, ff = c_.n_ff, n_in = 3 * c_.patch_size * c_.patch_size;
  patch0 = bind_.matmul("v.patch_embd.weight", n_in, d);
  patch1 = bind_.matmul("v.patch_embd.weight.1", n_in, d);
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    const std::string b = cat("v.blk.", il, ".");
    QwenVitLayer& l = layers.emplace_back();
    l.ln1 = bind_.f32(b + "ln1.weight", d);
    l.ln2 = bind_.f32(b + "ln2.weight", d);
    l.wq = bind_.matmul(b + "attn_q.weight", d, d);
    l.wk = bind_.matmul(b + "attn_k.weight", d, d);
    l.wv = bind_.matmul(b + "attn_v.weight", d, d);
    l.wo = bind_.matmul(b + "attn_out.weight", d, d);
    l.bq = bind_.f32(b + "attn_q.bias", d);
    l.bk = bind_.f32(b + "attn_k.bias", d);
    l.bv = bind_.f32(b + "attn_v.bias", d);
    l.bo = bind_.f32(b + "attn_out.bias", d);
    l.gate = bind_.matmul(b + "ffn_gate.weight", d, ff);
    l.gate_b = bind_.f32(b + "ffn_gate.bias", ff);
    l.up = bind_.matmul(b + "ffn_up.weight", d, ff);
    l.up_b = bind_.f32(b + "ffn_up.bias", ff);
    l.down = bind_.matmul(b + "ffn_down.weight", ff, d);
    l.down_b = bind_.f32(b + "ffn_down.bias", d);
    l.full_attention = n_wa_pattern == 0 || (il + 1) % n_wa_pattern == 0;
  }
  post_ln = bind_.f32("v.post_ln.weight", d);
  mm0 = bind_.matmul("mm.0.weight", 4 * d, 4 * d);
  mm0_b = bind_.f32("mm.0.bias", 4 * d);
  mm2 = bind_.matmul("mm.2.weight", 4 * d, c_.n_embd_out);
  mm2_b = bind_.f32("mm.2.bias", c_.n_embd_out);
}

// transformers' smart_resize (Qwen2VLImageProcessor): each side rounded to whole merged tokens
// (Python's round: ties to even), then scaled as a whole into [min_pixels, max_pixels] keeping
// the aspect ratio.
std::array<int64_t, 2> Qwen25VLTower::preprocessed_size(int64_t width, int64_t height) const {
  const double f = static_cast<double>(unit_);
  const double w = static_cast<double>(width), h = static_cast<double>(height);
  if (std::max(w, h) / std::min(w, h) > 200.0) {
    throw InvalidArgument(cat("[vision] an image of ", width, "x", height,
                              " has an aspect ratio over 200, which Qwen2.5-VL does not take"));
  }
  // A side under half a token rounds to 0 here, leaving the area under min_pixels: scaled up below.
  auto round_to = [&](double x) { return static_cast<int64_t>(std::nearbyint(x / f)) * unit_; };
  int64_t w_bar = round_to(w), h_bar = round_to(h);
  if (w_bar * h_bar > max_pixels_) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels_));
    w_bar = std::max(unit_, static_cast<int64_t>(std::floor(w / beta / f)) * unit_);
    h_bar = std::max(unit_, static_cast<int64_t>(std::floor(h / beta / f)) * unit_);
  } else if (w_bar * h_bar < min_pixels_) {
    const double beta = std::sqrt(static_cast<double>(min_pixels_) / (h * w));
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * unit_;
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * unit_;
  }
  return {w_bar, h_bar};
}

void Qwen25VLTower::reserve(int64_t n) {
  if (n <= n_reserved_) return;
  const int64_t d = c_.n_embd, n_in = 3 * c_.patch_size * c_.patch_size;
  auto f32s = [&](int64_t count) { return be_.alloc(static_cast<size_t>(count) * sizeof(float)); };
  patches_ = f32s(n * n_in);
  x_ = f32s(n * d);
  h_ = f32s(n * d);
  q_ = f32s(n * d);
  k_ = f32s(n * d);
  v_ = f32s(n * d);
  attn_ = f32s(n * d);
  gate_ = f32s(n * c_.n_ff);
  up_ = f32s(n * c_.n_ff);
  const size_t kv_bytes = static_cast<size_t>(row_bytes(DType::f16, c_.head_dim()) * c_.n_head * n);
  kv_k_ = be_.alloc(kv_bytes);
  kv_v_ = be_.alloc(kv_bytes);
  merged_ = f32s(n * d);
  y_ = f32s(n / 4 * c_.n_embd_out);
  y_ordered_ = f32s(n / 4 * c_.n_embd_out);
  be_.reserve_matmul(n, std::max({4 * d, c_.n_ff, n_in}));
  n_reserved_ = n;
}

void Qwen25VLTower::window_order(int64_t gh, int64_t gw) {
  order_.clear();
  window_ends_.clear();
  for (int64_t wy = 0; wy < gh; wy += window_) {
    for (int64_t wx = 0; wx < gw; wx += window_) {
      for (int64_t y = wy; y < std::min(gh, wy + window_); ++y) {
        for (int64_t x = wx; x < std::min(gw, wx + window_); ++x)
          order_.push_back(static_cast<int32_t>(y * gw + x));
      }
      window_ends_.push_back(static_cast<int32_t>(order_.size()));
    }
  }
  inverse_.assign(order_.size(), 0);
  for (size_t i = 0; i < order_.size(); ++i) inverse_[order_[i]] = static_cast<int32_t>(i);
}

void Qwen25VLTower::encode(const float* pixels, int64_t width, int64_t height, float* out) {
  const int64_t d = c_.n_embd, ps = c_.patch_size, n_in = 3 * ps * ps, ff = c_.n_ff, hd = c_.head_dim();
  const int64_t gh = height / unit_, gw = width / unit_, n_tok = gh * gw, n = 4 * n_tok;
  reserve(n);
  window_order(gh, gw);

  // --- patches [n, 3 * ps²] in processing order: merged token order_[t]'s 2x2 patches at rows
  // 4t .. 4t + 3, each patch's values in the conv kernel's order (channel, y, x) ---
  host_.resize(static_cast<size_t>(n * n_in));
  pos_h_.resize(static_cast<size_t>(n));
  pos_w_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t by = order_[t] / gw, bx = order_[t] % gw;
    for (int64_t s = 0; s < 4; ++s) {
      const int64_t py = 2 * by + s / 2, px = 2 * bx + s % 2, row = 4 * t + s;
      pos_h_[row] = static_cast<int32_t>(py);
      pos_w_[row] = static_cast<int32_t>(px);
      float* dst = host_.data() + row * n_in;
      for (int64_t ch = 0; ch < 3; ++ch) {
        for (int64_t y = 0; y < ps; ++y) {
          const float* src = pixels + (ch * height + (py * ps + y)) * width + px * ps;
          std::copy(src, src + ps, dst + (ch * ps + y) * ps);
        }
      }
    }
  }
  be_.upload(patches_, 0, host_.data(), host_.size() * sizeof(float));
  key_pos_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) key_pos_[i] = static_cast<int32_t>(i);
  bounds_.resize(static_cast<size_t>(n));

  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();

  // --- patch embedding: x = W0 · p + W1 · p (the frame is both temporal frames) ---
  be_.matmul(patch0.type, patch0.data, n_in, d, patches_.as<float>(), n, x);
  be_.matmul(patch1.type, patch1.data, n_in, d, patches_.as<float>(), n, h);
  be_.add(x, h, n * d, x);

  RopeParams rope_h, rope_w;
  rope_h.layout = rope_w.layout = RopeLayout::neox;
  rope_h.n_rot = rope_w.n_rot = hd;
  rope_h.inv_freq = inv_freq_h_.data();
  rope_w.inv_freq = inv_freq_w_.data();

  KVView kv;
  kv.type = DType::f16;
  kv.n_head_kv = c_.n_head;
  kv.head_bytes = row_bytes(DType::f16, hd);
  kv.block_size = n;  // one block of every patch, no table
  AttentionParams params;
  params.n_head = params.n_head_kv = c_.n_head;
  params.head_dim = hd;
  params.scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (const QwenVitLayer& l : layers) {
    // --- attention: x += wo · attention(rope(q), rope(k), v) + bo of h = ln1(x) ---
    be_.rms_norm(x, l.ln1.f32(), n, d, c_.eps, h);
    const MatmulOut qkv[] = {l.wq.into(q), l.wk.into(k), l.wv.into(v)};
    be_.matmul_many(qkv, 3, d, h, n);
    be_.add_bias(q, l.bq.f32(), n, d);
    be_.add_bias(k, l.bk.f32(), n, d);
    be_.add_bias(v, l.bv.f32(), n, d);
    for (float* t : {q, k}) {
      be_.rope(t, n, c_.n_head, hd, pos_h_.data(), rope_h);
      be_.rope(t, n, c_.n_head, hd, pos_w_.data(), rope_w);
    }
    kv.k = kv_k_.as<uint8_t>();
    kv.v = kv_v_.as<uint8_t>();
    be_.store_kv(kv, key_pos_.data(), n, d, k, v);
    if (l.full_attention) {
      std::fill(bounds_.begin(), bounds_.end(), static_cast<int32_t>(n - 1));
      be_.attention(q, bounds_.data(), n, kv, params, attn);
    } else {
      // Each window's rows see the keys of its own rows only: the view starts at the window's
      // first patch, and every row's bound is the window's last.
      int64_t begin = 0;
      for (int32_t end_tok : window_ends_) {
        const int64_t end = 4 * int64_t{end_tok}, rows = end - begin;
        KVView window = kv;
        window.k = kv.k + begin * kv.head_bytes;
        window.v = kv.v + begin * kv.head_bytes;
        std::fill(bounds_.begin() + begin, bounds_.begin() + end, static_cast<int32_t>(rows - 1));
        be_.attention(q + begin * d, bounds_.data() + begin, rows, window, params, attn + begin * d);
        begin = end;
      }
    }
    be_.matmul(l.wo.type, l.wo.data, d, d, attn, n, h);
    be_.add_bias(h, l.bo.f32(), n, d);
    be_.add(x, h, n * d, x);

    // --- MLP: x += down(silu(gate(h) + bg) * (up(h) + bu)) + bd of h = ln2(x) ---
    be_.rms_norm(x, l.ln2.f32(), n, d, c_.eps, h);
    const MatmulOut gu[] = {l.gate.into(gate), l.up.into(up)};
    be_.matmul_many(gu, 2, d, h, n);
    be_.add_bias(gate, l.gate_b.f32(), n, ff);
    be_.add_bias(up, l.up_b.f32(), n, ff);
    be_.silu_mul(gate, up, n * ff, gate);
    be_.matmul(l.down.type, l.down.data, ff, d, gate, n, h);
    be_.add_bias(h, l.down_b.f32(), n, d);
    be_.add(x, h, n * d, x);
  }

  // --- merger: rows of 4 consecutive normed patches (one merged token) [n_tok, 4 d], then
  // mm.2 · gelu(mm.0 · m + b0) + b2, back in merged row-major order ---
  float* m = merged_.as<float>();
  be_.rms_norm(x, post_ln.f32(), n, d, c_.eps, m);
  be_.matmul(mm0.type, mm0.data, 4 * d, 4 * d, m, n_tok, h);
  be_.add_bias(h, mm0_b.f32(), n_tok, 4 * d);
  be_.gelu(h, n_tok * 4 * d, h);
  be_.matmul(mm2.type, mm2.data, 4 * d, c_.n_embd_out, h, n_tok, y_.as<float>());
  be_.add_bias(y_.as<float>(), mm2_b.f32(), n_tok, c_.n_embd_out);
  be_.get_rows(DType::f32, y_.as<float>(), c_.n_embd_out, inverse_.data(), n_tok, y_ordered_.as<float>());
  be_.download(y_ordered_, 0, out, static_cast<size_t>(n_tok * c_.n_embd_out) * sizeof(float));
}

}  // namespace

std::unique_ptr<VisionTower> make_qwen25vl_tower(const VisionModel& model) {
  return std::make_unique<Qwen25VLTower>(model);
}

}  // namespace ember
