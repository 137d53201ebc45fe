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

#include "vec16.h"

namespace {

using namespace tmt_vec;

struct View4 {  // a (B, rows, H, d) float tensor's data and strides, in elements
  const float* data;
  int64_t sb, sr, sh;
  explicit View4(const at::Tensor& t) : data(t.data_ptr<float>()), sb(t.stride(0)), sr(t.stride(1)), sh(t.stride(2)) {}
  const float* at(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
  float* out(int64_t b, int64_t h) const { return const_cast<float*>(at(b, h)); }  // for the gradients written
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

// Asks for rows [0, rows) of `len` floats, `stride` apart, to be brought into the cache: the next sentence's rows,
// while this one's are computed (they are strided views of a fused projection, which the hardware prefetcher follows
// less well than a contiguous block).
inline void prefetch_rows(const float* base, int64_t rows, int64_t stride, int64_t len) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < len; j += 16) __builtin_prefetch(base + r * stride + j, 0, 2);
}

// rows (Kp of them, zero past K) of a (K, D) block with row stride `sr`, transposed into out (D, Kp)
void transpose_padded(const float* x, int64_t sr, int64_t K, int64_t Kp, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t s = K; s < Kp; ++s) out[d * Kp + s] = 0.0f;
  for (int64_t s = 0; s < K; ++s)
    for (int64_t d = 0; d < D; ++d) out[d * Kp + s] = x[s * sr + d];
}

// acc[r] = rows t0..t0+R-1 of x (row stride xs, D columns) times mt, a (D, NB * 16) transposed and padded matrix:
// Q K^T in the forward, dO V^T in the backward.
template <int NB, int R>
inline void rows_times_transposed(int64_t t0, const float* x, int64_t xs, const float* mt, int64_t D, v16 (&acc)[R][NB]) {
  constexpr int64_t Kp = NB * 16;
  for (int64_t d = 0; d < D; ++d) {
    v16 md[NB];
    for (int blk = 0; blk < NB; ++blk) md[blk] = load(mt + d * Kp + blk * 16);
    for (int r = 0; r < R; ++r) {
      const float a = x[(t0 + r) * xs + d];
      for (int blk = 0; blk < NB; ++blk) acc[r][blk] += a * md[blk];
    }
  }
}

// R query rows t0..t0+R-1 of one (sentence, head) of the forward, over NB blocks of 16 keys. The rows go together so
// that each load of k and v serves R of them, and the R products' dependency chains overlap.
template <int NB, int R>
inline void forward_rows(int64_t t0, const float* qi, int64_t qs, const float* kt, const float* vi, int64_t vs,
                         const v16* allowed, bool causal, float sc, int64_t K, int64_t Dk, int64_t Dv, float* probs,
                         float* out, int64_t out_row) {
  constexpr int64_t Kp = NB * 16;
  v16 acc[R][NB] = {};
  rows_times_transposed<NB, R>(t0, qi, qs, kt, Dk, acc);
  const v16i iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const v16 zero = {}, ninf = zero - std::numeric_limits<float>::infinity();
  alignas(64) float rows[R][Kp];
  const int64_t n_max = causal ? t0 + R : K;  // keys any of the R rows may see
  for (int r = 0; r < R; ++r) {
    const int32_t n = static_cast<int32_t>(causal ? t0 + r + 1 : K);  // keys 0..n-1 may be seen
    v16 keep[NB];
    float mx = -std::numeric_limits<float>::infinity();
    for (int blk = 0; blk < NB; ++blk) {
      keep[blk] = (iota + blk * 16 < n) ? allowed[blk] : zero;
      acc[r][blk] *= sc;
      mx = std::max(mx, hmax(keep[blk] != zero ? acc[r][blk] : ninf));
    }
    v16 sum = {};
    for (int blk = 0; blk < NB; ++blk) {
      acc[r][blk] = exp_nonpositive(acc[r][blk] - mx) * keep[blk];
      sum += acc[r][blk];
    }
    const float inv = 1.0f / hsum(sum);
    for (int blk = 0; blk < NB; ++blk) store(rows[r] + blk * 16, acc[r][blk] * inv);
    std::copy_n(rows[r], K, probs + (t0 + r) * K);
  }
  for (int64_t d = 0; d < Dv; d += 16) {
    v16 o[R] = {};
    for (int64_t s = 0; s < n_max; ++s) {
      const v16 vd = load(vi + s * vs + d);
      for (int r = 0; r < R; ++r) o[r] += rows[r][s] * vd;
    }
    for (int r = 0; r < R; ++r) store(out + (t0 + r) * out_row + d, o[r]);
  }
}

// One (sentence, head) of the forward: NB blocks of 16 keys, query rows four at a time.
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
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) forward_rows<NB, 4>(t, qi, qs, kt, vi, vs, allowed, causal, sc, K, Dk, Dv, probs, out, out_row);
  for (; t < T; ++t) forward_rows<NB, 1>(t, qi, qs, kt, vi, vs, allowed, causal, sc, K, Dk, Dv, probs, out, out_row);
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
      if (h == 0 && b + 1 < end) {
        prefetch_rows(qv.at(b + 1, 0), T, qv.sr, H * Dk);
        prefetch_rows(kv.at(b + 1, 0), K, kv.sr, H * Dk);
        prefetch_rows(vv.at(b + 1, 0), K, vv.sr, H * Dv);
      }
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

// The rows of dS = P * (dP - rowsum(P * dP)) * scale for queries t0..t0+R-1, dP = dO v^T (vt: v transposed, padded).
template <int NB, int R>
inline void backward_ds_rows(int64_t t0, const float* go, int64_t go_row, const float* vt, const float* probs, float sc,
                             int64_t K, int64_t Dv, float* ds) {
  constexpr int64_t Kp = NB * 16;
  v16 dp[R][NB] = {};
  rows_times_transposed<NB, R>(t0, go, go_row, vt, Dv, dp);
  for (int r = 0; r < R; ++r) {
    alignas(64) float p[Kp];
    std::copy_n(probs + (t0 + r) * K, K, p);
    std::fill(p + K, p + Kp, 0.0f);
    v16 dot = {};
    for (int blk = 0; blk < NB; ++blk) dot += load(p + blk * 16) * dp[r][blk];
    const float rowdot = hsum(dot);
    for (int blk = 0; blk < NB; ++blk) store(ds + (t0 + r) * Kp + blk * 16, load(p + blk * 16) * (dp[r][blk] - rowdot) * sc);
  }
}

// out rows i0..i0+R-1 (R of them, `out_row` apart) = sum over j < J of w[j * wj + i] * x[j * xs + d], over d < D:
// the shape of all three gradient products (gq = dS k, gk = dS^T q, gv = P^T dO).
template <int R>
inline void weighted_rows(int64_t i0, const float* w, int64_t wi, int64_t wj, const float* x, int64_t xs, int64_t J,
                          int64_t D, float* out, int64_t out_row) {
  for (int64_t d = 0; d < D; d += 16) {
    v16 a[R] = {};
    for (int64_t j = 0; j < J; ++j) {
      const v16 xd = load(x + j * xs + d);
      for (int r = 0; r < R; ++r) a[r] += w[j * wj + (i0 + r) * wi] * xd;
    }
    for (int r = 0; r < R; ++r) store(out + (i0 + r) * out_row + d, a[r]);
  }
}

template <int R>
inline void weighted_all(int64_t I, const float* w, int64_t wi, int64_t wj, const float* x, int64_t xs, int64_t J, int64_t D,
                         float* out, int64_t out_row) {
  int64_t i = 0;
  for (; i + R <= I; i += R) weighted_rows<R>(i, w, wi, wj, x, xs, J, D, out, out_row);
  for (; i < I; ++i) weighted_rows<1>(i, w, wi, wj, x, xs, J, D, out, out_row);
}

// One (sentence, head) of the backward, each gradient's rows `g*_row` apart. First the rows of dS (kept
// in ds, T x Kp), then gq[t] = sum_s dS[t, s] k[s], gk[s] = sum_t dS[t, s] q[t], gv[s] = sum_t P[t, s] dO[t], four
// output rows at a time.
template <int NB>
void backward_block(const float* go, int64_t go_row, const float* qi, int64_t qs, const float* ki, int64_t ks,
                    const float* vi, int64_t vs, const float* probs, float sc, int64_t T, int64_t K, int64_t Dk, int64_t Dv,
                    float* gq, float* gk, float* gv, int64_t gq_row, int64_t gk_row, int64_t gv_row, float* vt, float* ds) {
  constexpr int64_t Kp = NB * 16;
  transpose_padded(vi, vs, K, Kp, Dv, vt);
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) backward_ds_rows<NB, 4>(t, go, go_row, vt, probs, sc, K, Dv, ds);
  for (; t < T; ++t) backward_ds_rows<NB, 1>(t, go, go_row, vt, probs, sc, K, Dv, ds);
  weighted_all<4>(T, ds, Kp, 1, ki, ks, K, Dk, gq, gq_row);     // gq[t] = sum_s ds[t, s] k[s]
  weighted_all<4>(K, ds, 1, Kp, qi, qs, T, Dk, gk, gk_row);     // gk[s] = sum_t ds[t, s] q[t]
  weighted_all<4>(K, probs, 1, K, go, go_row, T, Dv, gv, gv_row);  // gv[s] = sum_t P[t, s] dO[t]
}

// Gradients of q, k, v from the output's (B, T, H * Dv), written into gq (B, T, H, Dk), gk (B, K, H, Dk) and
// gv (B, K, H, Dv), views with a contiguous last dimension (of one buffer, for a fused projection's gradient):
// with P the weights and dP = dO v^T, dS = P * (dP - rowsum(P * dP)); dq = scale dS k, dk = scale dS^T q, dv = P^T dO.
void backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& probs,
              double scale, at::Tensor gq, at::Tensor gk, at::Tensor gv) {
  check_inputs(q, k, v, c10::nullopt, false);
  check_inputs(gq, gk, gv, c10::nullopt, false);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), K = k.size(1), Dv = v.size(3);
  TORCH_CHECK(gq.sizes() == q.sizes() && gk.sizes() == k.sizes() && gv.sizes() == v.sizes(), "short_attention: gradient shapes");
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.numel() == B * T * H * Dv, "short_attention: grad shape");
  TORCH_CHECK(probs.is_contiguous() && probs.numel() == B * H * T * K, "short_attention: weights shape");
  const at::Tensor go = grad_out.contiguous();
  const View4 qv(q), kv(k), vv(v), gqv(gq), gkv(gk), gvv(gv);
  const float* go_data = go.data_ptr<float>();
  const float* probs_data = probs.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t NB = (K + 15) / 16;

  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {  // one task per sentence, as in the forward
    std::vector<float> vt(Dv * NB * 16), ds(T * NB * 16);
    for (int64_t i = begin * H; i < end * H; ++i) {
      const int64_t b = i / H, h = i % H;
      if (h == 0 && b + 1 < end) {
        prefetch_rows(qv.at(b + 1, 0), T, qv.sr, H * Dk);
        prefetch_rows(kv.at(b + 1, 0), K, kv.sr, H * Dk);
        prefetch_rows(vv.at(b + 1, 0), K, vv.sr, H * Dv);
        prefetch_rows(go_data + (b + 1) * T * H * Dv, 1, 0, T * H * Dv);
        prefetch_rows(probs_data + (b + 1) * H * T * K, 1, 0, H * T * K);
      }
#define TMT_BACKWARD(nb)                                                                                                 \
  backward_block<nb>(go_data + b * T * H * Dv + h * Dv, H * Dv, qv.at(b, h), qv.sr, kv.at(b, h), kv.sr, vv.at(b, h), vv.sr, \
                     probs_data + i * T * K, sc, T, K, Dk, Dv, gqv.out(b, h), gkv.out(b, h), gvv.out(b, h), gqv.sr, gkv.sr,  \
                     gvv.sr, vt.data(), ds.data())
      switch (NB) {
        case 1: TMT_BACKWARD(1); break;
        case 2: TMT_BACKWARD(2); break;
        case 3: TMT_BACKWARD(3); break;
        default: TMT_BACKWARD(4); break;
      }
#undef TMT_BACKWARD
    }
  });
}

}  // namespace

TORCH_LIBRARY(tmt, m) {
  m.def("short_attention(Tensor q, Tensor k, Tensor v, Tensor? allowed, bool causal, float scale) -> (Tensor, Tensor)");
  m.def(
      "short_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor probs, float scale, Tensor(a!) gq, "
      "Tensor(b!) gk, Tensor(c!) gv) -> ()");
}

TORCH_LIBRARY_IMPL(tmt, CPU, m) {
  m.impl("short_attention", &forward);
  m.impl("short_attention_backward", &backward);
}
