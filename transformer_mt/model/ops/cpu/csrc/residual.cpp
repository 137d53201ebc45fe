// The residual stream's element-wise work in a CPU training step, one pass each: the dropout-and-add of a sublayer's
// output and ScaleNorm, forward and backward.
//
// In torch ops, x + dropout(y) is a comparison, two multiplies and an add over the (B, T, D) stream, and its backward
// two multiplies; ScaleNorm is a norm, a clamp, a divide and a multiply, and about ten passes backward. Each is a
// pass over memory with little arithmetic. The numbers are the torch ops': the dropout mask comes from the same
// random words (kernels._CpuDropout: 16-bit lanes of 64-bit words from torch's generator), and the products are taken
// in the same order, so dropout_add gives the torch ops' bits.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

// x + (y * keep) * scale must round as the torch ops do: a fused multiply-add would skip a rounding.
#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kGrain = 16384;  // elements per task: smaller tensors stay on one thread

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.device().is_cpu() && a.scalar_type() == at::kFloat && a.is_contiguous(), what, ": contiguous float32 CPU tensors only");
  TORCH_CHECK(b.scalar_type() == at::kFloat && b.is_contiguous() && a.sizes() == b.sizes(), what, ": shapes differ");
}

const int16_t* lanes_of(const at::Tensor& words, int64_t n) {
  TORCH_CHECK(words.scalar_type() == at::kLong && words.is_contiguous() && words.numel() * 4 >= n,
              "dropout: words must be int64, one per 4 elements");
  return reinterpret_cast<const int16_t*>(words.data_ptr<int64_t>());
}

// out = x + y * keep * scale, keep = (lane >= threshold); the torch ops' order: (y * keep) * scale, then the add.
at::Tensor dropout_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& words, int64_t threshold, double scale) {
  check_same(x, y, "dropout_add");
  const int64_t n = x.numel();
  const int16_t* lanes = lanes_of(words, n);
  at::Tensor out = at::empty_like(x);
  const float *xd = x.data_ptr<float>(), *yd = y.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int16_t thr = static_cast<int16_t>(threshold);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) od[i] = xd[i] + (yd[i] * (lanes[i] >= thr ? 1.0f : 0.0f)) * sc;
  });
  return out;
}

// The backward of dropout (the add's is the identity): g * keep * scale.
at::Tensor dropout_backward(const at::Tensor& g, const at::Tensor& words, int64_t threshold, double scale) {
  check_same(g, g, "dropout_backward");
  const int64_t n = g.numel();
  const int16_t* lanes = lanes_of(words, n);
  at::Tensor out = at::empty_like(g);
  const float* gd = g.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int16_t thr = static_cast<int16_t>(threshold);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) od[i] = (gd[i] * (lanes[i] >= thr ? 1.0f : 0.0f)) * sc;
  });
  return out;
}

// ScaleNorm y = g * x / max(||x||, eps) over rows of D; returns y and the rows' norms (for the backward).
std::tuple<at::Tensor, at::Tensor> scale_norm(const at::Tensor& x, const at::Tensor& g, double eps) {
  check_same(x, x, "scale_norm");
  TORCH_CHECK(g.numel() == 1 && g.scalar_type() == at::kFloat, "scale_norm: g must be one float32");
  const int64_t D = x.size(-1), rows = x.numel() / D;
  at::Tensor y = at::empty_like(x);
  at::Tensor norm = at::empty({rows}, x.options());
  const float* xd = x.data_ptr<float>();
  float *yd = y.data_ptr<float>(), *nd = norm.data_ptr<float>();
  const float gv = g.item<float>(), e = static_cast<float>(eps);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xd + r * D;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t d = 0; d < D; ++d) ss += xr[d] * xr[d];
      const float nrm = std::sqrt(ss);
      nd[r] = nrm;
      const float s = gv / std::max(nrm, e);
      float* yr = yd + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * s;
    }
  });
  return {y, norm};
}

// With s = g / max(||x||, eps) and c = s * (x . dy) / ||x||^2 where ||x|| >= eps (else 0): dx = s * dy - c * x,
// dg = sum over rows of (x . dy) / max(||x||, eps).
std::tuple<at::Tensor, at::Tensor> scale_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& norm,
                                                       const at::Tensor& g, double eps) {
  check_same(x, dy, "scale_norm_backward");
  const int64_t D = x.size(-1), rows = x.numel() / D;
  TORCH_CHECK(norm.numel() == rows && norm.is_contiguous(), "scale_norm_backward: norms shape");
  at::Tensor dx = at::empty_like(x);
  const float *xd = x.data_ptr<float>(), *dyd = dy.data_ptr<float>(), *nd = norm.data_ptr<float>();
  float* dxd = dx.data_ptr<float>();
  const float gv = g.item<float>(), e = static_cast<float>(eps);
  const int64_t grain = std::max<int64_t>(1, kGrain / D);
  std::vector<double> partial(at::get_num_threads(), 0.0);  // dg per thread, summed in thread order below
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    double dg = 0.0;
    for (int64_t r = begin; r < end; ++r) {
      const float *xr = xd + r * D, *dr = dyd + r * D;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += xr[d] * dr[d];
      const float nrm = nd[r], clamped = std::max(nrm, e), s = gv / clamped;
      const float c = nrm >= e ? s * dot / (nrm * nrm) : 0.0f;
      float* out = dxd + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] = s * dr[d] - c * xr[d];
      dg += dot / clamped;
    }
    partial[at::get_thread_num()] += dg;
  });
  double dg = 0.0;
  for (double p : partial) dg += p;
  return {dx, at::full_like(g, static_cast<float>(dg))};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tmt, m) {
  m.def("dropout_add(Tensor x, Tensor y, Tensor words, int threshold, float scale) -> Tensor");
  m.def("dropout_backward(Tensor grad, Tensor words, int threshold, float scale) -> Tensor");
  m.def("scale_norm(Tensor x, Tensor g, float eps) -> (Tensor, Tensor)");
  m.def("scale_norm_backward(Tensor grad, Tensor x, Tensor norm, Tensor g, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tmt, CPU, m) {
  m.impl("dropout_add", &dropout_add);
  m.impl("dropout_backward", &dropout_backward);
  m.impl("scale_norm", &scale_norm);
  m.impl("scale_norm_backward", &scale_norm_backward);
}
