// Attention over few keys for a CPU training step: softmax(scale * q k^T, masked) v, forward and backward,
// each in one pass per (sentence, head).
//
// Spelled out in torch ops, a training step's attention over 10-30 keys is about a dozen operators per layer: the
// head-major copies that batched matmuls need, the two products, the scaling, the mask, the softmax, the copy back
// to (B, T, H * Dv), and twice that backward. Each is a pass over memory with little arithmetic; here the rows of one
// (sentence, head) stay in the first-level cache from the scores to the output.
//
// Layouts: q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv) with any strides but a contiguous last dimension (the
// views of a fused projection's output); ``allowed`` (B, K) bool, True = attend, or none; ``causal`` lets query t
// see keys 0..t (T == K). The forward returns the output (B, T, H * Dv), ready for the output projection, and the
// attention weights (B, H, T, K) that the backward reads. Every query row must keep at least one key (the callers'
// masks guarantee it, as for SDPA).
//
// The loops have no branches in their inner dimension so that the compiler vectorises them (-O3 -march=native);
// exp is Cephes' single-precision polynomial, which the compiler vectorises where the C library's expf stays scalar.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// 16 floats: one AVX-512 register, or two AVX2 / four SSE registers where the compiler splits it.
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));  // unaligned loads and stores

inline v16 load(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store(float* p, v16 x) { *reinterpret_cast<v16u*>(p) = x; }
inline float hsum(v16 x) {
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += x[j];
  return s;
}
inline float hmax(v16 x) {
  float m = x[0];
  for (int j = 1; j < 16; ++j) m = std::max(m, x[j]);
  return m;
}

// exp(x) for x <= 0 to about 1 ulp (Cephes expf), 16 at a time; x is clamped to [-87, 0], so exp(-inf) gives
// 1.6e-38 (the callers multiply masked keys by 0), never NaN.
inline v16 exp_nonpositive(v16 x) {
  const v16 lo = x - x - 87.0f, zero = x - x;
  x = x < lo ? lo : x;
  x = x > zero ? zero : x;
  const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23
  const v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
  return p * reinterpret_cast<const v16&>(bits);
}

struct View4 {  // a (B, rows, H, d) float tensor's data and strides, in elements
  const float* data;
  int64_t sb, sr, sh;
  explicit View4(const at::Tensor& t) : data(t.data_ptr<float>()), sb(t.stride(0)), sr(t.stride(1)), sh(t.stride(2)) {}
  const float* at(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& allowed,
                  bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "short_attention: q, k, v must be (B, T, H, d)");
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat, "short_attention: float32 CPU tensors only");
    TORCH_CHECK(t->stride(3) == 1, "short_attention: the last dimension must be contiguous");
  }
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "short_attention: batch sizes differ");
  TORCH_CHECK(k.size(2) == q.size(2) && v.size(2) == q.size(2), "short_attention: head counts differ");
  TORCH_CHECK(k.size(3) == q.size(3) && v.size(1) == k.size(1), "short_attention: key shapes differ");
  TORCH_CHECK(q.size(3) % 16 == 0 && v.size(3) % 16 == 0, "short_attention: head sizes must be multiples of 16");
  TORCH_CHECK(k.size(1) >= 1 && k.size(1) <= 64, "short_attention: 1 to 64 keys");
  TORCH_CHECK(!causal || q.size(1) == k.size(1), "short_attention: causal attention needs as many queries as keys");
  if (allowed.has_value()) {
    TORCH_CHECK(allowed->dim() == 2 && allowed->size(0) == q.size(0) && allowed->size(1) == k.size(1),
                "short_attention: allowed must be (B, K)");
  }
}

// rows (Kp of them, zero past K) of a (K, D) block with row stride `sr`, transposed into out (D, Kp)
void transpose_padded(const float* x, int64_t sr, int64_t K, int64_t Kp, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t s = K; s < Kp; ++s) out[d * Kp + s] = 0.0f;
  for (int64_t s = 0; s < K; ++s)
    for (int64_t d = 0; d < D; ++d) out[d * Kp + s] = x[s * sr + d];
}

// One (sentence, head) of the forward: NB blocks of 16 keys.
template <int NB>
void forward_block(const float* qi, int64_t qs, const float* ki, int64_t ks, const float* vi, int64_t vs, const bool* m,
                   bool causal, float sc, int64_t T, int64_t K, int64_t Dk, int64_t Dv, float* probs, float* out,
                   int64_t out_row, float* kt) {
  constexpr int64_t Kp = NB * 16;
  transpose_padded(ki, ks, K, Kp, Dk, kt);
  v16 allowed[NB];  // 1 where the sentence's key may be seen, 0 past K and on padding
  for (int blk = 0; blk < NB; ++blk)
    for (int j = 0; j < 16; ++j) {
      const int64_t s = blk * 16 + j;
      allowed[blk][j] = (s < K && (m == nullptr || m[s])) ? 1.0f : 0.0f;
    }
  for (int64_t t = 0; t < T; ++t) {
    v16 acc[NB] = {};
    const float* qrow = qi + t * qs;
    for (int64_t d = 0; d < Dk; ++d) {
      const float a = qrow[d];
      for (int blk = 0; blk < NB; ++blk) acc[blk] += a * load(kt + d * Kp + blk * 16);
    }
    const int64_t n = causal ? t + 1 : K;  // keys 0..n-1 may be seen
    v16 keep[NB];
    float mx = -std::numeric_limits<float>::infinity();
    for (int blk = 0; blk < NB; ++blk) {
      keep[blk] = allowed[blk];
      if (causal)
        for (int j = 0; j < 16; ++j) keep[blk][j] = blk * 16 + j < n ? keep[blk][j] : 0.0f;
      acc[blk] *= sc;
      const v16 ninf = acc[blk] - acc[blk] - std::numeric_limits<float>::infinity();
      mx = std::max(mx, hmax(keep[blk] != 0.0f ? acc[blk] : ninf));
    }
    v16 sum = {};
    for (int blk = 0; blk < NB; ++blk) {
      acc[blk] = exp_nonpositive(acc[blk] - mx) * keep[blk];
      sum += acc[blk];
    }
    const float inv = 1.0f / hsum(sum);
    float row[Kp];
    for (int blk = 0; blk < NB; ++blk) store(row + blk * 16, acc[blk] * inv);
    std::copy_n(row, K, probs + t * K);
    float* o = out + t * out_row;
    for (int64_t d = 0; d < Dv; d += 16) {
      v16 ov = {};
      for (int64_t s = 0; s < n; ++s) ov += row[s] * load(vi + s * vs + d);
      store(o + d, ov);
    }
  }
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const c10::optional<at::Tensor>& allowed, bool causal, double scale) {
  check_inputs(q, k, v, allowed, causal);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), K = k.size(1), Dv = v.size(3);
  const at::Tensor mask = allowed.has_value() ? allowed->to(at::kBool).contiguous() : at::Tensor();
  const bool* mask_data = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  at::Tensor out = at::empty({B, T, H * Dv}, q.options());
  at::Tensor probs = at::empty({B, H, T, K}, q.options());
  const View4 qv(q), kv(k), vv(v);
  float* out_data = out.data_ptr<float>();
  float* probs_data = probs.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t NB = (K + 15) / 16;

  // One task per sentence, its heads in turn: the sentence's rows of q, k and v are one contiguous block in a fused
  // projection's output, read from memory once and then from the cache.
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(Dk * NB * 16);
    for (int64_t i = begin * H; i < end * H; ++i) {
      const int64_t b = i / H, h = i % H;
      const bool* m = mask_data ? mask_data + b * K : nullptr;
      float* p = probs_data + i * T * K;
      float* o = out_data + b * T * H * Dv + h * Dv;
#define TMT_FORWARD(nb) \
  forward_block<nb>(qv.at(b, h), qv.sr, kv.at(b, h), kv.sr, vv.at(b, h), vv.sr, m, causal, sc, T, K, Dk, Dv, p, o, H * Dv, kt.data())
      switch (NB) {
        case 1: TMT_FORWARD(1); break;
        case 2: TMT_FORWARD(2); break;
        case 3: TMT_FORWARD(3); break;
        default: TMT_FORWARD(4); break;
      }
#undef TMT_FORWARD
    }
  });
  return {out, probs};
}

// One (sentence, head) of the backward: gq and gk rows H * Dk apart, gv rows H * Dv apart. First dS row by row (kept
// in ds, T x Kp), then each gradient row as a sum of rows kept in registers: gq[t] = sum_s dS[t, s] k[s],
// gk[s] = sum_t dS[t, s] q[t], gv[s] = sum_t P[t, s] dO[t].
template <int NB>
void backward_block(const float* go, int64_t go_row, const float* qi, int64_t qs, const float* ki, int64_t ks,
                    const float* vi, int64_t vs, const float* probs, float sc, int64_t T, int64_t K, int64_t Dk, int64_t Dv,
                    float* gq, float* gk, float* gv, int64_t gk_row, int64_t gv_row, float* vt, float* ds) {
  constexpr int64_t Kp = NB * 16;
  transpose_padded(vi, vs, K, Kp, Dv, vt);
  for (int64_t t = 0; t < T; ++t) {
    const float* g = go + t * go_row;  // dO of this query
    float p[Kp];
    std::copy_n(probs + t * K, K, p);
    std::fill(p + K, p + Kp, 0.0f);
    v16 dp[NB] = {};
    for (int64_t d = 0; d < Dv; ++d) {  // dP = dO v^T
      const float a = g[d];
      for (int blk = 0; blk < NB; ++blk) dp[blk] += a * load(vt + d * Kp + blk * 16);
    }
    v16 dot = {};
    for (int blk = 0; blk < NB; ++blk) dot += load(p + blk * 16) * dp[blk];
    const float rowdot = hsum(dot);
    for (int blk = 0; blk < NB; ++blk) store(ds + t * Kp + blk * 16, load(p + blk * 16) * (dp[blk] - rowdot) * sc);
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* w = ds + t * Kp;
    float* row = gq + t * gk_row;
    for (int64_t d = 0; d < Dk; d += 16) {
      v16 a = {};
      for (int64_t s = 0; s < K; ++s) a += w[s] * load(ki + s * ks + d);
      store(row + d, a);
    }
  }
  for (int64_t s = 0; s < K; ++s) {
    float* row_k = gk + s * gk_row;
    float* row_v = gv + s * gv_row;
    for (int64_t d = 0; d < Dk; d += 16) {
      v16 a = {};
      for (int64_t t = 0; t < T; ++t) a += ds[t * Kp + s] * load(qi + t * qs + d);
      store(row_k + d, a);
    }
    for (int64_t d = 0; d < Dv; d += 16) {
      v16 a = {};
      for (int64_t t = 0; t < T; ++t) a += probs[t * K + s] * load(go + t * go_row + d);
      store(row_v + d, a);
    }
  }
}

// Gradients of q, k, v from the output's (B, T, H * Dv), in the layouts (B, T, H, Dk), (B, K, H, Dk), (B, K, H, Dv):
// with P the weights and dP = dO v^T, dS = P * (dP - rowsum(P * dP)); dq = scale dS k, dk = scale dS^T q, dv = P^T dO.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v, const at::Tensor& probs, double scale) {
  check_inputs(q, k, v, c10::nullopt, false);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), K = k.size(1), Dv = v.size(3);
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.numel() == B * T * H * Dv, "short_attention: grad shape");
  TORCH_CHECK(probs.is_contiguous() && probs.numel() == B * H * T * K, "short_attention: weights shape");
  const at::Tensor go = grad_out.contiguous();
  at::Tensor gq = at::empty({B, T, H, Dk}, q.options());
  at::Tensor gk = at::empty({B, K, H, Dk}, q.options());
  at::Tensor gv = at::empty({B, K, H, Dv}, q.options());
  const View4 qv(q), kv(k), vv(v);
  const float* go_data = go.data_ptr<float>();
  const float* probs_data = probs.data_ptr<float>();
  float *gq_data = gq.data_ptr<float>(), *gk_data = gk.data_ptr<float>(), *gv_data = gv.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t NB = (K + 15) / 16;

  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {  // one task per sentence, as in the forward
    std::vector<float> vt(Dv * NB * 16), ds(T * NB * 16);
    for (int64_t i = begin * H; i < end * H; ++i) {
      const int64_t b = i / H, h = i % H;
#define TMT_BACKWARD(nb)                                                                                               \
  backward_block<nb>(go_data + b * T * H * Dv + h * Dv, H * Dv, qv.at(b, h), qv.sr, kv.at(b, h), kv.sr, vv.at(b, h), vv.sr, \
                     probs_data + i * T * K, sc, T, K, Dk, Dv, gq_data + (b * T * H + h) * Dk,                          \
                     gk_data + (b * K * H + h) * Dk, gv_data + (b * K * H + h) * Dv, H * Dk, H * Dv, vt.data(), ds.data())
      switch (NB) {
        case 1: TMT_BACKWARD(1); break;
        case 2: TMT_BACKWARD(2); break;
        case 3: TMT_BACKWARD(3); break;
        default: TMT_BACKWARD(4); break;
      }
#undef TMT_BACKWARD
    }
  });
  return {gq, gk, gv};
}

}  // namespace

TORCH_LIBRARY(tmt, m) {
  m.def("short_attention(Tensor q, Tensor k, Tensor v, Tensor? allowed, bool causal, float scale) -> (Tensor, Tensor)");
  m.def("short_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor probs, float scale) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tmt, CPU, m) {
  m.impl("short_attention", &forward);
  m.impl("short_attention_backward", &backward);
}
