// Streaming (flash) attention with a fused epilogue: out[b, l, :] = softmax_j(q[l] . k[j] * scale (+ mask)) @ v.
//
// The L x S score matrix is never held: each task takes one batch position b (batch dims and the query
// head, flattened) and a block of MB query rows, walks the keys in blocks of NB, and keeps a running
// maximum and sum per query (online softmax). The task packs its query block once, transposed and scaled
// (E x MB: queries along the vector lanes), then per key block computes the scores *transposed*,
// st[j][r] = k[j] . q[r] (keys as the broadcast rows of a register-blocked micro-kernel, read straight
// from K, so K is never packed), which makes the softmax a vertical walk over key rows with the queries
// in the lanes: maxima, exps and sums need no horizontal reductions. The output accumulator (MB x Ev) is
// rescaled by exp(old max - new max) and gets P @ V from the same micro-kernel (queries as the broadcast
// rows, read from st down its columns; V rows read in place when they are contiguous floats, otherwise
// packed). When the keys are done each row is divided by its sum (0 for a row with no key left: zeros,
// as torch gives) and the epilogue functor gets the finished rows while they are in cache:
//   epi(b, l0, lb, tile, ldt)  with  Acc(b, l, d) = tile[(l - l0) * ldt + d].
// The epilogue runs inside the parallel region and must not throw.
//
// Operands are strided with a per-batch element offset from a functor (the k/v functors map a query head
// to its kv head, so GQA reads k/v by index). mask_kind: 0 none, 1 bool (nonzero attends), 2 additive.
// causal: row l attends to keys j <= l (top-left aligned); key blocks past the last row's diagonal are
// skipped. Elements are widened to float as they are read (16-bit floats arrive as the tags of matmul.h).
//
// Note: explicit FMA intrinsics, as in matmul.h: generated code is compiled with -ffp-contract=off.
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

// c[i][0 .. NV vectors) (+)= sum_k a[i * sai + k * sak] * b[k * ldb + ...] for R rows: the shared shape of
// the transposed scores (a = K rows, b = Q^T) and of P @ V (a = P down the columns of st, b = V).
template <int R, int NV, class S>
static inline void aotc_attn_micro(int64_t kn, const S* __restrict a, int64_t sai, int64_t sak,
                                   const float* __restrict b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
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
}

// All columns (a multiple of the vector width) of R rows.
template <int R, class S>
static inline void aotc_attn_rows(int64_t cols, int64_t kn, const S* a, int64_t sai, int64_t sak, const float* b,
                                  int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t j = 0;
  for (; j + 2 * aotc_attn_vl <= cols; j += 2 * aotc_attn_vl)
    aotc_attn_micro<R, 2>(kn, a, sai, sak, b + j, ldb, c + j, ldc, accumulate);
  for (; j < cols; j += aotc_attn_vl) aotc_attn_micro<R, 1>(kn, a, sai, sak, b + j, ldb, c + j, ldc, accumulate);
}

// The last ``rows`` (< MR) rows.
template <class S, int R = AOTC_ATTN_MR - 1>
static inline void aotc_attn_tail(int64_t rows, int64_t cols, int64_t kn, const S* a, int64_t sai, int64_t sak,
                                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R >= 1) {
    if (rows == R) return aotc_attn_rows<R>(cols, kn, a, sai, sak, b, ldb, c, ldc, accumulate);
    aotc_attn_tail<S, R - 1>(rows, cols, kn, a, sai, sak, b, ldb, c, ldc, accumulate);
  }
}

// c (rows x cols, cols a multiple of the vector width) (+)= A (rows x kn, element (i, k) at a[i * sai +
// k * sak]) @ b (kn x cols).
template <class S>
static inline void aotc_attn_gemm(int64_t rows, int64_t cols, int64_t kn, const S* a, int64_t sai, int64_t sak,
                                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + AOTC_ATTN_MR <= rows; i += AOTC_ATTN_MR)
    aotc_attn_rows<AOTC_ATTN_MR>(cols, kn, a + i * sai, sai, sak, b, ldb, c + i * ldc, ldc, accumulate);
  if (i < rows) aotc_attn_tail<S>(rows - i, cols, kn, a + i * sai, sai, sak, b, ldb, c + i * ldc, ldc, accumulate);
}

static inline int64_t aotc_attn_roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

template <class SQ, class SK, class SV, class SM, class OffQ, class OffK, class OffV, class OffM, class Epi>
static void aotc_attention(int64_t nbatch, int64_t L, int64_t S, int64_t E, int64_t Ev, float scale, bool causal,
                           int mask_kind, const SQ* q, OffQ qoff, int64_t sql, int64_t sqe, const SK* k, OffK koff,
                           int64_t sks, int64_t ske, const SV* v, OffV voff, int64_t svs, int64_t sve, const SM* m,
                           OffM moff, int64_t sml, int64_t sms, Epi epi) {
  const int64_t vl = aotc_attn_vl;
  const int64_t MB = aotc_attn_roundup(AOTC_ATTN_MB, vl), NB = AOTC_ATTN_NB;
  const int64_t evp = aotc_attn_roundup(Ev > 0 ? Ev : 1, vl);
  const int64_t blocks = (L + MB - 1) / MB;
  const int64_t tasks = nbatch * blocks;
  if (tasks <= 0) return;
  // V rows are read in place when they are contiguous floats of whole vectors, otherwise packed per block.
  const bool v_direct = std::is_same<SV, float>::value && sve == 1 && Ev % vl == 0;
  const double flops = 2.0 * (double)nbatch * (double)L * (double)S * (double)(E + Ev);
  const bool par = flops >= AOTC_ATTN_MIN_PAR_FLOPS;
  // per thread: Q^T, transposed scores, V block, output rows, running max, sum, block max, rescale, mask bias
  const int64_t per = E * MB + NB * MB + (v_direct ? 0 : NB * evp) + MB * evp + 5 * MB + 16;
  // one task: query block l0 of batch position b, in a thread's workspace ``ws`` of ``per`` floats
  auto task = [&](int64_t t, float* ws) {
    float* qt = ws;
    float* st = qt + E * MB;
    float* vb = st + NB * MB;
    float* out = vb + (v_direct ? 0 : NB * evp);
    float* mx = out + MB * evp;
    float* sum = mx + MB;
    float* top = sum + MB;
    float* alpha = top + MB;
    float* bias = alpha + MB;
    const int64_t b = t / blocks, l0 = (t % blocks) * MB;
    const int64_t lb = L - l0 < MB ? L - l0 : MB, lbp = aotc_attn_roundup(lb, vl);
    const int64_t qo = qoff(b), ko = koff(b), vo = voff(b), mo = mask_kind ? moff(b) : 0;
    for (int64_t e = 0; e < E; ++e) {  // Q^T, scaled; the padding queries are zeros (never output)
      float* row = qt + e * lbp;
      const int64_t at = qo + l0 * sql + e * sqe;
#pragma omp simd
      for (int64_t r = 0; r < lb; ++r) row[r] = scale * (float)aotc_elem<SQ>::load(q, at + r * sql);
      for (int64_t r = lb; r < lbp; ++r) row[r] = 0.0f;
    }
    // a mask that varies along the queries only (sms == 0) is one bias per query for every key
    const bool by_row = mask_kind != 0 && sms == 0 && sml != 0;
    if (by_row) {
#pragma omp simd
      for (int64_t r = 0; r < lbp; ++r) {
        const int64_t at = mo + (l0 + (r < lb ? r : 0)) * sml;
        const float val = (float)aotc_elem<SM>::load(m, at);
        bias[r] = mask_kind == 2 ? val : (val == 0 ? -INFINITY : 0.0f);
      }
    }
    memset(out, 0, sizeof(float) * lbp * evp);
    for (int64_t r = 0; r < lbp; ++r) {
      mx[r] = -INFINITY;
      sum[r] = 0.0f;
    }
    const int64_t hi = causal ? (S < l0 + lb ? S : l0 + lb) : S;
    for (int64_t j0 = 0; j0 < hi; j0 += NB) {
      const int64_t nb = hi - j0 < NB ? hi - j0 : NB;
      // st[j][r] = k[j0 + j] . q[l0 + r] * scale
      aotc_attn_gemm<SK>(nb, lbp, E, k + ko + j0 * sks, sks, ske, qt, lbp, st, lbp, false);
      if (mask_kind || (causal && j0 + nb > l0 + 1)) {
        for (int64_t j = 0; j < nb; ++j) {
          float* s = st + j * lbp;
          const int64_t key = j0 + j, mk = mo + key * sms;
          if (by_row && mask_kind == 1) {
#pragma omp simd
            for (int64_t r = 0; r < lbp; ++r) s[r] = bias[r] != 0.0f ? -INFINITY : s[r];
          } else if (by_row) {
#pragma omp simd
            for (int64_t r = 0; r < lbp; ++r) s[r] += bias[r];
          } else if (sml == 0 && mask_kind != 0) {  // one value per key (a padding mask): the whole row
            const float val = (float)aotc_elem<SM>::load(m, mk);
            if (mask_kind == 1 && val == 0) {
              for (int64_t r = 0; r < lbp; ++r) s[r] = -INFINITY;
            } else if (mask_kind == 2) {
#pragma omp simd
              for (int64_t r = 0; r < lbp; ++r) s[r] += val;
            }
          } else if (mask_kind == 1) {
#pragma omp simd
            for (int64_t r = 0; r < lb; ++r) s[r] = aotc_elem<SM>::load(m, mk + (l0 + r) * sml) == 0 ? -INFINITY : s[r];
          } else if (mask_kind == 2) {
#pragma omp simd
            for (int64_t r = 0; r < lb; ++r) s[r] += (float)aotc_elem<SM>::load(m, mk + (l0 + r) * sml);
          }
          if (causal) {
            const int64_t first = key - l0;  // rows r < first see keys only up to l0 + r < key
#pragma omp simd
            for (int64_t r = 0; r < lbp; ++r) s[r] = r < first ? -INFINITY : s[r];
          }
        }
      }
      // the online softmax, queries in the lanes
#pragma omp simd
      for (int64_t r = 0; r < lbp; ++r) top[r] = mx[r];
      for (int64_t j = 0; j < nb; ++j) {
        const float* s = st + j * lbp;
#pragma omp simd
        for (int64_t r = 0; r < lbp; ++r) top[r] = s[r] > top[r] ? s[r] : top[r];
      }
#pragma omp simd
      for (int64_t r = 0; r < lbp; ++r) {
        // a row with nothing attended yet keeps max -inf and gets p = exp(-inf - 0) = 0
        const float base = top[r] == -INFINITY ? 0.0f : top[r];
        alpha[r] = aotc_exp(mx[r] - base);
        mx[r] = top[r];
        top[r] = base;
        sum[r] *= alpha[r];
      }
      for (int64_t j = 0; j < nb; ++j) {
        float* s = st + j * lbp;
#pragma omp simd
        for (int64_t r = 0; r < lbp; ++r) {
          s[r] = aotc_exp(s[r] - top[r]);
          sum[r] += s[r];
        }
      }
      for (int64_t r = 0; r < lb; ++r) {
        if (alpha[r] != 1.0f) {
          float* o = out + r * evp;
          const float a = alpha[r];
#pragma omp simd
          for (int64_t d = 0; d < evp; ++d) o[d] *= a;
        }
      }
      if (!v_direct) {
        for (int64_t j = 0; j < nb; ++j)
          for (int64_t d = 0; d < evp; ++d)
            vb[j * evp + d] = d < Ev ? (float)aotc_elem<SV>::load(v, vo + (j0 + j) * svs + d * sve) : 0.0f;
      }
      const float* vp = v_direct ? reinterpret_cast<const float*>(v) + vo + j0 * svs : vb;
      // out[r] += sum_j st[j][r] * v[j]
      aotc_attn_gemm<float>(lb, evp, nb, st, 1, lbp, vp, v_direct ? svs : evp, out, evp, true);
    }
    for (int64_t r = 0; r < lb; ++r) {
      const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
      float* o = out + r * evp;
#pragma omp simd
      for (int64_t d = 0; d < evp; ++d) o[d] *= inv;
    }
    epi(b, l0, lb, (const float*)out, evp);
  };
  const int nthreads = par ? aotc_pool_threads() : 1;
  const int64_t per_slot = aotc_attn_roundup(per, 16);
  // the library's kept workspace (matmul.h) unless nested in a caller's parallel loop: no per-call allocation
  const bool nested = aotc_pool_inside || omp_in_parallel();
  const size_t bytes = (size_t)(per_slot * nthreads) * sizeof(float);
  float* own = nested ? static_cast<float*>(aligned_alloc(64, bytes)) : NULL;
  if (nested && own == NULL) throw std::bad_alloc();
  float* ws_all = nested ? own : static_cast<float*>(aotc_mm_workspace(bytes));
  try {
    aotc_pool_run(tasks, nthreads, [&](int64_t t, int slot) { task(t, ws_all + slot * per_slot); });
  } catch (...) {
    free(own);
    throw;
  }
  free(own);
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

int main() {
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
