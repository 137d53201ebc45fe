// The fused loss's softmax over a chunk of logits rows (fused_loss._ProjectedLabelSmoothedLoss), forward and backward,
// and both at once (fused_loss._LossSumAndGradient, which takes the loss's gradient in its forward).
//
// In torch ops a chunk of (rows, V) logits, 16 MiB, goes through memory six times forward (gather, sum, max,
// subtract, exp, sum, divide) and three times backward. Here each row (V floats, tens of KiB) is read from memory once
// and stays in the core's cache for its three passes (max and sum; exp and sum; scale), forward; once, backward.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "vec16.h"

namespace {

using namespace tmt_vec;

void check_rows(const at::Tensor& x, const at::Tensor& target, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, what,
              ": contiguous (rows, V) float32 CPU logits only");
  TORCH_CHECK(target.scalar_type() == at::kLong && target.is_contiguous() && target.numel() == x.size(0), what,
              ": one int64 target per row");
}

// x (rows, V) logits -> softmax, in place; returns per row log Z (= logsumexp), the target's logit and the sum of the
// logits (the label smoothing's sum over the vocabulary of -log p is V * log Z - that sum). With Grad, the rows
// become softmax_rows_backward_'s gradient instead, in the same last pass: ((p - eps_i) + on_target [at the target]) * row_w.
template <bool Grad>
std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_rows_impl(at::Tensor x, const at::Tensor& target, const float* wd, float e,
                                                                 float on) {
  const int64_t rows = x.size(0), V = x.size(1), Vv = V / 16 * 16;
  at::Tensor lse = at::empty({rows}, x.options()), tgt = at::empty({rows}, x.options()), sum = at::empty({rows}, x.options());
  float *xd = x.data_ptr<float>(), *lsed = lse.data_ptr<float>(), *tgtd = tgt.data_ptr<float>(), *sumd = sum.data_ptr<float>();
  const int64_t* td = target.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = xd + r * V;
      TORCH_CHECK(td[r] >= 0 && td[r] < V, "softmax_rows_: target out of range");
      tgtd[r] = row[td[r]];
      v16 mv = v16{} - std::numeric_limits<float>::infinity(), sv = {};
      for (int64_t v = 0; v < Vv; v += 16) {
        const v16 a = load(row + v);
        mv = a > mv ? a : mv;
        sv += a;
      }
      float m = hmax(mv), s = hsum(sv);
      for (int64_t v = Vv; v < V; ++v) {
        m = std::max(m, row[v]);
        s += row[v];
      }
      v16 zv = {};
      for (int64_t v = 0; v < Vv; v += 16) {
        const v16 e = exp_nonpositive(load(row + v) - m);
        store(row + v, e);
        zv += e;
      }
      float z = hsum(zv);
      for (int64_t v = Vv; v < V; ++v) {
        const float e = std::exp(row[v] - m);
        row[v] = e;
        z += e;
      }
      const float inv = 1.0f / z;
      if (Grad) {
        const float w = wd[r];
        const float at_target = (((row[td[r]] * inv) - e) + on) * w;
        for (int64_t v = 0; v < Vv; v += 16) store(row + v, (load(row + v) * inv - e) * w);
        for (int64_t v = Vv; v < V; ++v) row[v] = (row[v] * inv - e) * w;
        row[td[r]] = at_target;
      } else {
        for (int64_t v = 0; v < Vv; v += 16) store(row + v, load(row + v) * inv);
        for (int64_t v = Vv; v < V; ++v) row[v] *= inv;
      }
      lsed[r] = m + std::log(z);
      sumd[r] = s;
    }
  });
  return {lse, tgt, sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_rows_(at::Tensor x, const at::Tensor& target) {
  check_rows(x, target, "softmax_rows_");
  return softmax_rows_impl<false>(x, target, nullptr, 0.0f, 0.0f);
}

// softmax_rows_ followed by softmax_rows_backward_, each row's last pass writing the gradient instead of p.
std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_rows_grad_(at::Tensor x, const at::Tensor& target, const at::Tensor& row_w,
                                                                  double eps_i, double on_target) {
  check_rows(x, target, "softmax_rows_grad_");
  TORCH_CHECK(row_w.scalar_type() == at::kFloat && row_w.is_contiguous() && row_w.numel() == x.size(0),
              "softmax_rows_grad_: one float32 weight per row");
  return softmax_rows_impl<true>(x, target, row_w.data_ptr<float>(), static_cast<float>(eps_i), static_cast<float>(on_target));
}

// p (rows, V) softmax -> d loss / d logits, in place: ((p - eps_i) + on_target [at the target]) * row_w.
void softmax_rows_backward_(at::Tensor p, const at::Tensor& target, const at::Tensor& row_w, double eps_i, double on_target) {
  check_rows(p, target, "softmax_rows_backward_");
  TORCH_CHECK(row_w.scalar_type() == at::kFloat && row_w.is_contiguous() && row_w.numel() == p.size(0),
              "softmax_rows_backward_: one float32 weight per row");
  const int64_t rows = p.size(0), V = p.size(1), Vv = V / 16 * 16;
  float* pd = p.data_ptr<float>();
  const float* wd = row_w.data_ptr<float>();
  const int64_t* td = target.data_ptr<int64_t>();
  const float e = static_cast<float>(eps_i), on = static_cast<float>(on_target);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = pd + r * V;
      const float w = wd[r];
      const float at_target = ((row[td[r]] - e) + on) * w;
      for (int64_t v = 0; v < Vv; v += 16) store(row + v, (load(row + v) - e) * w);
      for (int64_t v = Vv; v < V; ++v) row[v] = (row[v] - e) * w;
      row[td[r]] = at_target;
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tmt, m) {
  m.def("softmax_rows_(Tensor(a!) x, Tensor target) -> (Tensor, Tensor, Tensor)");
  m.def("softmax_rows_backward_(Tensor(a!) p, Tensor target, Tensor row_w, float eps_i, float on_target) -> ()");
  m.def("softmax_rows_grad_(Tensor(a!) x, Tensor target, Tensor row_w, float eps_i, float on_target) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tmt, CPU, m) {
  m.impl("softmax_rows_", &softmax_rows_);
  m.impl("softmax_rows_backward_", &softmax_rows_backward_);
  m.impl("softmax_rows_grad_", &softmax_rows_grad_);
}
