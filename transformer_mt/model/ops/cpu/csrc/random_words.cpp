// The dropout masks' random words (kernels._random_words), drawn from torch's default CPU generator as
// torch.empty(n, dtype=int64).random_(-2**63, 2**63 - 1) draws them, word for word, and leaving the generator where
// that call leaves it.
//
// torch draws them one element at a time: per 64-bit word two mt19937 outputs, each behind a branch on the state's
// counter, on one thread, while the other threads of a training step wait. A step of the recipe draws about 2.5 million
// such words (one per four dropout elements). Here the same generator state is advanced 624 words at a time, and the
// twist and the tempering run over whole arrays, which the compiler vectorises: the same numbers at a fraction of the
// time. mt19937's twist and tempering are those of at::mt19937_engine (ATen/core/MT19937RNGEngine.h), the pairing of
// two outputs into one word that of CPUGeneratorImpl::random64 (the first output is the high half), and the range's
// transformation that of uniform_int_from_to_distribution: (word % (2^64 - 1)) - 2^63.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>

namespace {

constexpr int kN = 624;  // mt19937's state, in 32-bit words
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0df;
constexpr uint32_t kUpper = 0x80000000;
constexpr uint32_t kLower = 0x7fffffff;

inline uint32_t twist(uint32_t u, uint32_t v) { return (((u & kUpper) | (v & kLower)) >> 1) ^ ((v & 1) ? kMatrixA : 0); }

// at::mt19937_engine::next_state, as three loops without a carried dependence shorter than a vector: the first reads
// only old words, the second reads words the first wrote 227 places back.
void next_state(uint32_t* s) {
  for (int i = 0; i < kN - kM; ++i) s[i] = s[i + kM] ^ twist(s[i], s[i + 1]);
  for (int i = kN - kM; i < kN - 1; ++i) s[i] = s[i + kM - kN] ^ twist(s[i], s[i + 1]);
  s[kN - 1] = s[kM - 1] ^ twist(s[kN - 1], s[0]);
}

inline uint32_t temper(uint32_t y) {
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680;
  y ^= (y << 15) & 0xefc60000;
  y ^= (y >> 18);
  return y;
}

// Output number j of this call goes to the high half of word j / 2 when j is even (random64's first draw), the low
// half when odd: on a little-endian machine, 32-bit slot j ^ 1. The high half's top bit is flipped here (the
// range's - 2^63); the one word whose % (2^64 - 1) is not itself is fixed after.
at::Tensor random_words(int64_t n) {
  TORCH_CHECK(n >= 0, "random_words: n must be >= 0");
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  uint32_t* out32 = reinterpret_cast<uint32_t*>(out.data_ptr<int64_t>());
  auto* gen = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::mt19937 engine = gen->engine();
  at::mt19937_data_pod data = engine.data();
  uint32_t* s = data.state_.data();
  // The engine's counters: a call decrements left_ and twists when it reaches 0, then reads state[next_++]. So
  // left_ - 1 words are ready at state[next_]; at left_ == 1 the next call twists first.
  const int64_t draws = 2 * n;
  int64_t j = 0;
  while (j < draws) {
    if (data.left_ == 1) {
      next_state(s);
      data.left_ = kN + 1;
      data.next_ = 0;
    }
    const int64_t take = std::min<int64_t>(draws - j, data.left_ - 1);
    const uint32_t* src = s + data.next_;
    int64_t k = 0;
    if (j & 1) {  // finish a word begun in the last block
      out32[j ^ 1] = temper(src[0]);
      k = 1;
    }
    for (; k + 1 < take; k += 2) {  // whole words: (high, low) = (draw j, draw j + 1)
      const int64_t w = j + k;  // even
      out32[w] = temper(src[k + 1]);
      out32[w + 1] = temper(src[k]) ^ kUpper;
    }
    if (k < take) {  // a word's first draw, its second in the next block
      out32[(j + k) ^ 1] = temper(src[k]) ^ kUpper;
    }
    j += take;
    data.next_ += static_cast<uint32_t>(take);
    data.left_ -= static_cast<int>(take);
  }
  int64_t* words = out.data_ptr<int64_t>();
  for (int64_t w = 0; w < n; ++w) {  // 2^64 - 1 % (2^64 - 1) is 0, so it leaves as -2^63, not 2^63 - 1
    if (words[w] == INT64_MAX) words[w] = INT64_MIN;
  }
  engine.set_data(data);
  gen->set_engine(engine);
  return out;
}

}  // namespace

// No tensor argument to dispatch on: one kernel for every backend (it draws on the CPU generator).
TORCH_LIBRARY_FRAGMENT(tmt, m) { m.def("random_words(int n) -> Tensor", &random_words); }
