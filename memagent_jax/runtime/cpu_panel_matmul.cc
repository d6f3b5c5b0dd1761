// out [M, N] = x [M, K] @ w for few rows M (decode), float32, AVX-512, as an XLA FFI handler.
//
// w comes packed in column panels [T, K, 48] (panel t holds columns 48t..48t+47 of the [K, N] weight,
// row after row), so each panel is one contiguous stream: XLA:CPU's own products of 8 rows read a
// row-major weight at half to two thirds the speed of a plain read (docs/results/bench_sampler.md); this
// reads it at about the speed of a plain read. Each output sums k = 0..K-1 in order with fused multiply-adds.
// The panels are split over XLA's intra-op threads; the calling thread claims panels too, so a busy
// pool never blocks it.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 48;        // columns per panel: 3 AVX-512 vectors per row
constexpr int64_t kPrefetchRows = 8;  // panel rows ahead that are prefetched
constexpr int64_t kPartsPerThread = 2;

// Rows m0..m0+M-1 of the output at panel t's 48 columns: 3M accumulators held in registers.
template <int M>
void PanelRows(const float* x, const float* panel, float* out, int64_t k_size, int64_t n_size) {
  __m512 acc[M][3];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
  const float* w = panel;
  for (int64_t k = 0; k < k_size; ++k, w += kPanel) {
    const char* ahead = reinterpret_cast<const char*>(w + kPrefetchRows * kPanel);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    _mm_prefetch(ahead + 128, _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
    for (int m = 0; m < M; ++m) {
      const __m512 xm = _mm512_set1_ps(x[m * k_size + k]);
      acc[m][0] = _mm512_fmadd_ps(xm, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xm, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(xm, w2, acc[m][2]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 3; ++j) _mm512_storeu_ps(out + m * n_size + 16 * j, acc[m][j]);
}

void PanelAllRows(const float* x, const float* panel, float* out, int64_t m_size, int64_t k_size,
                  int64_t n_size) {
  for (int64_t m0 = 0; m0 < m_size; m0 += 8) {  // 8 rows at a time; a second pass finds the panel in L2
    const float* xs = x + m0 * k_size;
    float* os = out + m0 * n_size;
    switch (std::min<int64_t>(8, m_size - m0)) {
      case 1: PanelRows<1>(xs, panel, os, k_size, n_size); break;
      case 2: PanelRows<2>(xs, panel, os, k_size, n_size); break;
      case 3: PanelRows<3>(xs, panel, os, k_size, n_size); break;
      case 4: PanelRows<4>(xs, panel, os, k_size, n_size); break;
      case 5: PanelRows<5>(xs, panel, os, k_size, n_size); break;
      case 6: PanelRows<6>(xs, panel, os, k_size, n_size); break;
      case 7: PanelRows<7>(xs, panel, os, k_size, n_size); break;
      default: PanelRows<8>(xs, panel, os, k_size, n_size); break;
    }
  }
}

// Panels handed out in parts by an atomic counter to whichever thread asks next.
struct Work {
  const float* x;
  const float* w;
  float* out;
  int64_t m_size, k_size, n_size, panels, per_part, parts;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      for (int64_t t = p * per_part; t < std::min(panels, (p + 1) * per_part); ++t)
        PanelAllRows(x, w + t * k_size * kPanel, out + t * kPanel, m_size, k_size, n_size);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error PanelMatmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> out,
                       ffi::ThreadPool pool) {
  auto wd = w.dimensions();
  if (wd.size() != 3 || wd[2] != kPanel) return ffi::Error::InvalidArgument("panels must be [T, K, 48]");
  const int64_t panels = wd[0], k_size = wd[1], n_size = panels * kPanel;
  if (k_size == 0 || x.element_count() % k_size || out->element_count() != x.element_count() / k_size * n_size)
    return ffi::Error::InvalidArgument("x [..., K] and out [..., 48T] do not match the panels [T, K, 48]");
  auto work = std::make_shared<Work>();  // shared: a helper that starts late still finds it alive
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->out = out->typed_data();
  work->m_size = x.element_count() / k_size;
  work->k_size = k_size;
  work->n_size = n_size;
  work->panels = panels;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(panels, kPartsPerThread * threads));
  work->per_part = (panels + want - 1) / want;
  work->parts = panels ? (panels + work->per_part - 1) / work->per_part : 0;
  for (int64_t i = 1; i < std::min<int64_t>(threads, work->parts); ++i) pool.Schedule([work] { work->Run(); });
  work->Run();  // claims parts until none is left: only parts already running elsewhere remain
  for (int spins = 0; work->done.load(std::memory_order_acquire) < work->parts; ++spins) {
    if (spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // a helper preempted on a busy host gets the core back
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(memagent_panel_matmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // panels [T, K, 48]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [..., 48T]
                                  .Ctx<ffi::ThreadPool>());
