// bf16 matmuls on bf16 dot-product instructions: the pieces aotc_mm_drive (matmul.h) runs when its packed
// operands are bf16 pairs (aotc_matmul_packed_bf16) instead of values of the accumulator type.
//
// A pair is two bf16 of consecutive k in 32 bits, the even k in the low half (VDPBF16PS's order). B is
// packed at build time (aot/codegen/cpp_pack.py, ``pairs``) into panels [ceil(N / NR)][ceil(K / 2)][NR]
// of pairs, zero past N and past K; A is packed per call into MR-row strips of pairs, k-major, as
// aotc_mm_pack_a packs values. The driver then runs as for fp32 with K counting pairs.
// The micro-kernel: with AVX512_BF16 one VDPBF16PS per (row, vector) and pair, 32 multiply-adds (twice the
// work of an fp32 FMA); the products of bf16 are exact in fp32, the sums round to nearest even and
// subnormals flush to zero, as in torch's own CPU bf16 matmul (oneDNN). On an AVX-512 CPU without it, each
// pair is widened to two fp32 values (a shift, a mask) for two FMAs: the same layout, at fp32 speed.
// What it is not: the driver, nor AMX. matmul.h includes this file before its driver, which calls it; on
// its own this file includes matmul.h first (whose include of it then defines what follows).
#ifndef AOTC_MATMUL_H
#include "matmul.h"
#endif
#ifndef AOTC_MATMUL_BF16_H
#define AOTC_MATMUL_BF16_H

// Whether this CPU has VDPBF16PS (asked once). aotc_mm_dpbf16 >= 0 overrides it for the self-test: 0 the
// widening kernel, 1 VDPBF16PS where the CPU has it.
[[maybe_unused]] static int aotc_mm_dpbf16 = -1;
static inline bool aotc_mm_have_dpbf16() {
#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 10
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16"));
  return has && aotc_mm_dpbf16 != 0;
#else
  return false;
#endif
}

// Rows [m0, m0 + mb) x pairs [k0, k0 + kc) of a bf16 A with ``ka`` columns into the strips of aotc_mm_strip:
// strip s at dst + s * MR * kc, pair c of row w at d[c * MR + w]; zero past A's rows and columns.
template <int MR>
static void aotc_mm_pack_a_pairs(uint32_t* __restrict dst, const aotc_bf16_tag* src, int64_t m0, int64_t mb, int64_t k0,
                                 int64_t kc, int64_t sam, int64_t sak, int64_t ka) {
  const int64_t strips = (mb + MR - 1) / MR;
  // pairs whose both halves lie inside A's columns
  const int64_t whole = aotc_mm_min(kc, ka / 2 - k0 > 0 ? ka / 2 - k0 : 0);
  for (int64_t s = 0; s < strips; ++s) {
    int64_t r0;
    int h;
    aotc_mm_strip(mb, MR, s, &r0, &h);
    uint32_t* d = dst + s * MR * kc;
    for (int w = 0; w < MR; ++w) {
      if (w >= h) {
        for (int64_t c = 0; c < kc; ++c) d[c * MR + w] = 0;
        continue;
      }
      const aotc_bf16_tag* row = src + (m0 + r0 + w) * sam;
      int64_t c = 0;
      if (sak == 1)
        for (; c < whole; ++c) memcpy(&d[c * MR + w], row + 2 * (k0 + c), sizeof(uint32_t));
      for (; c < kc; ++c) {
        const int64_t k = 2 * (k0 + c);
        const uint32_t lo = k < ka ? row[k * sak].bits : 0, hi = k + 1 < ka ? row[(k + 1) * sak].bits : 0;
        d[c * MR + w] = lo | hi << 16;
      }
    }
  }
}

// aotc_mm_drive's A packing for its element P: values (aotc_mm_pack_a) or bf16 pairs.
template <class T, class SA, int MR, class P>
static inline void aotc_mm_pack_a_any(P* dst, const SA* src, int64_t m0, int64_t mb, int64_t k0, int64_t kc,
                                      int64_t sam, int64_t sak, int64_t ka) {
  if constexpr (std::is_same<P, T>::value) {
    (void)ka;
    const int few = aotc_mm_few_rows<MR>(mb);  // one or two rows: dense, for aotc_mm_micro_few
    if (few == 1)
      aotc_mm_pack_a<T, SA, 1>(dst, src, m0, mb, k0, kc, sam, sak);
    else if (few == 2)
      aotc_mm_pack_a<T, SA, 2>(dst, src, m0, mb, k0, kc, sam, sak);
    else
      aotc_mm_pack_a<T, SA, MR>(dst, src, m0, mb, k0, kc, sam, sak);
  } else {
    static_assert(std::is_same<SA, aotc_bf16_tag>::value && std::is_same<P, uint32_t>::value, "pairs are of bf16");
    aotc_mm_pack_a_pairs<MR>(dst, src, m0, mb, k0, kc, sam, sak, ka);
  }
}

// The prefetch of aotc_mm_micro: rows of the next panel ``pf`` spread over the first ``pfk`` of the kc steps.
static inline int aotc_mm_pf_every(int64_t kc, int64_t pfk) {
  const int64_t spread = pfk > 0 ? kc / pfk : 1;
  return spread < 1 ? 1 : (spread > AOTC_MM_PF_SPREAD ? AOTC_MM_PF_SPREAD : (int)spread);
}

// R x (NV vectors) block over pairs, widened: each pair's halves as two fp32 values, two FMAs.
template <int MR, int R, int NV>
static void aotc_mm_micro_widen(int64_t kc, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* c,
                                int64_t ldc, bool accumulate, const uint32_t* pf, int64_t pfk) {
  typedef aotc_vf32 V;
  typedef uint32_t VU __attribute__((vector_size(sizeof(V))));
  constexpr int L = (int)(sizeof(V) / sizeof(float)), NR = NV * L;
  V acc[R][NV];
  aotc_mm_load_acc<float>(acc, c, ldc, accumulate);
  const int every = aotc_mm_pf_every(kc, pfk);
  for (int64_t k = 0; k < kc; ++k) {
    if (pf != NULL && k % every == 0 && k / every < pfk)
      aotc_mm_prefetch_row<NR>(pf + k / every * NR);
    V lo[NV], hi[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      VU w;
      memcpy(&w, bp + k * NR + j * L, sizeof(VU));
      const VU wl = w << 16, wh = w & 0xffff0000u;
      memcpy(&lo[j], &wl, sizeof(V));
      memcpy(&hi[j], &wh, sizeof(V));
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const uint32_t pa = ap[k * MR + i];
      const V al = aotc_vset1(aotc_bits_f32(pa << 16)), ah = aotc_vset1(aotc_bits_f32(pa & 0xffff0000u));
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(ah, hi[j], aotc_vfma(al, lo[j], acc[i][j]));
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) aotc_mm_store_row<float, NV>(c + i * ldc, acc[i]);
}

#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 10
// One step of aotc_mm_micro_dpbf16: pair k of its R rows against the panel's row of pairs k.
template <int MR, int R, int NV>
__attribute__((target("avx512bf16"), always_inline)) static inline void aotc_mm_step_dpbf16(aotc_vf32 (&acc)[R][NV], int64_t k,
                                                                                           const uint32_t* __restrict ap,
                                                                                           const uint32_t* __restrict bp) {
  __m512i b[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) b[j] = _mm512_loadu_si512(bp + (k * NV + j) * 16);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    const __m512i a = _mm512_set1_epi32((int)ap[k * MR + i]);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = (aotc_vf32)_mm512_dpbf16_ps((__m512)acc[i][j], (__m512bh)a, (__m512bh)b[j]);
  }
}

// R x (NV vectors) block over pairs on VDPBF16PS (compiled for AVX512_BF16 whatever the package's level:
// called only where aotc_mm_have_dpbf16 says the CPU has it). The first steps also prefetch the next
// panel, as aotc_mm_micro's do; the rest run without the test.
template <int MR, int R, int NV>
__attribute__((target("avx512bf16"))) static void aotc_mm_micro_dpbf16(int64_t kc, const uint32_t* __restrict ap,
                                                                       const uint32_t* __restrict bp, float* c,
                                                                       int64_t ldc, bool accumulate, const uint32_t* pf,
                                                                       int64_t pfk) {
  constexpr int NR = NV * 16;
  aotc_vf32 acc[R][NV];
  aotc_mm_load_acc<float>(acc, c, ldc, accumulate);
  const int every = aotc_mm_pf_every(kc, pfk);
  int64_t k = 0;
  if (pf != NULL)
    for (; k < kc && k / every < pfk; ++k) {
      if (k % every == 0)
        aotc_mm_prefetch_row<NR>(pf + k / every * NR);
      aotc_mm_step_dpbf16<MR, R, NV>(acc, k, ap, bp);
    }
#pragma GCC unroll 2
  for (; k < kc; ++k) aotc_mm_step_dpbf16<MR, R, NV>(acc, k, ap, bp);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) aotc_mm_store_row<float, NV>(c + i * ldc, acc[i]);
}
#endif

// A strip of ``h`` (<= MR) rows of pairs against a panel: the VDPBF16PS kernel where the CPU has it.
template <int MR, int NV, int R = MR>
static inline void aotc_mm_micro_pairs(int h, int64_t kc, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc,
                                       bool accumulate, const uint32_t* pf, int64_t pfk) {
  if constexpr (R >= 1) {
    if (h != R) return aotc_mm_micro_pairs<MR, NV, R - 1>(h, kc, ap, bp, c, ldc, accumulate, pf, pfk);
#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 10
    if (aotc_mm_have_dpbf16()) return aotc_mm_micro_dpbf16<MR, R, NV>(kc, ap, bp, c, ldc, accumulate, pf, pfk);
#endif
    aotc_mm_micro_widen<MR, R, NV>(kc, ap, bp, c, ldc, accumulate, pf, pfk);
  }
}

#endif  // AOTC_MATMUL_BF16_H
