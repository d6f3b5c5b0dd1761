// Causal attention over slots for long rows on CPU, float32, AVX-512, as an XLA FFI handler: a query tile's
// scores against one key tile at a time, with an online softmax (flash attention), so no [T, S] score
// tensor ever passes through memory. XLA:CPU's blocked attention streams each 512-query block's scores
// through memory for the mask, the max, the exponent and PV: about half of a 4K-token prefill's time
// for a third of its FLOPs (docs/results/bench_sampler.md).
//
// Semantics (those of `attention.dense_attention` with `slot_mask`): query t sits at slot q_offset + t and
// sees key slot j iff j <= its slot and key_valid[j]; a masked score is -0.7 * FLT_MAX (so a query with no
// visible key averages the keys up to its slot: finite, and unread by callers). Items are (row, key head,
// tile of 32 queries) with the key head's G query heads stacked, handed to XLA's intra-op threads by an
// atomic counter, the longest (latest) tiles first.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kQueryTile = 32;  // queries per item, per query head
constexpr int64_t kKeyTile = 64;    // keys per step: 4 AVX-512 vectors of scores per row
constexpr float kMaskValue = -0.7f * FLT_MAX;

// exp(x) for float32 lanes: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 Taylor polynomial
// (relative error about 2e-7); x below -87.3 (and -inf) gives 0.
inline __m512 Exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.37626f);
  const __m512 under = _mm512_set1_ps(-87.33654f);
  const __mmask16 zero = _mm512_cmp_ps_mask(x, under, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), _mm512_scalef_ps(p, n));
}

inline __mmask16 Lanes(uint64_t bits, int c) { return static_cast<__mmask16>(bits >> (16 * c)); }

inline uint64_t LowBits(int64_t n) {  // the lowest n of 64 bits set (n clamped to 0..64)
  return n <= 0 ? 0 : n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
}

// scores [MR, 64] = scale * q [MR, D] . kt [D, 64 keys] (kt rows kt_stride apart; lanes outside `in` read 0).
template <int MR>
void Scores(const float* q, int64_t d_size, const float* kt, int64_t kt_stride, uint64_t in, float scale,
            float* scores) {
  __m512 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < 4; ++c) acc[m][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < d_size; ++d) {
    const float* row = kt + d * kt_stride;
    __m512 k[4];
    for (int c = 0; c < 4; ++c) k[c] = _mm512_maskz_loadu_ps(Lanes(in, c), row + 16 * c);
    for (int m = 0; m < MR; ++m) {
      const __m512 qm = _mm512_set1_ps(q[m * d_size + d]);
      for (int c = 0; c < 4; ++c) acc[m][c] = _mm512_fmadd_ps(qm, k[c], acc[m][c]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(scores + m * kKeyTile + 16 * c, _mm512_mul_ps(acc[m][c], s));
}

// out [MR, 16 DV] = alpha * out + p [MR, n] . v [n, 16 DV] (v rows 16 DV apart).
template <int MR, int DV>
void AccumulateValues(const float* p, const float* v, int64_t n, const float* alpha, float* out) {
  constexpr int64_t D = 16 * DV;
  __m512 acc[MR][DV];
  for (int m = 0; m < MR; ++m) {
    const __m512 a = _mm512_set1_ps(alpha[m]);
    for (int c = 0; c < DV; ++c) acc[m][c] = _mm512_mul_ps(_mm512_loadu_ps(out + m * D + 16 * c), a);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 vj[DV];
    for (int c = 0; c < DV; ++c) vj[c] = _mm512_loadu_ps(v + j * D + 16 * c);
    for (int m = 0; m < MR; ++m) {
      const __m512 pm = _mm512_set1_ps(p[m * kKeyTile + j]);
      for (int c = 0; c < DV; ++c) acc[m][c] = _mm512_fmadd_ps(pm, vj[c], acc[m][c]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(out + m * D + 16 * c, acc[m][c]);
}

template <int MR>
void ScoresUpTo(int rows, const float* q, int64_t d, const float* kt, int64_t stride, uint64_t in, float scale,
                float* scores) {  // rows <= MR, in blocks of MR then one remainder
  int r = 0;
  for (; r + MR <= rows; r += MR) Scores<MR>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile);
  switch (rows - r) {
    case 5: Scores<5>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile); break;
    case 4: Scores<4>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile); break;
    case 3: Scores<3>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile); break;
    case 2: Scores<2>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile); break;
    case 1: Scores<1>(q + r * d, d, kt, stride, in, scale, scores + r * kKeyTile); break;
    default: break;
  }
}

template <int DV>
void ValuesAll(int rows, const float* p, const float* v, int64_t n, const float* alpha, float* out) {
  constexpr int MR = 24 / DV;  // accumulators: MR x DV = 24 of the 32 vector registers
  constexpr int64_t D = 16 * DV;
  int r = 0;
  for (; r + MR <= rows; r += MR) AccumulateValues<MR, DV>(p + r * kKeyTile, v, n, alpha + r, out + r * D);
  for (; r < rows; ++r) AccumulateValues<1, DV>(p + r * kKeyTile, v, n, alpha + r, out + r * D);
}

struct Problem {
  const float *q, *kt, *v;
  const uint8_t* key_valid;
  float* out;
  int64_t batch, t_size, heads, kv_heads, groups, d_size, s_size, v_slots, q_offset, tiles;
};

// One item: row b, key head kh, queries i0..i0+nq-1 of each of the key head's G query heads.
template <int DV>
void Item(const Problem& p, int64_t b, int64_t kh, int64_t i0) {
  constexpr int64_t D = 16 * DV;
  const int64_t nq = std::min(kQueryTile, p.t_size - i0), rows = p.groups * nq;
  std::vector<float> q(rows * D), out(rows * D, 0.0f), scores(rows * kKeyTile), m(rows, -INFINITY),
      l(rows, 0.0f), alpha(rows);
  for (int64_t g = 0; g < p.groups; ++g)  // row g * nq + i: query i0 + i of head kh * G + g
    for (int64_t i = 0; i < nq; ++i)
      std::copy_n(p.q + (((b * p.t_size + i0 + i) * p.heads) + kh * p.groups + g) * D, D, &q[(g * nq + i) * D]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* kt = p.kt + (b * p.kv_heads + kh) * D * p.s_size;  // [D, S]
  const float* v = p.v + (b * p.kv_heads + kh) * p.v_slots * D;   // [S', D]
  const uint8_t* valid = p.key_valid + b * p.s_size;
  const int64_t first_slot = p.q_offset + i0, keys = std::min(p.s_size, first_slot + nq);
  const __m512 masked = _mm512_set1_ps(kMaskValue), outside = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, p.s_size - j0);
    const uint64_t in = LowBits(n);
    uint64_t valid_bits = 0;
    for (int64_t j = 0; j < n; ++j) valid_bits |= uint64_t{valid[j0 + j] != 0} << j;
    ScoresUpTo<6>(static_cast<int>(rows), q.data(), D, kt + j0, p.s_size, in, scale, scores.data());
    for (int64_t r = 0; r < rows; ++r) {  // online softmax over this tile's scores
      const uint64_t seen = valid_bits & LowBits(first_slot + r % nq - j0 + 1);
      float* s = &scores[r * kKeyTile];
      __m512 x[4], top = outside;
      for (int c = 0; c < 4; ++c) {
        x[c] = _mm512_mask_blend_ps(Lanes(seen, c), masked, _mm512_loadu_ps(s + 16 * c));
        x[c] = _mm512_mask_blend_ps(Lanes(in, c), outside, x[c]);
        top = _mm512_max_ps(top, x[c]);
      }
      const float m_new = std::max(m[r], _mm512_reduce_max_ps(top));
      alpha[r] = std::exp(m[r] - m_new);
      const __m512 shift = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m512 e = Exp(_mm512_sub_ps(x[c], shift));
        sum = _mm512_add_ps(sum, e);
        _mm512_storeu_ps(s + 16 * c, e);
      }
      l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
      m[r] = m_new;
    }
    ValuesAll<DV>(static_cast<int>(rows), scores.data(), v + j0 * D, n, alpha.data(), out.data());
  }
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = g * nq + i;
      const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
      float* o = p.out + (((b * p.t_size + i0 + i) * p.heads) + kh * p.groups + g) * D;
      for (int c = 0; c < DV; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(&out[r * D + 16 * c]), inv));
    }
}

struct Work {
  Problem p;
  int64_t items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    const int64_t heads = p.batch * p.kv_heads;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t tile = p.tiles - 1 - i / heads, bh = i % heads;  // the latest (longest) tiles first
      if (p.d_size == 64) {
        Item<4>(p, bh / p.kv_heads, bh % p.kv_heads, tile * kQueryTile);
      } else {
        Item<8>(p, bh / p.kv_heads, bh % p.kv_heads, tile * kQueryTile);
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error FlashAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kt, ffi::Buffer<ffi::F32> v,
                          ffi::Buffer<ffi::U8> key_valid, ffi::Buffer<ffi::S32> q_offset,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ThreadPool pool) {
  auto qd = q.dimensions(), ktd = kt.dimensions(), vd = v.dimensions(), kvd = key_valid.dimensions();
  if (qd.size() != 4 || ktd.size() != 4 || vd.size() != 4 || kvd.size() != 2)
    return ffi::Error::InvalidArgument("need q [B, T, H, D], kt [B, K, D, S], v [B, K, S', D], key_valid [B, S]");
  const int64_t b = qd[0], t = qd[1], h = qd[2], d = qd[3], k = ktd[1], s = ktd[3];
  if ((d != 64 && d != 128) || ktd[0] != b || ktd[2] != d || vd[0] != b || vd[1] != k || vd[2] < s ||
      vd[3] != d || kvd[0] != b || kvd[1] != s || k == 0 || h % k || t > s || out->element_count() != q.element_count())
    return ffi::Error::InvalidArgument("attention operands do not match (head dim 64 or 128, H a multiple of K)");
  auto work = std::make_shared<Work>();  // shared: a helper that starts late still finds it alive
  work->p = Problem{q.typed_data(), kt.typed_data(), v.typed_data(), key_valid.typed_data(), out->typed_data(),
                    b, t, h, k, h / k, d, s, vd[2], static_cast<int64_t>(q_offset.typed_data()[0]),
                    (t + kQueryTile - 1) / kQueryTile};
  work->items = b * k * work->p.tiles;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  for (int64_t i = 1; i < std::min<int64_t>(threads, work->items); ++i) pool.Schedule([work] { work->Run(); });
  work->Run();
  for (int spins = 0; work->done.load(std::memory_order_acquire) < work->items; ++spins) {
    if (spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(memagent_flash_attention, FlashAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // kt [B, K, D, S]: the keys, transposed
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, S', D], S' >= S
                                  .Arg<ffi::Buffer<ffi::U8>>()   // key_valid [B, S]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // q_offset []: the first query's slot
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, H, D]
                                  .Ctx<ffi::ThreadPool>());
