// Streaming (flash) attention with a fused epilogue: out[b, l, :] = softmax_j(q[l] . k[j] * scale (+ mask)) @ v.
//
// The L x S score matrix is never held: each task takes one batch position b (batch dims and the query
// head, flattened) and a block of MB query rows, walks the keys in blocks of NB, and keeps a running
// maximum and sum per query (online softmax). The task packs its query block once, transposed and scaled
// (E x MB: queries along the vector lanes), then per key block computes the scores *transposed*,
// st[j][r] = k[j] . q[r] (keys as the broadcast rows of a register-blocked micro-kernel, read straight
// from K, so K is never packed), which makes the softmax a vertical walk over key rows with the queries
// in the lanes: maxima, exps and sums need no horizontal reductions (one pass for the maxima, one for the
// exps and sums, each keeping its running values in registers). The output accumulator (MB x Ev) is
// rescaled by exp(old max - new max) and gets P @ V from the same micro-kernel (queries as the broadcast
// rows, read from st down its columns; V rows from a block packed contiguous by the exp pass, which walks
// the keys anyway). When the keys are done each row is divided by its sum (0 for a row with no key left: zeros,
// as torch gives) and the epilogue functor gets the finished rows while they are in cache:
//   epi(b, l0, lb, tile, ldt)  with  Acc(b, l, d) = tile[(l - l0) * ldt + d].
// The epilogue runs inside the parallel region and must not throw.
//
// Operands are strided with a per-batch element offset from a functor (the k/v functors map a query head
// to its kv head, so GQA reads k/v by index). mask_kind: 0 none, 1 bool (nonzero attends), 2 additive.
// causal: row l attends to keys j <= l (top-left aligned); key blocks past the last row's diagonal are
// skipped, and so are the keys after the last one a bool key-padding mask keeps. Causal and key masks are
// applied in the softmax's registers (aotc_attn_column), not written into the scores. Elements are widened
// to float as they are read (16-bit floats arrive as the tags of matmul.h).
//
// Note: explicit FMA intrinsics, as in matmul.h: generated code is compiled with -ffp-contract=off.
// Note (small heads): at BERT's shapes (L = S = 128, head dim 64) the exps cost about as much as either
// product -- 8192 of them per task against 2 x 64 FMAs per score -- so the softmax exp is a vector
// polynomial with FMAs (aotc_attn_exp), not the scalar aotc_expf the vectoriser would widen.
#ifndef AOTC_ATTENTION_H
#define AOTC_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <new>
#include <type_traits>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "aotc_cpu.h"
#include "matmul.h"  // the 16-bit operand tags and aotc_elem

#ifndef AOTC_ATTN_MB
#define AOTC_ATTN_MB 64  // query rows per task (a multiple of the vector width)
#endif
#ifndef AOTC_ATTN_MB_CAUSAL
#define AOTC_ATTN_MB_CAUSAL 32  // the same for causal attention (see aotc_attention)
#endif
#ifndef AOTC_ATTN_NB
#define AOTC_ATTN_NB 128  // keys per block
#endif
#ifndef AOTC_ATTN_MIN_PAR_FLOPS
#define AOTC_ATTN_MIN_PAR_FLOPS 200000.0  // below this attention runs on one thread
#endif

#if defined(__AVX512F__)
#define AOTC_ATTN_VBYTES 64
#define AOTC_ATTN_MR 8  // broadcast rows per micro-kernel: 8 x 2 accumulators of 32 zmm registers
#elif defined(__AVX__)
#define AOTC_ATTN_VBYTES 32
#define AOTC_ATTN_MR 6  // 6 x 2 accumulators of 16 ymm registers
#else
#define AOTC_ATTN_VBYTES 16
#define AOTC_ATTN_MR 4
#endif

typedef float aotc_attn_v __attribute__((vector_size(AOTC_ATTN_VBYTES)));
static const int aotc_attn_vl = AOTC_ATTN_VBYTES / 4;

static inline aotc_attn_v aotc_attn_fma(aotc_attn_v a, aotc_attn_v b, aotc_attn_v c) {
#if AOTC_ATTN_VBYTES == 64
  return (aotc_attn_v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif AOTC_ATTN_VBYTES == 32 && defined(__FMA__)
  return (aotc_attn_v)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

static inline aotc_attn_v aotc_attn_set1(float s) {
#if AOTC_ATTN_VBYTES == 64
  return (aotc_attn_v)_mm512_set1_ps(s);
#elif AOTC_ATTN_VBYTES == 32
  return (aotc_attn_v)_mm256_set1_ps(s);
#else
  return aotc_attn_v{s, s, s, s};
#endif
}

static inline aotc_attn_v aotc_attn_load(const float* p) {
  aotc_attn_v v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void aotc_attn_store(float* p, aotc_attn_v v) { memcpy(p, &v, sizeof v); }

// The lanes an exp keeps (the others give 0): a k-mask on AVX-512, a mask vector (all ones: kept) elsewhere.
#if AOTC_ATTN_VBYTES == 64
typedef __mmask16 aotc_attn_keep;
static inline aotc_attn_keep aotc_attn_keep_all() { return (__mmask16)0xffff; }
// the lanes whose index (``lane``, as floats) is at least ``first``: a causal block's row of keys
static inline aotc_attn_keep aotc_attn_keep_from(aotc_attn_v lane, aotc_attn_v first) {
  return _mm512_cmp_ps_mask((__m512)lane, (__m512)first, _CMP_GE_OQ);
}
#else
typedef int32_t aotc_attn_keep __attribute__((vector_size(AOTC_ATTN_VBYTES)));
static inline aotc_attn_keep aotc_attn_keep_all() { return aotc_attn_keep{} == 0; }
static inline aotc_attn_keep aotc_attn_keep_from(aotc_attn_v lane, aotc_attn_v first) { return lane >= first; }
#endif

// e^x per lane for the softmax, where x = score - running max <= 0 (or NaN, which it keeps), and 0 in the
// lanes ``keep`` leaves out: Cody-Waite reduction x = n ln2 + r and Cephes' degree-6 polynomial as in
// aotc_expf (aotc_cpu.h), here with FMAs and 2^n applied by scalef (AVX-512) or the exponent bits (AVX2).
// Arguments below -87.3 give exactly 0 (true values there are subnormal, below 1.2e-38), so a masked score
// (-inf) weighs nothing. Those lanes are not clamped first: whatever they compute (NaN for -inf, a wrapped
// exponent on AVX2) is dropped by the same mask as the masked lanes (AVX-512: scalef's zeroing mask).
static inline aotc_attn_v aotc_attn_exp(aotc_attn_v x, aotc_attn_keep keep) {
#if AOTC_ATTN_VBYTES == 64 || (AOTC_ATTN_VBYTES == 32 && defined(__FMA__) && defined(__AVX2__))
#if AOTC_ATTN_VBYTES == 64
#define AOTC_ATTN_PS(op) _mm512_##op##_ps
  typedef __m512 V;
#else
#define AOTC_ATTN_PS(op) _mm256_##op##_ps
  typedef __m256 V;
#endif
  const V v = (V)x, lo = AOTC_ATTN_PS(set1)(-87.3f);
  const V t = AOTC_ATTN_PS(mul)(v, AOTC_ATTN_PS(set1)(1.44269504088896341f));
#if AOTC_ATTN_VBYTES == 64
  // the maskz forms: gcc 12's plain ones read an uninitialised vector (a -Wuninitialized false alarm)
  const V n = _mm512_maskz_roundscale_ps((__mmask16)0xffff, t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const V n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  V r = AOTC_ATTN_PS(fnmadd)(n, AOTC_ATTN_PS(set1)(0.693359375f), v);
  r = AOTC_ATTN_PS(fnmadd)(n, AOTC_ATTN_PS(set1)(-2.12194440e-4f), r);
  V p = AOTC_ATTN_PS(set1)(1.9875691500e-4f);
  p = AOTC_ATTN_PS(fmadd)(p, r, AOTC_ATTN_PS(set1)(1.3981999507e-3f));
  p = AOTC_ATTN_PS(fmadd)(p, r, AOTC_ATTN_PS(set1)(8.3334519073e-3f));
  p = AOTC_ATTN_PS(fmadd)(p, r, AOTC_ATTN_PS(set1)(4.1665795894e-2f));
  p = AOTC_ATTN_PS(fmadd)(p, r, AOTC_ATTN_PS(set1)(1.6666665459e-1f));
  p = AOTC_ATTN_PS(fmadd)(p, r, AOTC_ATTN_PS(set1)(5.0000001201e-1f));
  p = AOTC_ATTN_PS(fmadd)(p, AOTC_ATTN_PS(mul)(r, r), r);
  p = AOTC_ATTN_PS(add)(p, AOTC_ATTN_PS(set1)(1.0f));
#if AOTC_ATTN_VBYTES == 64
  keep = _mm512_mask_cmp_ps_mask(keep, v, lo, _CMP_NLT_UQ);  // x >= -87.3 or NaN
  return (aotc_attn_v)_mm512_maskz_scalef_ps(keep, p, n);
#else  // n >= -126 in the kept lanes, so 2^n is a normal float built from its exponent bits
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const V out = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  const V low = _mm256_cmp_ps(v, lo, _CMP_LT_OQ);
  return (aotc_attn_v)_mm256_and_ps(_mm256_andnot_ps(low, out), _mm256_castsi256_ps((__m256i)keep));
#endif
#undef AOTC_ATTN_PS
#else
  aotc_attn_v out;
  for (int i = 0; i < aotc_attn_vl; ++i) out[i] = x[i] < -87.3f || !keep[i] ? 0.0f : aotc_expf(x[i]);
  return out;
#endif
}

static inline aotc_attn_v aotc_attn_max(aotc_attn_v a, aotc_attn_v b) { return a > b ? a : b; }

// aotc_attn_max(a, b) in the lanes ``keep`` keeps, b in the others
static inline aotc_attn_v aotc_attn_max_kept(aotc_attn_v a, aotc_attn_v b, aotc_attn_keep keep) {
#if AOTC_ATTN_VBYTES == 64
  return (aotc_attn_v)_mm512_mask_max_ps((__m512)b, keep, (__m512)a, (__m512)b);  // b where a is NaN, as above
#else
  return keep ? aotc_attn_max(a, b) : b;
#endif
}

// c[i][0 .. NV vectors) (+)= sum_k a[i * sai + k * sak] * b[k * ldb + ...] for R rows: the shared shape of
// the transposed scores (a = K rows, b = Q^T) and of P @ V (a = P down the columns of st, b = V). With
// ``cmax``, cmax[0 .. NV vectors) also becomes the maximum of itself and the R rows of c, while they are
// in registers (the scores' running maximum per query, without a pass over st; a NaN is passed over).
template <int R, int NV, class S>
static inline void aotc_attn_micro(int64_t kn, const S* __restrict a, int64_t sai, int64_t sak,
                                   const float* __restrict b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                                   float* cmax = NULL) {
  // fully unrolled so that the accumulators live in registers
  aotc_attn_v acc[R][NV];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      acc[i][j] = accumulate ? aotc_attn_load(c + i * ldc + j * aotc_attn_vl) : aotc_attn_set1(0.0f);
  for (int64_t k = 0; k < kn; ++k) {
    aotc_attn_v bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = aotc_attn_load(b + k * ldb + j * aotc_attn_vl);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const aotc_attn_v av = aotc_attn_set1((float)aotc_elem<S>::load(a, i * sai + k * sak));
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_attn_fma(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) aotc_attn_store(c + i * ldc + j * aotc_attn_vl, acc[i][j]);
  if (cmax) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      aotc_attn_v run = aotc_attn_load(cmax + j * aotc_attn_vl);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) run = aotc_attn_max(acc[i][j], run);
      aotc_attn_store(cmax + j * aotc_attn_vl, run);
    }
  }
}

// The last ``rows`` (< MR) rows of a panel.
template <int NV, int R, class S>
static inline void aotc_attn_tail(int64_t rows, int64_t kn, const S* a, int64_t sai, int64_t sak, const float* b,
                                  int64_t ldb, float* c, int64_t ldc, bool accumulate, float* cmax) {
  if constexpr (R >= 1) {
    if (rows == R) return aotc_attn_micro<R, NV>(kn, a, sai, sak, b, ldb, c, ldc, accumulate, cmax);
    aotc_attn_tail<NV, R - 1>(rows, kn, a, sai, sak, b, ldb, c, ldc, accumulate, cmax);
  }
}

// Rows [0, rows) of one column panel of NV vectors, in blocks of MR rows and a tail of fewer.
// With ``pf`` (rows of A contiguous), each block first prefetches the rows of the next: K rows are a few
// cache lines each, a head's stride apart, too short for the hardware prefetcher to follow, and GPT-2's
// q/k/v (4 x 128 tokens) do not fit in L2.
template <int NV, int MR, class S>
static inline void aotc_attn_panel(int64_t rows, int64_t kn, const S* a, int64_t sai, int64_t sak, const float* b,
                                   int64_t ldb, float* c, int64_t ldc, bool accumulate, bool pf, float* cmax) {
  int64_t i = 0;
  for (; i + MR <= rows; i += MR) {
    if (pf)
      for (int64_t r = i + MR; r < i + 2 * MR && r < rows; ++r)
        for (int64_t e = 0; e < kn; e += 64 / (int64_t)sizeof(S)) __builtin_prefetch(a + r * sai + e);
    aotc_attn_micro<MR, NV>(kn, a + i * sai, sai, sak, b, ldb, c + i * ldc, ldc, accumulate, cmax);
  }
  if (i < rows)
    aotc_attn_tail<NV, MR - 1>(rows - i, kn, a + i * sai, sai, sak, b, ldb, c + i * ldc, ldc, accumulate, cmax);
}

// c (rows x cols, cols a multiple of the vector width) (+)= A (rows x kn, element (i, k) at a[i * sai +
// k * sak]) @ b (kn x cols): panels of 4 vectors where the registers hold them (AVX-512: 6 x 4
// accumulators, each broadcast of A serving 4 FMAs), then of 2 and 1. With ``cmax`` (cols floats), each
// column's maximum over the rows of c is folded into it (aotc_attn_micro).
template <class S>
static inline void aotc_attn_gemm(int64_t rows, int64_t cols, int64_t kn, const S* a, int64_t sai, int64_t sak,
                                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                                  float* cmax = NULL) {
  const int64_t vl = aotc_attn_vl;
  bool pf = sak == 1;  // the first panel brings A's rows in; the others find them in cache
  int64_t j = 0;
#if AOTC_ATTN_VBYTES == 64
  for (; j + 4 * vl <= cols; j += 4 * vl, pf = false)
    aotc_attn_panel<4, 6>(rows, kn, a, sai, sak, b + j, ldb, c + j, ldc, accumulate, pf, cmax ? cmax + j : NULL);
#endif
  for (; j + 2 * vl <= cols; j += 2 * vl, pf = false)
    aotc_attn_panel<2, AOTC_ATTN_MR>(rows, kn, a, sai, sak, b + j, ldb, c + j, ldc, accumulate, pf, cmax ? cmax + j : NULL);
  for (; j < cols; j += vl, pf = false)
    aotc_attn_panel<1, AOTC_ATTN_MR>(rows, kn, a, sai, sak, b + j, ldb, c + j, ldc, accumulate, pf, cmax ? cmax + j : NULL);
}

// One pass down the nb rows of st (queries in the lanes), G vectors of lanes at a time so that the running
// values stay in registers: without EXP, top = max(from, the column's maximum); with EXP, every element
// becomes exp(element - from) and sum gets the column's total added. ``row(j)`` runs before row j's
// vectors (the exp pass packs V row j there, in the first group of lanes only).
// Masks, applied in registers rather than by writing -inf into st in a pass of their own:
// - causal: row j keeps the lanes from ``diag + j`` on (lanes counted from st's first): a lane left out
//   does not count in the maximum and its exp is 0 (the kept lanes compute exactly what they did when
//   the others held -inf); rows with diag + j <= 0 keep every lane and take the loop without the mask.
// - KEYS 1: kb[j] is 0 or -inf, a bool mask per key: a -inf row is passed over by the max pass and
//   becomes zeros in the exp pass, with no exps. KEYS 2: kb[j] is added to row j in place (max pass).
template <bool EXP, int G, int KEYS, class Row>
static inline void aotc_attn_column(int64_t nb, float* st, int64_t lds, const float* from, const float* kb, int64_t diag,
                                    float* top, float* sum, Row&& row) {
  const int vl = aotc_attn_vl;
  aotc_attn_v run[G], base[G], lane[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    base[g] = aotc_attn_load(from + g * vl);
    run[g] = EXP ? aotc_attn_load(sum + g * vl) : base[g];
    for (int i = 0; i < vl; ++i) lane[g][i] = (float)(g * vl + i);
  }
  auto step = [&](int64_t j, auto causal) {
    row(j);
    if (KEYS == 1 && kb[j] != 0.0f) {
      if (EXP)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) aotc_attn_store(st + j * lds + g * vl, aotc_attn_set1(0.0f));
      return;
    }
    const aotc_attn_v first = aotc_attn_set1(decltype(causal)::value ? (float)(diag + j) : 0.0f);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const aotc_attn_keep keep = decltype(causal)::value ? aotc_attn_keep_from(lane[g], first) : aotc_attn_keep_all();
      aotc_attn_v x = aotc_attn_load(st + j * lds + g * vl);
      if (EXP) {
        const aotc_attn_v e = aotc_attn_exp(x - base[g], keep);
        aotc_attn_store(st + j * lds + g * vl, e);
        run[g] += e;
      } else {
        if (KEYS == 2) {
          x += aotc_attn_set1(kb[j]);
          aotc_attn_store(st + j * lds + g * vl, x);
        }
        // a NaN score is passed over here and poisons the sum instead
        run[g] = decltype(causal)::value ? aotc_attn_max_kept(x, run[g], keep) : aotc_attn_max(x, run[g]);
      }
    }
  };
  const int64_t plain = diag >= 1 ? 0 : (1 - diag < nb ? 1 - diag : nb);  // rows [0, plain) keep every lane
  int64_t j = 0;
  for (; j < plain; ++j) step(j, std::false_type());
  for (; j < nb; ++j) step(j, std::true_type());
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) aotc_attn_store((EXP ? sum : top) + g * vl, run[g]);
}

// aotc_attn_column over all lbp lanes (a multiple of the vector width), ``row`` in the first pass only;
// ``keys``: the column's KEYS.
template <bool EXP, int KEYS, class Row>
static inline void aotc_attn_columns_k(int64_t nb, float* st, int64_t lbp, const float* from, const float* kb,
                                       int64_t diag, float* top, float* sum, Row&& row) {
  const int64_t vl = aotc_attn_vl;
  auto none = [](int64_t) {};
  int64_t c = 0;
  if (c + 4 * vl <= lbp) {
    aotc_attn_column<EXP, 4, KEYS>(nb, st, lbp, from, kb, diag, top, sum, row);
    c += 4 * vl;
  } else {
    aotc_attn_column<EXP, 1, KEYS>(nb, st, lbp, from, kb, diag, top, sum, row);
    c += vl;
  }
  for (; c + 4 * vl <= lbp; c += 4 * vl)
    aotc_attn_column<EXP, 4, KEYS>(nb, st + c, lbp, from + c, kb, diag - c, top ? top + c : NULL, sum ? sum + c : NULL,
                                   none);
  for (; c < lbp; c += vl)
    aotc_attn_column<EXP, 1, KEYS>(nb, st + c, lbp, from + c, kb, diag - c, top ? top + c : NULL, sum ? sum + c : NULL,
                                   none);
}

template <bool EXP, class Row>
static inline void aotc_attn_columns(int64_t nb, float* st, int64_t lbp, const float* from, int keys, const float* kb,
                                     int64_t diag, float* top, float* sum, Row&& row) {
  if (keys == 1) aotc_attn_columns_k<EXP, 1>(nb, st, lbp, from, kb, diag, top, sum, row);
  else if (keys == 2 && !EXP) aotc_attn_columns_k<EXP, 2>(nb, st, lbp, from, kb, diag, top, sum, row);
  else aotc_attn_columns_k<EXP, 0>(nb, st, lbp, from, kb, diag, top, sum, row);
}

// vb[d] = v[at + d * sve] for d < Ev, zeros up to evp: a V row packed into whole vectors, as P @ V reads it.
// WHOLE: contiguous floats of whole vectors (Ev == evp), copied by vectors (no tail loop: a zero fill in the
// exp pass's loop became a memset call, around which gcc kept the loop's running values on the stack).
template <bool WHOLE, class SV>
static inline void aotc_attn_pack_v_row(const SV* v, int64_t at, int64_t sve, int64_t Ev, int64_t evp, float* vb) {
  if constexpr (WHOLE && std::is_same<SV, float>::value) {
    for (int64_t d = 0; d < evp; d += aotc_attn_vl) aotc_attn_store(vb + d, aotc_attn_load(v + at + d));
  } else {
    for (int64_t d = 0; d < evp; ++d) vb[d] = d < Ev ? (float)aotc_elem<SV>::load(v, at + d * sve) : 0.0f;
  }
}

// qt[e * lbp + r] = scale * q[at + r * sql + e * sqe] for rows r < lb (rows lb .. lbp are zeros): the query
// block transposed, queries along the lanes. Contiguous float rows go through 8 x 8 register transposes
// (element-wise, the strided reads were an eighth of the whole kernel's time on BERT's heads).
#if defined(__AVX__)
static inline void aotc_attn_t8(const float* src, int64_t lds, float* dst, int64_t ldd, __m256 sc) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3
    r[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_mul_ps(sc, _mm256_permute2f128_ps(r[i], r[4 + i], 0x20)));
    _mm256_storeu_ps(dst + (4 + i) * ldd, _mm256_mul_ps(sc, _mm256_permute2f128_ps(r[i], r[4 + i], 0x31)));
  }
}
#endif

template <class SQ>
static inline void aotc_attn_pack_q(const SQ* q, int64_t at, int64_t sql, int64_t sqe, int64_t lb, int64_t lbp, int64_t E,
                                    float scale, float* qt) {
  int64_t r8 = 0, e8 = 0;  // the block done by transposes: rows [0, r8) x elements [0, e8)
#if defined(__AVX__)
  if constexpr (std::is_same<SQ, float>::value) {
    if (sqe == 1) {
      r8 = lb / 8 * 8;
      e8 = E / 8 * 8;
      const __m256 sc = _mm256_set1_ps(scale);
      for (int64_t r0 = 0; r0 < r8; r0 += 8) {
        for (int64_t r = r0 + 8; r < r0 + 16 && r < lb; ++r)  // the next 8 rows, a row stride apart each
          for (int64_t e = 0; e < E; e += 16) __builtin_prefetch(q + at + r * sql + e);
        for (int64_t e0 = 0; e0 < e8; e0 += 8) aotc_attn_t8(q + at + r0 * sql + e0, sql, qt + e0 * lbp + r0, lbp, sc);
      }
    }
  }
#endif
  for (int64_t e = 0; e < E; ++e) {
    float* row = qt + e * lbp;
#pragma omp simd
    for (int64_t r = e < e8 ? r8 : 0; r < lb; ++r) row[r] = scale * (float)aotc_elem<SQ>::load(q, at + r * sql + e * sqe);
    for (int64_t r = lb; r < lbp; ++r) row[r] = 0.0f;
  }
}

static inline int64_t aotc_attn_roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

template <class SQ, class SK, class SV, class SM, class OffQ, class OffK, class OffV, class OffM, class Epi>
static void aotc_attention(int64_t nbatch, int64_t L, int64_t S, int64_t E, int64_t Ev, float scale, bool causal,
                           int mask_kind, const SQ* q, OffQ qoff, int64_t sql, int64_t sqe, const SK* k, OffK koff,
                           int64_t sks, int64_t ske, const SV* v, OffV voff, int64_t svs, int64_t sve, const SM* m,
                           OffM moff, int64_t sml, int64_t sms, Epi epi) {
  const int64_t vl = aotc_attn_vl;
  // Causal: smaller query blocks compute less of the masked triangle (at L = S = 128, 10240 scores per
  // head against 12288 with 64), and a head's blocks are taken longest first (the last block sees the
  // most keys), so that the threads' last tasks are short ones and they finish together. Heads stay in
  // order: a head's blocks, one after another, find its K and V rows in cache (all heads' longest
  // blocks first read them from memory at GPT-2's 4 x 128 tokens: 4% slower on one thread).
  const int64_t MB = aotc_attn_roundup(causal ? AOTC_ATTN_MB_CAUSAL : AOTC_ATTN_MB, vl), NB = AOTC_ATTN_NB;
  const int64_t evp = aotc_attn_roundup(Ev > 0 ? Ev : 1, vl);
  const int64_t blocks = (L + MB - 1) / MB;
  const int64_t tasks = nbatch * blocks;
  if (tasks <= 0) return;
  const double flops = 2.0 * (double)nbatch * (double)L * (double)S * (double)(E + Ev);
  const bool par = flops >= AOTC_ATTN_MIN_PAR_FLOPS;
  // per thread: Q^T, transposed scores, V block, output rows, running max, sum, block max, rescale, row
  // scale, key bias
  const int64_t per = E * MB + NB * MB + NB * evp + MB * evp + 5 * MB + NB + 16;
  // one task: query block l0 of batch position b, in a thread's workspace ``ws`` of ``per`` floats
  auto task = [&](int64_t t, float* ws) {
    float* qt = ws;
    float* st = qt + E * MB;
    float* vb = st + NB * MB;
    float* out = vb + NB * evp;
    float* mx = out + MB * evp;
    float* sum = mx + MB;
    float* top = sum + MB;
    float* alpha = top + MB;
    float* row_scale = alpha + MB;
    float* kb = row_scale + MB;
    const int64_t b = t / blocks;
    const int64_t l0 = (causal ? blocks - 1 - t % blocks : t % blocks) * MB;
    const int64_t lb = L - l0 < MB ? L - l0 : MB, lbp = aotc_attn_roundup(lb, vl);
    const int64_t qo = qoff(b), ko = koff(b), vo = voff(b), mo = mask_kind ? moff(b) : 0;
    aotc_attn_pack_q<SQ>(q, qo + l0 * sql, sql, sqe, lb, lbp, E, scale, qt);
    // A mask that varies along the queries only (sms == 0) adds one constant to a query's every score,
    // which its softmax does not see: it only decides whether the row attends to anything (-inf: zeros)
    // or is NaN (NaN, +inf); row_scale holds 1, 0 or NaN for that. A mask along the keys only (sml == 0,
    // padding) is one bias per key, added in the max pass (kb); any other mask is added element-wise.
    const bool by_row = mask_kind != 0 && sms == 0 && sml != 0;
    const bool by_key = mask_kind != 0 && sml == 0;
    for (int64_t r = 0; r < lbp; ++r) {
      float val = 0.0f;
      if (by_row) {
        val = (float)aotc_elem<SM>::load(m, mo + (l0 + (r < lb ? r : 0)) * sml);
        if (mask_kind == 1) val = val == 0 ? -INFINITY : 0.0f;
      }
      row_scale[r] = val == -INFINITY ? 0.0f : (val - val == 0.0f ? 1.0f : NAN);
      mx[r] = -INFINITY;
      sum[r] = 0.0f;
    }
    int64_t hi = causal ? (S < l0 + lb ? S : l0 + lb) : S;
    // Keys past the last one a bool key mask keeps (padding) weigh exactly 0: the key blocks end there.
    // The other keys' sums and products run in the same order, so the result is the same to the bit,
    // except that a NaN or inf in a padded V row no longer turns its 0 weight into NaN (0 * inf).
    if (by_key && mask_kind == 1)
      while (hi > 0 && aotc_elem<SM>::load(m, mo + (hi - 1) * sms) == 0) --hi;
    if (hi <= 0) memset(out, 0, sizeof(float) * lbp * evp);  // no keys: zeros
    for (int64_t j0 = 0; j0 < hi; j0 += NB) {
      const int64_t nb = hi - j0 < NB ? hi - j0 : NB;
      // st[j][r] = k[j0 + j] . q[l0 + r] * scale; a block that no mask touches gets its maxima from the
      // product's registers (top), not from a pass over st
      const bool elementwise = mask_kind != 0 && !by_row && !by_key;
      const bool masked = elementwise || by_key || (causal && j0 + nb > l0 + 1);
      if (!masked) memcpy(top, mx, sizeof(float) * lbp);
      aotc_attn_gemm<SK>(nb, lbp, E, k + ko + j0 * sks, sks, ske, qt, lbp, st, lbp, false, masked ? NULL : top);
      if (by_key) {
        for (int64_t j = 0; j < nb; ++j) {
          const float val = (float)aotc_elem<SM>::load(m, mo + (j0 + j) * sms);
          kb[j] = mask_kind == 2 ? val : (val == 0 ? -INFINITY : 0.0f);
        }
      }
      if (elementwise) {
        for (int64_t j = 0; j < nb; ++j) {
          float* s = st + j * lbp;
          const int64_t mk = mo + (j0 + j) * sms;
          if (mask_kind == 1) {
#pragma omp simd
            for (int64_t r = 0; r < lb; ++r) s[r] = aotc_elem<SM>::load(m, mk + (l0 + r) * sml) == 0 ? -INFINITY : s[r];
          } else {
#pragma omp simd
            for (int64_t r = 0; r < lb; ++r) s[r] += (float)aotc_elem<SM>::load(m, mk + (l0 + r) * sml);
          }
        }
      }
      // the online softmax, queries in the lanes; causal: row j (key j0 + j) keeps the queries l0 + r >=
      // j0 + j, the lanes from diag + j on (the block's keys up to l0 are seen by every row: diag < 1)
      const int keys = by_key ? mask_kind : 0;
      const int64_t diag = causal ? j0 - l0 : -nb;
      if (masked) aotc_attn_columns<false>(nb, st, lbp, mx, keys, kb, diag, top, NULL, [](int64_t) {});
      // a row with nothing attended yet keeps max -inf and gets p = exp(-inf - 0) = 0; the first block has
      // nothing to rescale (sum and out are empty: alpha would be exp(-inf) = 0)
      if (j0 == 0) {
#pragma omp simd
        for (int64_t r = 0; r < lbp; ++r) {
          mx[r] = top[r];
          top[r] = top[r] == -INFINITY ? 0.0f : top[r];
        }
      } else {
#pragma omp simd
        for (int64_t r = 0; r < lbp; ++r) {
          const float base = top[r] == -INFINITY ? 0.0f : top[r];
          alpha[r] = aotc_exp(mx[r] - base);
          mx[r] = top[r];
          top[r] = base;
          sum[r] *= alpha[r];
        }
      }
      // the exps, V packed row by row on the way: read in place, rows a fused QKV's stride apart (BERT's
      // 768 floats, 3 KiB) fall in a quarter of L1's sets and P @ V, which reads the block once per 6-8
      // query rows, gets them from L2
      const SV* vr = v + vo + j0 * svs;
      const int64_t vrow = sve == 1 ? Ev * (int64_t)sizeof(SV) : 0;  // prefetched 4 rows ahead when contiguous
      auto exps = [&](auto whole) {
        aotc_attn_columns<true>(nb, st, lbp, top, keys, kb, diag, NULL, sum, [=](int64_t j) {
          const char* ahead = reinterpret_cast<const char*>(vr + (j + 4) * svs);
          for (int64_t o = 0; o < vrow && j + 4 < nb; o += 64) __builtin_prefetch(ahead + o);
          aotc_attn_pack_v_row<decltype(whole)::value, SV>(vr, j * svs, sve, Ev, evp, vb + j * evp);
        });
      };
      if (std::is_same<SV, float>::value && sve == 1 && Ev == evp) exps(std::true_type());
      else exps(std::false_type());
      for (int64_t r = 0; r < lb && j0 > 0; ++r) {  // the first block writes out rather than adding to it
        if (alpha[r] != 1.0f) {
          float* o = out + r * evp;
          const float a = alpha[r];
#pragma omp simd
          for (int64_t d = 0; d < evp; ++d) o[d] *= a;
        }
      }
      // out[r] += sum_j st[j][r] * v[j]
      aotc_attn_gemm<float>(lb, evp, nb, st, 1, lbp, vb, evp, out, evp, j0 > 0);
    }
    for (int64_t r = 0; r < lb; ++r) {
      // a row that attended to nothing has sum 0 and gives zeros (as torch does); a NaN sum stays NaN
      const float inv = sum[r] == 0.0f || row_scale[r] == 0.0f ? 0.0f : row_scale[r] / sum[r];
      float* o = out + r * evp;
      if (inv == 0.0f) {
        memset(o, 0, sizeof(float) * evp);
        continue;
      }
#pragma omp simd
      for (int64_t d = 0; d < evp; ++d) o[d] *= inv;
    }
    epi(b, l0, lb, (const float*)out, evp);
  };
  const int nthreads = par ? aotc_pool_threads() : 1;
  const int64_t per_slot = aotc_attn_roundup(per, 16);
  // the library's kept workspace (matmul.h) unless nested in a caller's parallel loop: no per-call allocation
  const bool nested = aotc_pool_inside || omp_in_parallel();
  const aotc_mm_scratch<float> scratch((size_t)(per_slot * nthreads), nested);
  aotc_pool_run(tasks, nthreads, [&](int64_t t, int slot) { task(t, scratch.p + slot * per_slot); });
}

#ifdef AOTC_SELFTEST_ATTENTION
// g++ -DAOTC_SELFTEST_ATTENTION -x c++ attention.h: GQA attention against a naive loop, at shapes that take
// one block and several (query blocks, key blocks, partial vectors), causal or not, with each mask kind.
#include <cstdio>
#include <vector>

// ``msl``/``mss``: the mask's strides along queries and keys (0: the mask is constant along that axis).
static double aotc_attn_check(int64_t L, int64_t S, int64_t E, int64_t Ev, bool causal, int mask_kind,
                              int64_t msl = -1, int64_t mss = 1) {
  if (msl < 0) msl = S;
  const int64_t B = 2, H = 4, G = 2;
  std::vector<float> q(B * H * L * E), k(B * (H / G) * S * E), v(B * (H / G) * S * Ev), out(B * H * L * Ev, -1.0f);
  std::vector<float> add(L * S);
  bool* keep = new bool[L * S];
  unsigned x = 12345;
  auto rnd = [&]() { return (x = x * 1103515245u + 12345u, (float)((x >> 9) % 2000) / 1000.0f - 1.0f); };
  for (auto& a : q) a = rnd();
  for (auto& a : k) a = rnd();
  for (auto& a : v) a = rnd();
  for (int64_t i = 0; i < L * S; ++i) {
    keep[i] = rnd() > -0.6f || i % S == 0;
    add[i] = 2.0f * rnd();
  }
  for (int64_t j = 0; j < S; ++j) keep[5 * S + j] = false;  // row 5 attends to nothing: zeros
  if (msl == 0)  // a key-padding mask: the last keys masked (the key blocks end at the last kept one)
    for (int64_t j = S - S / 4; j < S; ++j) keep[j * mss] = false;
  const float scale = 0.3f;
  auto kv = [=](int64_t b) { return (b / H) * (H / G) + (b % H) / G; };
  auto epi = [&](int64_t b, int64_t l0, int64_t lb, const float* tile, int64_t ldt) {
    for (int64_t l = l0; l < l0 + lb; ++l)
      for (int64_t d = 0; d < Ev; ++d) out[(b * L + l) * Ev + d] = tile[(l - l0) * ldt + d];
  };
  auto qo = [=](int64_t b) { return b * L * E; };
  auto ko = [=](int64_t b) { return kv(b) * S * E; };
  auto vo = [=](int64_t b) { return kv(b) * S * Ev; };
  auto mo = [](int64_t) { return (int64_t)0; };
  if (mask_kind == 2)
    aotc_attention(B * H, L, S, E, Ev, scale, causal, 2, q.data(), qo, E, (int64_t)1, k.data(), ko, E, (int64_t)1,
                   v.data(), vo, Ev, (int64_t)1, add.data(), mo, msl, mss, epi);
  else
    aotc_attention(B * H, L, S, E, Ev, scale, causal, mask_kind, q.data(), qo, E, (int64_t)1, k.data(), ko, E,
                   (int64_t)1, v.data(), vo, Ev, (int64_t)1, keep, mo, msl, mss, epi);
  double worst = 0;
  for (int64_t b = 0; b < B * H; ++b) {
    const int64_t kvh = kv(b);
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> p(S);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += (double)q[(b * L + l) * E + e] * k[(kvh * S + j) * E + e];
        s *= scale;
        bool in = !causal || j <= l;
        if (mask_kind == 1) in = in && keep[l * msl + j * mss];
        if (mask_kind == 2) s += add[l * msl + j * mss];
        p[j] = in ? s : -INFINITY;
        top = p[j] > top ? p[j] : top;
      }
      for (int64_t j = 0; j < S; ++j) total += p[j] = top == -INFINITY ? 0 : std::exp(p[j] - top);
      for (int64_t d = 0; d < Ev; ++d) {
        double o = 0;
        for (int64_t j = 0; j < S; ++j) o += p[j] * v[(kvh * S + j) * Ev + d];
        o = total > 0 ? o / total : 0;
        const double err = std::fabs(o - out[(b * L + l) * Ev + d]);
        worst = err > worst ? err : worst;
      }
    }
  }
  delete[] keep;
  std::printf("attention self-test L %ld S %ld E %ld Ev %ld causal %d mask %d: max error %g\n", (long)L, (long)S,
              (long)E, (long)Ev, (int)causal, mask_kind, worst);
  return worst;
}

// A mask along the queries only, additive: -inf zeroes its row, NaN and +inf make it NaN (as the scores
// would be), a finite value changes nothing; a NaN in a query gives a NaN row, not zeros. Returns failures.
static int aotc_attn_check_rows() {
  const int64_t L = 20, S = 33, E = 16;
  std::vector<float> q(L * E), k(S * E), v(S * E), bias(L, 0.5f), masked(L * E), plain(L * E);
  unsigned x = 777;
  auto rnd = [&]() { return (x = x * 1103515245u + 12345u, (float)((x >> 9) % 2000) / 1000.0f - 1.0f); };
  for (auto* a : {&q, &k, &v})
    for (auto& e : *a) e = rnd();
  q[11 * E + 3] = NAN;
  bias[3] = -INFINITY;
  bias[7] = NAN;
  bias[9] = INFINITY;
  auto zero = [](int64_t) { return (int64_t)0; };
  for (int kind = 0; kind < 3; kind += 2) {
    float* out = kind ? masked.data() : plain.data();
    aotc_attention(1, L, S, E, E, 0.25f, false, kind, q.data(), zero, E, (int64_t)1, k.data(), zero, E, (int64_t)1,
                   v.data(), zero, E, (int64_t)1, bias.data(), zero, (int64_t)1, (int64_t)0,
                   [&](int64_t, int64_t l0, int64_t lb, const float* tile, int64_t ldt) {
                     for (int64_t l = l0; l < l0 + lb; ++l)
                       for (int64_t d = 0; d < E; ++d) out[l * E + d] = tile[(l - l0) * ldt + d];
                   });
  }
  int fails = 0;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t d = 0; d < E; ++d) {
      const float m = masked[l * E + d], p = plain[l * E + d];
      if (l == 3) fails += m != 0.0f;
      else if (l == 7 || l == 9 || l == 11) fails += !std::isnan(m) || (l == 11 && !std::isnan(p));
      else fails += m != p || std::isnan(p);
    }
  std::printf("attention self-test of rows masked along the queries and NaN queries: %d failures\n", fails);
  return fails;
}

int main() {
  if (aotc_attn_check_rows()) return 1;
  double worst = aotc_attn_check(37, 45, 24, 20, true, 1);
  worst = std::fmax(worst, aotc_attn_check(133, 290, 64, 64, false, 2));
  worst = std::fmax(worst, aotc_attn_check(150, 150, 64, 48, true, 0));
  worst = std::fmax(worst, aotc_attn_check(70, 300, 32, 64, true, 1));  // causal, S > L: top-left aligned
  worst = std::fmax(worst, aotc_attn_check(9, 7, 8, 8, false, 0));
  worst = std::fmax(worst, aotc_attn_check(130, 140, 64, 64, false, 1, 1, 0));  // a mask along the queries
  worst = std::fmax(worst, aotc_attn_check(130, 140, 64, 64, true, 2, 1, 0));
  worst = std::fmax(worst, aotc_attn_check(30, 140, 16, 16, false, 1, 0, 1));  // along the keys (padding)
  worst = std::fmax(worst, aotc_attn_check(30, 140, 16, 16, false, 2, 0, 1));
  return worst < 1e-4 ? 0 : 1;
}
#endif

#endif  // AOTC_ATTENTION_H
