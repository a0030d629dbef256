// Batched matmul with a fused epilogue: C[b, m, n] = sum_k A[b][m, k] * B[b][k, n].
//
// Operands are strided (any strides, e.g. a transposed weight with B strides (1, K)), with a per-batch
// element offset computed by a functor. Inputs of any element type are converted to the accumulator
// type T (float for f32/f16/bf16, double for f64, int64_t for integers) while packing.
//
// Structure (GotoBLAS/BLIS, simplified): the output is split into MB x NB tiles; each tile is one task
// of an OpenMP loop over (batch, M-blocks, N-blocks). A task walks K in KC slices, packs its B panel into
// NR-wide column strips and its A block into MR-high row strips, and runs an MR x NR register-blocked
// micro-kernel that accumulates into a per-thread fp32 tile. When K is done, the epilogue functor gets
// the finished tile while it is still in cache:  epi(b, m0, mb, n0, nb, tile, ldt)  with
// Acc(b, m, n) = tile[(m - m0) * ldt + (n - n0)].  The epilogue runs inside the parallel region and
// must not throw.
//
// Note: the micro-kernel uses explicit FMA intrinsics, because generated code is compiled with
// -ffp-contract=off (pointwise math must round like eager torch); a fused multiply-add in a dot
// product only makes the sum more accurate.
#ifndef AOTC_MATMUL_H
#define AOTC_MATMUL_H

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "aotc_cpu.h"

#ifndef AOTC_MM_KC
#define AOTC_MM_KC 256  // K slice: an MR x KC strip of A plus an NR x KC strip of B stay in L1/L2
#endif
#ifndef AOTC_MM_MB
#define AOTC_MM_MB 240  // rows per task (a multiple of every MR below)
#endif
#ifndef AOTC_MM_NB
#define AOTC_MM_NB 256  // columns per task (a multiple of every NR below)
#endif
#ifndef AOTC_MM_MIN_PAR_FLOPS
#define AOTC_MM_MIN_PAR_FLOPS 200000.0  // below this a matmul runs on one thread
#endif

#if defined(__AVX512F__)
#define AOTC_VBYTES 64
#define AOTC_MM_MR 8  // 8 x 2 accumulators of 32 zmm registers
#elif defined(__AVX__)
#define AOTC_VBYTES 32
#define AOTC_MM_MR 6  // 6 x 2 accumulators of 16 ymm registers
#else
#define AOTC_VBYTES 16
#define AOTC_MM_MR 4
#endif

typedef float aotc_vf32 __attribute__((vector_size(AOTC_VBYTES)));
typedef double aotc_vf64 __attribute__((vector_size(AOTC_VBYTES)));
typedef int64_t aotc_vi64 __attribute__((vector_size(AOTC_VBYTES)));

static inline aotc_vf32 aotc_vfma(aotc_vf32 a, aotc_vf32 b, aotc_vf32 c) {
#if AOTC_VBYTES == 64
  return (aotc_vf32)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif AOTC_VBYTES == 32 && defined(__FMA__)
  return (aotc_vf32)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

static inline aotc_vf64 aotc_vfma(aotc_vf64 a, aotc_vf64 b, aotc_vf64 c) {
#if AOTC_VBYTES == 64
  return (aotc_vf64)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif AOTC_VBYTES == 32 && defined(__FMA__)
  return (aotc_vf64)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#else
  return a * b + c;
#endif
}

static inline aotc_vf32 aotc_vset1(float s) {
#if AOTC_VBYTES == 64
  return (aotc_vf32)_mm512_set1_ps(s);
#elif AOTC_VBYTES == 32
  return (aotc_vf32)_mm256_set1_ps(s);
#else
  return aotc_vf32{s, s, s, s};
#endif
}

static inline aotc_vf64 aotc_vset1(double s) {
#if AOTC_VBYTES == 64
  return (aotc_vf64)_mm512_set1_pd(s);
#elif AOTC_VBYTES == 32
  return (aotc_vf64)_mm256_set1_pd(s);
#else
  return aotc_vf64{s, s};
#endif
}

static inline aotc_vi64 aotc_vset1(int64_t s) {
  aotc_vi64 v;
  for (int l = 0; l < (int)(sizeof v / sizeof s); ++l) v[l] = s;
  return v;
}

static inline aotc_vi64 aotc_vfma(aotc_vi64 a, aotc_vi64 b, aotc_vi64 c) { return a * b + c; }

template <class T>
struct aotc_mm_vec;
template <>
struct aotc_mm_vec<float> {
  typedef aotc_vf32 type;
};
template <>
struct aotc_mm_vec<double> {
  typedef aotc_vf64 type;
};
template <>
struct aotc_mm_vec<int64_t> {
  typedef aotc_vi64 type;
};

// 16-bit float operands arrive as raw bits; generated code passes them as these 2-byte tags.
struct aotc_bf16_tag {
  uint16_t bits;
};
struct aotc_f16_tag {
  uint16_t bits;
};

// Element i of an operand, widened for the accumulator.
template <class S>
struct aotc_elem {
  static inline S load(const S* p, int64_t i) { return p[i]; }
};
template <>
struct aotc_elem<aotc_bf16_tag> {
  static inline float load(const aotc_bf16_tag* p, int64_t i) { return aotc_bf16_to_f32(p[i].bits); }
};
template <>
struct aotc_elem<aotc_f16_tag> {
  static inline float load(const aotc_f16_tag* p, int64_t i) { return aotc_f16_to_f32(p[i].bits); }
};

// MR x (NV vectors) register block: c[i][j] (+)= sum_k ap[k][i] * bp[k][j].
template <class T, int MR, int NV>
static inline void aotc_mm_micro(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c,
                                 int64_t ldc, bool accumulate) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      if (accumulate)
        memcpy(&acc[i][j], c + i * ldc + j * L, sizeof(V));
      else
        acc[i][j] = V{};
    }
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(&b[j], bp + k * NR + j * L, sizeof(V));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V a = aotc_vset1(ap[k * MR + i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(c + i * ldc + j * L, &acc[i][j], sizeof(V));
}

static inline int64_t aotc_roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Pack rows [r0, r0 + rows) x cols [c0, c0 + cols) of a strided matrix into strips of W rows:
// dst[strip][c][w] = M[r0 + strip * W + w][c0 + c], zero past ``rows``. For A (W = MR) rows are m
// and cols are k; for B (W = NR) we pack the transpose view: rows are n and cols are k.
template <class T, class S>
static void aotc_mm_pack(T* __restrict dst, const S* src, int64_t r0, int64_t rows, int64_t rows_pad,
                         int64_t c0, int64_t cols, int64_t sr, int64_t sc, int W) {
  for (int64_t s = 0; s < rows_pad; s += W) {
    T* d = dst + s * cols;
    if (sc <= sr) {  // walk along columns (contiguous in src when sc == 1)
      for (int w = 0; w < W; ++w) {
        const int64_t r = s + w;
        if (r < rows) {
          const int64_t base = (r0 + r) * sr + c0 * sc;
          for (int64_t c = 0; c < cols; ++c) d[c * W + w] = (T)aotc_elem<S>::load(src, base + c * sc);
        } else {
          for (int64_t c = 0; c < cols; ++c) d[c * W + w] = T(0);
        }
      }
    } else {  // walk along the strip (contiguous in src when sr == 1)
      const int64_t live = rows - s < W ? rows - s : W;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t base = r0 * sr + (c0 + c) * sc;
        int w = 0;
        for (; w < live; ++w) d[c * W + w] = (T)aotc_elem<S>::load(src, base + (s + w) * sr);
        for (; w < W; ++w) d[c * W + w] = T(0);
      }
    }
  }
}

// The batched matmul. ``offa(b)``/``offb(b)`` give the element offset of batch b in a/b.
template <class T, class SA, class SB, class OffA, class OffB, class Epi>
void aotc_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, const SA* a, OffA offa, int64_t sam,
                 int64_t sak, const SB* b, OffB offb, int64_t sbk, int64_t sbn, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int MR = AOTC_MM_MR, NV = 2, NR = NV * L;
  static_assert(AOTC_MM_MB % MR == 0 && AOTC_MM_NB % NR == 0, "tile sizes must be multiples of MR, NR");
  if (batch <= 0 || M <= 0 || N <= 0) return;
  const int64_t MB = AOTC_MM_MB, NB = AOTC_MM_NB, KC = AOTC_MM_KC;
  const int64_t mblocks = (M + MB - 1) / MB, nblocks = (N + NB - 1) / NB;
  const int64_t tasks = batch * mblocks * nblocks;
  const int64_t mbp_max = aotc_roundup(M < MB ? M : MB, MR), nbp_max = aotc_roundup(N < NB ? N : NB, NR);
  const int64_t kc_max = K < KC ? (K > 0 ? K : 1) : KC;
  // per-thread workspace: tile, packed A block, packed B panel (64-byte multiples)
  const int64_t per = aotc_roundup(mbp_max * nbp_max + mbp_max * kc_max + nbp_max * kc_max, 64 / sizeof(T));
  const bool par = tasks > 1 && 2.0 * (double)batch * (double)M * (double)N * (double)K >= AOTC_MM_MIN_PAR_FLOPS;
  const int nthreads = par ? omp_get_max_threads() : 1;
  T* ws_all = static_cast<T*>(aligned_alloc(64, (size_t)per * sizeof(T) * (size_t)nthreads));
  if (ws_all == NULL) throw std::bad_alloc();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (par)
  for (int64_t t = 0; t < tasks; ++t) {
    T* tile = ws_all + (int64_t)omp_get_thread_num() * per;
    const int64_t bi = t / (mblocks * nblocks), mi = t / nblocks % mblocks, ni = t % nblocks;
    const int64_t m0 = mi * MB, n0 = ni * NB;
    const int64_t mb = M - m0 < MB ? M - m0 : MB, nb = N - n0 < NB ? N - n0 : NB;
    const int64_t mbp = aotc_roundup(mb, MR), nbp = aotc_roundup(nb, NR);
    T* ap = tile + mbp_max * nbp_max;
    T* bp = ap + mbp_max * kc_max;
    const SA* ab = a + offa(bi);
    const SB* bb = b + offb(bi);
    if (K <= 0) memset(tile, 0, sizeof(T) * (size_t)(mbp * nbp));
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = K - k0 < KC ? K - k0 : KC;
      aotc_mm_pack<T, SB>(bp, bb, n0, nb, nbp, k0, kc, sbn, sbk, NR);
      aotc_mm_pack<T, SA>(ap, ab, m0, mb, mbp, k0, kc, sam, sak, MR);
      for (int64_t js = 0; js < nbp; js += NR)
        for (int64_t is = 0; is < mbp; is += MR)
          aotc_mm_micro<T, MR, NV>(kc, ap + is * kc, bp + js * kc, tile + is * nbp + js, nbp, k0 > 0);
    }
    epi(bi, m0, mb, n0, nb, (const T*)tile, nbp);
  }
  free(ws_all);
}

#ifdef AOTC_SELFTEST_MATMUL
#include <vector>
int main() {
  // C[2, 37, 70] = A[2][37, 300] @ B^T where B is stored transposed (strides (1, K)).
  const int64_t batch = 2, M = 37, N = 70, K = 300;
  std::vector<float> a(batch * M * K), b(batch * N * K), c(batch * M * N, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (float)((i * 7) % 13) - 6.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = (float)((i * 5) % 11) - 5.0f;
  aotc_matmul<float>(
      batch, M, N, K, a.data(), [&](int64_t bi) { return bi * M * K; }, K, 1, b.data(),
      [&](int64_t bi) { return bi * N * K; }, 1, K,
      [&](int64_t bi, int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float* tile, int64_t ldt) {
        for (int64_t m = m0; m < m0 + mb; ++m)
          for (int64_t n = n0; n < n0 + nb; ++n) c[(bi * M + m) * N + n] = tile[(m - m0) * ldt + (n - n0)];
      });
  int fails = 0;
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += (double)a[(bi * M + m) * K + k] * b[(bi * N + n) * K + k];
        fails += c[(bi * M + m) * N + n] != (float)ref;  // small integers: exact
      }
  return fails != 0;
}
#endif

#endif  // AOTC_MATMUL_H
