// The inner kernels of conv.h's packed channels-last conv (aotc_conv2d_packed), with the conv's shape and
// strides (aotc_conv_shape, aotc_conv_strides) they take:
//   aotc_conv_micro       the implicit GEMM's micro-kernel: MR output pixels x a weight panel, the input read
//                         through one pointer per (pixel, tap) -- an indirection buffer;
//   aotc_conv_row_micro   MR pixels side by side in one output row over dense pixels: one pointer, every
//                         broadcast at a compile-time offset; aotc_conv_slide3, its sliding form for a
//                         3-wide kernel row over few channels;
//   aotc_conv_row         one output row's interior in strips (aotc_conv_row_strips) of those;
//   aotc_conv_edges       the border pixels of a band of rows (windows crossing the left or right edge);
//   aotc_conv_clamp       a register epilogue (bias, clamp) the row kernels apply as they store (FIN), for
//                         conv.h's aotc_conv_out and conv_dw.h's blocks.
// What it is not: an entry point. Blocking the output into tasks, copying the input to channels-last and
// calling the epilogue are conv.h's (aotc_conv2d_packed, aotc_conv_packed_rows); conv.h's self-test
// checks these kernels through them. conv_dw.h's fused blocks and conv_pool.h call some of them directly.
#ifndef AOTC_CONV_KERNELS_H
#define AOTC_CONV_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <vector>

#include "matmul.h"

struct aotc_conv_shape {
  int64_t N, C, H, W;     // input
  int64_t O, KH, KW;      // weight
  int64_t OH, OW;         // output
  int64_t sh, sw;         // stride
  int64_t ph, pw;         // padding
  int64_t dh, dw;         // dilation
  int64_t G;              // groups
};

struct aotc_conv_strides {
  int64_t off, s0, s1, s2, s3;  // element offset and strides (n, c, h, w) or (o, i, kh, kw)
};

// An epilogue applied to accumulators before they are stored, v = min(max(acc + bias[c], lo), hi) with
// aotc_maximum's and aotc_minimum's rule that a NaN passes (a folded batch-norm and ReLU/ReLU6: conv_dw.h's
// block stages, and conv.h's packed conv writing its output straight from the registers). ``bias`` (NULL:
// none) is image n's at bias + n * bias_n; lo/hi may be -inf/inf.
template <class T>
struct aotc_conv_clamp {
  const T* bias;
  int64_t bias_n;
  T lo, hi;
  // whether the clamp can change a value: not with both bounds infinite (no activation; a NaN and the zeros'
  // signs pass through it unchanged too), where callers skip it
  bool bounded() const { return !(lo == -(T)INFINITY && hi == (T)INFINITY); }
};
template <class T>
static inline T aotc_conv_fin(T v, const aotc_conv_clamp<T>& f, const T* bias, int64_t c) {
  if (bias != NULL) v += bias[c];
  v = (v != v || v > f.lo) ? v : f.lo;
  return (v != v || v < f.hi) ? v : f.hi;
}
// The vector form: on x86, maxps/minps with v second (they return their second operand when either is a
// NaN), two instructions where the compares and blends of the generic form take six (conv_dw.h's
// aotc_block_vclamp found the same on AVX2). A zero of either sign may come out as the other.
template <class T, class V>
static inline V aotc_conv_vfin(V v, const aotc_conv_clamp<T>& f, const T* bias, int64_t c) {
  if (bias != NULL) {
    V b;
    memcpy(&b, bias + c, sizeof(V));
    v += b;
  }
  const V lo = aotc_vset1(f.lo), hi = aotc_vset1(f.hi);
#if AOTC_VBYTES == 64
  if constexpr (std::is_same<T, float>::value)  // maskz with every lane: no _mm512_undefined_ps warning
    return (V)_mm512_maskz_min_ps(0xffff, (__m512)hi, _mm512_maskz_max_ps(0xffff, (__m512)lo, (__m512)v));
#elif AOTC_VBYTES == 32 && defined(__AVX__)
  if constexpr (std::is_same<T, float>::value) return (V)_mm256_min_ps((__m256)hi, _mm256_max_ps((__m256)lo, (__m256)v));
#endif
  v = ((v != v) | (v > lo)) ? v : lo;
  return ((v != v) | (v < hi)) ? v : hi;
}

// A row of NV accumulator vectors into c; with FIN through fin's clamp after adding ``bias`` (at the row's
// first channel; NULL: none) and ``res`` (a residual laid out as c; NULL: none), in that order, as eager
// adds a conv's bias and then a skip connection.
template <class T, int NV, bool FIN, class V>
static inline __attribute__((always_inline)) void aotc_conv_store(T* c, const V* acc, const aotc_conv_clamp<T>* fin,
                                                                  const T* bias, const T* res = NULL) {
  if constexpr (!FIN) {
    aotc_mm_store_row<T, NV>(c, acc);
  } else {
    constexpr int L = (int)(sizeof(V) / sizeof(T));
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      V v = acc[j];
      if (bias != NULL) {
        V b;
        memcpy(&b, bias + j * L, sizeof(V));
        v += b;
      }
      if (res != NULL) {
        V r;
        memcpy(&r, res + j * L, sizeof(V));
        v += r;
      }
      v = aotc_conv_vfin<T>(v, *fin, (const T*)NULL, 0);
      memcpy(c + j * L, &v, sizeof(V));
    }
  }
}

// First output index o in [0, n) with lo <= o*s + d (the tap's first in-bounds output), and one past the
// last with o*s + d < hi.
static inline int64_t aotc_conv_first(int64_t d, int64_t s, int64_t lo, int64_t n) {
  int64_t o = d >= lo ? 0 : (lo - d + s - 1) / s;
  return o < n ? o : n;
}
static inline int64_t aotc_conv_end(int64_t d, int64_t s, int64_t hi, int64_t n) {
  if (d >= hi) return 0;
  int64_t o = (hi - d + s - 1) / s;
  return o < n ? o : n;
}

// Vectors of a panel one pass of a micro-kernel with MR rows computes: NV, or the largest divisor of NV
// whose MR x NH accumulators, NH panel vectors and a broadcast fit in the registers (16 on AVX2, 32 on
// AVX-512). Note: AVX2's 32-channel panels are 4 vectors, and 6 x 4 accumulators spilled in every
// iteration (the CNN ran at half the rate of its AVX-512 build): two passes of 6 x 2 instead.
template <int MR, int NV>
struct aotc_conv_split {
  static constexpr int regs = AOTC_VBYTES == 64 ? 32 : 16;
  static constexpr int pick(int nh) { return nh <= 1 || (NV % nh == 0 && MR * nh + nh + 1 <= regs) ? nh : pick(nh - 1); }
  static constexpr int value = pick(NV);
};

// R x (NV vectors) block of an implicit GEMM: c[i][:] = sum over taps t and channels k of
// ind[t * MR + i][k] * bp[(t * C + k) * NR + :], bp the packed weight panel (NR = NVP vectors, of which
// this pass computes NV).
template <class T, int MR, int NV, int NVP>
static inline void aotc_conv_micro_part(int64_t taps, int64_t C, const T* const* ind, const T* __restrict bp, T* c,
                                        int64_t ldc) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NVP * L;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t t = 0; t < taps; ++t) {
    const T* a[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) a[i] = ind[t * MR + i];
    const T* b = bp + t * C * NR;
#pragma GCC unroll 2
    for (int64_t k = 0; k < C; ++k) {
      V bv[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) memcpy(&bv[j], b + k * NR + j * L, sizeof(V));
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const V av = aotc_vset1(a[i][k]);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(av, bv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) aotc_mm_store_row<T, NV>(c + i * ldc, acc[i]);
}

// The whole panel of NV vectors, in passes of aotc_conv_split's width.
template <class T, int MR, int NV>
static inline void aotc_conv_micro(int64_t taps, int64_t C, const T* const* ind, const T* __restrict bp, T* c,
                                   int64_t ldc) {
  constexpr int L = (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T)), NH = aotc_conv_split<MR, NV>::value;
  for (int j0 = 0; j0 < NV; j0 += NH) aotc_conv_micro_part<T, MR, NH, NV>(taps, C, ind, bp + j0 * L, c + j0 * L, ldc);
}

// Rows of the conv micro-kernel: the matmul's MR, doubled for a one-vector panel (a conv with 16 or fewer
// output channels on AVX-512, 8 on AVX2) so that it still keeps 2 x MR accumulators busy.
#ifndef AOTC_CONV_MR1
#define AOTC_CONV_MR1 (2 * AOTC_MM_MR)
#endif
template <int NV>
struct aotc_conv_mr {
  static constexpr int value = NV == 1 ? AOTC_CONV_MR1 : AOTC_MM_MR;
};

// Row micro-kernel: MR output pixels side by side in one output row, each window inside the image
// horizontally, over channels-last input with dense pixels. Pixel i's taps of kernel row kh are the
// klen = KW * C consecutive inputs at a + kh * lda + i * STEP (STEP = stride * C, a compile-time constant:
// every broadcast is one load at a fixed offset from one pointer, where the MR pointers of aotc_conv_micro
// do not fit in the registers and are re-read from the stack), against the panel rows b + kh * klen * NR.
template <class T, int MR, int NV, int NVP, int STEP, bool FIN = false>
static inline void aotc_conv_row_micro_part(int64_t nkh, int64_t klen, const T* a, int64_t lda, const T* __restrict b,
                                            T* c, int64_t ldc, const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NVP * L;  // the panel's width; this pass computes NV of its NVP vectors
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t kh = 0; kh < nkh; ++kh, a += lda, b += klen * NR) {
#pragma GCC unroll 2
    for (int64_t k = 0; k < klen; ++k) {
      // Opaque to the optimiser: with a small STEP the pixels' windows overlap (pixel i + 1 at k is pixel i
      // at k + STEP), and GCC's predictive commoning would carry those values across iterations in
      // registers it then spills; each broadcast is meant to be one load.
      const T* ak = a + k;
      __asm__("" : "+r"(ak));
      V bv[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) memcpy(&bv[j], b + k * NR + j * L, sizeof(V));
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const V av = aotc_vset1(ak[i * STEP]);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(av, bv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) aotc_conv_store<T, NV, FIN>(c + i * ldc, acc[i], fin, bias);
}

template <class T, int MR, int NV, int STEP, bool FIN = false>
static inline void aotc_conv_row_micro(int64_t nkh, int64_t klen, const T* a, int64_t lda, const T* __restrict b,
                                       T* c, int64_t ldc, const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  constexpr int L = (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T)), NH = aotc_conv_split<MR, NV>::value;
  for (int j0 = 0; j0 < NV; j0 += NH)
    aotc_conv_row_micro_part<T, MR, NH, NV, STEP, FIN>(nkh, klen, a, lda, b + j0 * L, c + j0 * L, ldc, fin,
                                                       FIN && bias != NULL ? bias + j0 * L : bias);
}

// The row micro-kernel of a 3-wide kernel row at stride 1 over C = STEP channels with a panel of one or two
// vectors (32 or fewer output channels on AVX-512, 8 on AVX2: a ResNet's first stages and its stem).
// aotc_conv_row_micro_part broadcasts one input per NV multiply-adds -- with one vector as many loads as
// FMAs, the load ports the limit. Here each input of the strip's MR + 2 pixels is broadcast once and feeds
// the (up to) three outputs whose windows hold it, against the three weight vectors of its channel:
// MR + 2 + 3 NV loads per 3 MR NV FMAs. MR: aotc_conv_slide_rows (the accumulators, the 3 NV weights and a
// broadcast in the registers). Each output sums its kernel row's taps channel by channel, kw innermost
// (the packed order has kw outer): a different order of the same products.
template <class T, int MR, int NV, int STEP, bool FIN = false>
static inline void aotc_conv_slide3(int64_t nkh, const T* a, int64_t lda, const T* __restrict b, T* c, int64_t ldc,
                                    const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), C = STEP, NR = NV * L;
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  for (int64_t kh = 0; kh < nkh; ++kh, a += lda, b += 3 * C * NR) {
#pragma GCC unroll 2
    for (int k = 0; k < C; ++k) {
      const T* ak = a + k;
      __asm__("" : "+r"(ak));  // one broadcast per input, not values carried in registers (see above)
      V w[3][NV];
#pragma GCC unroll 3
      for (int kw = 0; kw < 3; ++kw)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) memcpy(&w[kw][v], b + (kw * C + k) * NR + v * L, sizeof(V));
#pragma GCC unroll 40
      for (int j = 0; j < MR + 2; ++j) {
        const V xv = aotc_vset1(ak[j * C]);
#pragma GCC unroll 3
        for (int kw = 0; kw < 3; ++kw)
          if (j - kw >= 0 && j - kw < MR)
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v) acc[j - kw][v] = aotc_vfma(xv, w[kw][v], acc[j - kw][v]);
      }
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) aotc_conv_store<T, NV, FIN>(c + i * ldc, acc[i], fin, bias);
}

// Pixels per aotc_conv_slide3 strip: MR x NV accumulators, 3 NV weights, a broadcast and one spare in the
// registers, at most the row kernel's MR (0: the row kernel instead). Two vectors only with 32 registers:
// AVX2's 4-pixel strips of two vectors ran at 0.9x its row kernel (b1c1 of the CNN, 1 thread).
template <int NV, int MR>
struct aotc_conv_slide_rows {
  static constexpr int regs = AOTC_VBYTES == 64 ? 32 : 16;
  static constexpr int fit = NV == 1 || (NV == 2 && regs == 32) ? (regs - 3 * NV - 2) / NV : 0;
  static constexpr int value = fit < 4 ? 0 : fit < MR ? fit : MR;
};

// The border pixels (ow < lo or ow >= hi: windows crossing the left or right edge) of output rows
// [oh0, oh0 + rows), the output channels of panel bp, into c[(oh - oh0) * ldr + ow * ldc + :NR]: M of them
// at a time, across rows, through the generic micro-kernel -- one pointer per (pixel, tap), a tap outside
// the image at a row of C zeros.
template <class T, int NV, int M, bool FIN = false>
static void aotc_conv_edges_by(const aotc_conv_shape& s, const T* xn, int64_t sxh, const T* bp, int64_t oh0,
                               int64_t rows, int64_t lo, int64_t hi, const T* zero, T* c, int64_t ldr, int64_t ldc,
                               const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int NR = NV * (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T));
  const int64_t taps = s.KH * s.KW, per_row = lo + (s.OW - hi), total = rows * per_row;
  if (total <= 0) return;
  // the pointers on the stack up to a 7x7 kernel's (a heap allocation per row and panel cost more than
  // the two border pixels of a 3x3 conv's row)
  constexpr int64_t held = 49 * (M < 24 ? M : 24);
  const T* held_ind[held];
  std::vector<const T*> more(taps * M > held ? (size_t)(taps * M) : 0);
  const T** ind = taps * M > held ? more.data() : held_ind;
  alignas(64) T out[M * NR];
  int64_t at[M];
  for (int64_t e0 = 0; e0 < total; e0 += M) {
    const int64_t m = aotc_mm_min(M, total - e0);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t e = e0 + (i < m ? i : 0), j = e % per_row;
      const int64_t oh = oh0 + e / per_row, ow = j < lo ? j : hi + (j - lo);
      at[i] = (oh - oh0) * ldr + ow * ldc;
      for (int64_t kh = 0; kh < s.KH; ++kh) {
        const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          const int64_t iw = ow * s.sw - s.pw + kw * s.dw;
          const bool in = i < m && ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
          ind[(size_t)((kh * s.KW + kw) * M + i)] = in ? xn + ih * sxh + iw * s.C : zero;
        }
      }
    }
    aotc_conv_micro<T, M, NV>(taps, s.C, ind, bp, out, NR);
    for (int64_t i = 0; i < m; ++i) {
      V row[NV];
      memcpy(row, out + i * NR, sizeof row);
      aotc_conv_store<T, NV, FIN>(c + at[i], row, fin, bias);
    }
  }
}

// ... in blocks of MR where there are enough border pixels to fill half of one, else in pairs.
template <class T, int NV, bool FIN = false>
static void aotc_conv_edges(const aotc_conv_shape& s, const T* xn, int64_t sxh, const T* bp, int64_t oh0,
                            int64_t rows, int64_t lo, int64_t hi, const T* zero, T* c, int64_t ldr, int64_t ldc,
                            const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  constexpr int MR = aotc_conv_mr<NV>::value;
  if (rows * (lo + s.OW - hi) >= MR / 2)
    aotc_conv_edges_by<T, NV, MR, FIN>(s, xn, sxh, bp, oh0, rows, lo, hi, zero, c, ldr, ldc, fin, bias);
  else
    aotc_conv_edges_by<T, NV, 2, FIN>(s, xn, sxh, bp, oh0, rows, lo, hi, zero, c, ldr, ldc, fin, bias);
}

// Pixels [lo, hi) (at least MR) in strips: f(std::integral_constant<int, M>, ow) for the M pixels from ow,
// M = MR, or MR2 / MR4 for a last short strip, or overlapping the strip before (equal values written twice).
template <int MR, int MR2, int MR4, class F>
static inline void aotc_conv_row_strips(int64_t lo, int64_t hi, F f) {
  for (int64_t ow = lo; ow < hi;) {
    const int64_t rem = hi - ow;
    if (rem > 3 * MR / 4) {
      ow = aotc_mm_min(ow, hi - MR);
      f(std::integral_constant<int, MR>(), ow);
      ow += MR;
    } else if (rem > MR4) {
      ow = aotc_mm_min(ow, hi - MR2);
      f(std::integral_constant<int, MR2>(), ow);
      ow += MR2;
    } else {
      ow = hi - MR4;
      f(std::integral_constant<int, MR4>(), ow);
      ow += MR4;
    }
  }
}

// Output row oh of a conv over dense channels-last input (image xn, row stride sxh), the output channels of
// one panel bp, into c[ow * ldc + :NR]: the interior [lo, hi) (at least MR pixels) in strips of MR pixels
// (a last short strip as MR / 2 or MR / 4, or overlapping the one before: the overlap writes equal values
// twice); kernel rows outside the image are skipped, not read as zeros. The border pixels: aotc_conv_edges.
template <class T, int NV, int STEP, bool FIN = false>
static void aotc_conv_row(const aotc_conv_shape& s, const T* xn, int64_t sxh, const T* bp, int64_t oh, int64_t lo,
                          int64_t hi, T* c, int64_t ldc, const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L, MR = aotc_conv_mr<NV>::value;
  constexpr int MR2 = MR / 2 > 0 ? MR / 2 : 1, MR4 = MR / 4 > 0 ? MR / 4 : 1;
  const int64_t klen = s.KW * s.C, ih = oh * s.sh - s.ph;
  const int64_t kh0 = aotc_conv_first(ih, s.dh, 0, s.KH), kh1 = aotc_conv_end(ih, s.dh, s.H, s.KH);
  const int64_t nkh = kh1 > kh0 ? kh1 - kh0 : 0, lda = s.dh * sxh;
  const T* a0 = xn + (ih + kh0 * s.dh) * sxh - s.pw * s.C;  // + ow * STEP: pixel ow's first tap
  const T* b0 = bp + kh0 * klen * NR;
  constexpr int SR = aotc_conv_slide_rows<NV, MR>::value;
  if constexpr (SR > 0 && STEP > 0) {
    if (s.KW == 3 && s.sw == 1 && s.dw == 1 && s.C == STEP) {
      aotc_conv_row_strips<SR, SR / 2, SR / 4>(lo, hi, [&](auto m, int64_t ow) {
        aotc_conv_slide3<T, decltype(m)::value, NV, STEP, FIN>(nkh, a0 + ow * STEP, lda, b0, c + ow * ldc, ldc, fin, bias);
      });
      return;
    }
  }
  aotc_conv_row_strips<MR, MR2, MR4>(lo, hi, [&](auto m, int64_t ow) {
    aotc_conv_row_micro<T, decltype(m)::value, NV, STEP, FIN>(nkh, klen, a0 + ow * STEP, lda, b0, c + ow * ldc, ldc, fin,
                                                              bias);
  });
}

#endif  // AOTC_CONV_KERNELS_H
