// 16-float vectors (GCC / Clang vector extensions) and the few operations the kernels share on them.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tmt_vec {

// 16 floats: one AVX-512 register, or two AVX2 / four SSE registers where the compiler splits it.
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));  // unaligned loads and stores

inline v16 load(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store(float* p, v16 x) { *reinterpret_cast<v16u*>(p) = x; }
// Horizontal sum and max in four shuffle steps (a tree: its sums round in another order than a loop's would).
#if defined(__clang__)
#define TMT_SHUFFLE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
#else
#define TMT_SHUFFLE(x, ...) __builtin_shuffle(x, v16i{__VA_ARGS__})
#endif
#define TMT_TREE(x, op)                                                              \
  x = op(x, TMT_SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));  \
  x = op(x, TMT_SHUFFLE(x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));  \
  x = op(x, TMT_SHUFFLE(x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));  \
  x = op(x, TMT_SHUFFLE(x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14))

inline v16 vadd(v16 a, v16 b) { return a + b; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline float hsum(v16 x) {
  TMT_TREE(x, vadd);
  return x[0];
}
inline float hmax(v16 x) {
  TMT_TREE(x, vmax);
  return x[0];
}

// exp(x) for x <= 0 to about 1 ulp (Cephes expf), 16 at a time; x is clamped to [-87, 0], so exp(-inf) gives
// 1.6e-38 (the callers multiply masked keys by 0), never NaN.
inline v16 exp_nonpositive(v16 x) {
  const v16 zero = {}, lo = zero - 87.0f;
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

}  // namespace tmt_vec
