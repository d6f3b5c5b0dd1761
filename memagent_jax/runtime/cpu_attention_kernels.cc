// Causal attention over slots on CPU, float32, AVX-512, as two XLA FFI handlers.
//
// memagent_flash_attention, for long rows: a query tile's
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
//
// memagent_few_queries_attention, for decoding (at most 16 queries a row against a cache): each (row, key
// head) scores its G x T queries against the visible keys in the cache's own layout [S', D] (no copy), then
// one softmax and one pass over the values. XLA's batched dots read the whole cache (every slot, visible or
// not) at about a quarter of this host's read speed (docs/results/bench_sampler.md).
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
  x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));  // x second: a NaN score stays NaN, as in XLA's softmax
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

// Head dims with register tiles: 2, 4 or 8 AVX-512 vectors a row (the toy models, SmolLM2, Qwen2.5).
inline bool HeadDimHasTiles(int64_t d) { return d == 32 || d == 64 || d == 128; }

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
  const float *q, *kt, *v;  // kt: the keys [B, K, D, S] for flash items, [B, K, S', D] for few queries
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


// One (row b, key head kh) of few queries: r = g * T + t is query t of head kh * G + g.
template <int DV>
void FewQueriesItem(const Problem& p, int64_t b, int64_t kh) {
  constexpr int64_t D = 16 * DV;
  constexpr int kRowsAtOnce = 16 / DV;  // query rows held in registers while a key is read: 16 vectors
  constexpr int MR = 24 / DV;           // rows per pass over the values (see ValuesAll)
  const int64_t rows = p.groups * p.t_size;
  const int64_t keys = std::min(p.s_size, p.q_offset + p.t_size);  // slots some query can see
  const int64_t stride = (keys + 15) / 16 * 16;
  std::vector<float> scores(rows * stride), q(rows * D), inv(rows), out(rows * D);
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t t = 0; t < p.t_size; ++t)
      std::copy_n(p.q + ((b * p.t_size + t) * p.heads + kh * p.groups + g) * D, D, &q[(g * p.t_size + t) * D]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* k = p.kt + (b * p.kv_heads + kh) * p.v_slots * D;  // [S', D]: the cache as it is
  const float* v = p.v + (b * p.kv_heads + kh) * p.v_slots * D;
  const uint8_t* valid = p.key_valid + b * p.s_size;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowsAtOnce) {  // scores: one dot product per (row, key)
    const int nr = static_cast<int>(std::min<int64_t>(kRowsAtOnce, rows - r0));
    __m512 qr[kRowsAtOnce][DV];
    for (int m = 0; m < nr; ++m)
      for (int c = 0; c < DV; ++c) qr[m][c] = _mm512_loadu_ps(&q[(r0 + m) * D + 16 * c]);
    for (int64_t j = 0; j < keys; ++j) {
      __m512 kj[DV];
      for (int c = 0; c < DV; ++c) kj[c] = _mm512_loadu_ps(k + j * D + 16 * c);
      for (int m = 0; m < nr; ++m) {
        __m512 acc = _mm512_mul_ps(qr[m][0], kj[0]);
        for (int c = 1; c < DV; ++c) acc = _mm512_fmadd_ps(qr[m][c], kj[c], acc);
        scores[(r0 + m) * stride + j] = _mm512_reduce_add_ps(acc) * scale;
      }
    }
  }
  const __m512 masked = _mm512_set1_ps(kMaskValue);
  for (int64_t r = 0; r < rows; ++r) {  // softmax over the visible keys (the rest masked, as XLA's)
    float* s = &scores[r * stride];
    const int64_t slot = p.q_offset + r % p.t_size;
    for (int64_t j = 0; j < keys; ++j)
      if (j > slot || !valid[j]) s[j] = kMaskValue;
    __m512 top = masked;
    for (int64_t j = 0; j < keys; j += 16) {
      const __mmask16 lanes = Lanes(LowBits(keys - j), 0);
      top = _mm512_max_ps(top, _mm512_mask_loadu_ps(masked, lanes, s + j));
    }
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; j += 16) {
      const __mmask16 lanes = Lanes(LowBits(keys - j), 0);
      const __m512 e = _mm512_maskz_mov_ps(lanes, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + j), shift)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(s + j, lanes, e);
    }
    inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
  }
  // out = probabilities . values: ValuesAll's accumulation with the scores' row stride
  for (int64_t r0 = 0; r0 < rows; r0 += MR) {
    const int nr = static_cast<int>(std::min<int64_t>(MR, rows - r0));
    __m512 acc[MR][DV];
    for (int m = 0; m < nr; ++m)
      for (int c = 0; c < DV; ++c) acc[m][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; ++j) {
      __m512 vj[DV];
      for (int c = 0; c < DV; ++c) vj[c] = _mm512_loadu_ps(v + j * D + 16 * c);
      for (int m = 0; m < nr; ++m) {
        const __m512 pm = _mm512_set1_ps(scores[(r0 + m) * stride + j]);
        for (int c = 0; c < DV; ++c) acc[m][c] = _mm512_fmadd_ps(pm, vj[c], acc[m][c]);
      }
    }
    for (int m = 0; m < nr; ++m) {
      const int64_t r = r0 + m, g = r / p.t_size, t = r % p.t_size;
      float* o = p.out + ((b * p.t_size + t) * p.heads + kh * p.groups + g) * D;
      const __m512 scale_r = _mm512_set1_ps(inv[r]);
      for (int c = 0; c < DV; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[m][c], scale_r));
    }
  }
}

struct Work {
  Problem p;
  bool few_queries;  // FewQueriesItem over (b, kh); else flash items over (tile, b, kh)
  int64_t items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    const int64_t heads = p.batch * p.kv_heads;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      if (few_queries) {
        const int64_t b = i / p.kv_heads, kh = i % p.kv_heads;
        switch (p.d_size) {
          case 32: FewQueriesItem<2>(p, b, kh); break;
          case 64: FewQueriesItem<4>(p, b, kh); break;
          default: FewQueriesItem<8>(p, b, kh); break;
        }
        done.fetch_add(1, std::memory_order_release);
        continue;
      }
      const int64_t tile = p.tiles - 1 - i / heads, bh = i % heads;  // the latest (longest) tiles first
      const int64_t b = bh / p.kv_heads, kh = bh % p.kv_heads, i0 = tile * kQueryTile;
      switch (p.d_size) {
        case 32: Item<2>(p, b, kh, i0); break;
        case 64: Item<4>(p, b, kh, i0); break;
        default: Item<8>(p, b, kh, i0); break;
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Items to every thread of XLA's pool that is free, the calling thread included; returns when all are done.
void RunOnPool(const std::shared_ptr<Work>& work, ffi::ThreadPool& pool) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  for (int64_t i = 1; i < std::min<int64_t>(threads, work->items); ++i) pool.Schedule([work] { work->Run(); });
  work->Run();
  for (int spins = 0; work->done.load(std::memory_order_acquire) < work->items; ++spins) {
    if (spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // a helper preempted on a busy host gets the core back
    }
  }
}

ffi::Error FlashAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kt, ffi::Buffer<ffi::F32> v,
                          ffi::Buffer<ffi::U8> key_valid, ffi::Buffer<ffi::S32> q_offset,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ThreadPool pool) {
  auto qd = q.dimensions(), ktd = kt.dimensions(), vd = v.dimensions(), kvd = key_valid.dimensions();
  if (qd.size() != 4 || ktd.size() != 4 || vd.size() != 4 || kvd.size() != 2)
    return ffi::Error::InvalidArgument("need q [B, T, H, D], kt [B, K, D, S], v [B, K, S', D], key_valid [B, S]");
  const int64_t b = qd[0], t = qd[1], h = qd[2], d = qd[3], k = ktd[1], s = ktd[3];
  if (!HeadDimHasTiles(d) || ktd[0] != b || ktd[2] != d || vd[0] != b || vd[1] != k || vd[2] < s ||
      vd[3] != d || kvd[0] != b || kvd[1] != s || k == 0 || h % k || t > s || out->element_count() != q.element_count())
    return ffi::Error::InvalidArgument("attention operands do not match (head dim 32, 64 or 128, H a multiple of K)");
  if (q_offset.typed_data()[0] < 0) return ffi::Error::InvalidArgument("the first query's slot is negative");
  auto work = std::make_shared<Work>();  // shared: a helper that starts late still finds it alive
  work->p = Problem{q.typed_data(), kt.typed_data(), v.typed_data(), key_valid.typed_data(), out->typed_data(),
                    b, t, h, k, h / k, d, s, vd[2], static_cast<int64_t>(q_offset.typed_data()[0]),
                    (t + kQueryTile - 1) / kQueryTile};
  work->few_queries = false;
  work->items = b * k * work->p.tiles;
  RunOnPool(work, pool);
  return ffi::Error::Success();
}

ffi::Error FewQueriesAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::U8> key_valid, ffi::Buffer<ffi::S32> q_offset,
                               ffi::ResultBuffer<ffi::F32> out, ffi::ThreadPool pool) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), kvd = key_valid.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || kvd.size() != 2)
    return ffi::Error::InvalidArgument("need q [B, T, H, D], k, v [B, K, S', D], key_valid [B, S]");
  const int64_t b = qd[0], t = qd[1], h = qd[2], d = qd[3], kh = kd[1], s = kvd[1];
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && kd[i] == vd[i];
  if (!HeadDimHasTiles(d) || !same || kd[0] != b || kd[2] < s || kd[3] != d || kvd[0] != b || kh == 0 ||
      h % kh || t > s || out->element_count() != q.element_count())
    return ffi::Error::InvalidArgument("attention operands do not match (head dim 32, 64 or 128, H a multiple of K)");
  if (q_offset.typed_data()[0] < 0) return ffi::Error::InvalidArgument("the first query's slot is negative");
  auto work = std::make_shared<Work>();
  work->p = Problem{q.typed_data(), k.typed_data(), v.typed_data(), key_valid.typed_data(), out->typed_data(),
                    b, t, h, kh, h / kh, d, s, kd[2], static_cast<int64_t>(q_offset.typed_data()[0]), 1};
  work->few_queries = true;
  work->items = b * kh;
  RunOnPool(work, pool);
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(memagent_few_queries_attention, FewQueriesAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, H, D], T <= 16
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, K, S', D]: the cache as it is
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, S', D]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // key_valid [B, S], S <= S'
                                  .Arg<ffi::Buffer<ffi::S32>>()  // q_offset []: the first query's slot
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, H, D]
                                  .Ctx<ffi::ThreadPool>());
