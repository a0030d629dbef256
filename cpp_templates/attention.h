// Streaming (flash) attention with a fused epilogue: out[b, l, :] = softmax_j(q[l] . k[j] * scale (+ mask)) @ v.
//
// The L x S score matrix is never held: each task takes one batch position b (batch dims and the query
// head, flattened) and a block of MB query rows, walks the keys in blocks of NB, and keeps a running row
// maximum and sum (online softmax). Per key block it packs K transposed (E x NB) and V (NB x Ev, padded to
// the vector width) into per-thread scratch, computes the MB x NB scores with a register-blocked
// micro-kernel (rows x vectors of keys), turns them into probabilities in place, rescales the output
// accumulator by exp(old max - new max) and adds P @ V with a second micro-kernel (rows x vectors of Ev).
// When the keys are done, each row is divided by its sum (0 for a row with no key left: zeros, as torch
// gives) and the epilogue functor gets the finished rows while they are in cache:
//   epi(b, l0, lb, tile, ldt)  with  Acc(b, l, d) = tile[(l - l0) * ldt + d].
// The epilogue runs inside the parallel region and must not throw.
//
// Operands are strided with a per-batch element offset from a functor (the k/v functors map a query head
// to its kv head, so GQA reads k/v by index). mask_kind: 0 none, 1 bool (nonzero attends), 2 additive.
// causal: row l attends to keys j <= l (top-left aligned); key blocks past the last row's diagonal are
// skipped. Elements are widened to float while packing (16-bit floats arrive as the tags of matmul.h).
//
// Note: explicit FMA intrinsics, as in matmul.h: generated code is compiled with -ffp-contract=off.
#ifndef AOTC_ATTENTION_H
#define AOTC_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <new>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "aotc_cpu.h"
#include "matmul.h"  // the 16-bit operand tags and aotc_elem

#ifndef AOTC_ATTN_MB
#define AOTC_ATTN_MB 64  // query rows per task (a multiple of AOTC_ATTN_MR)
#endif
#ifndef AOTC_ATTN_NB
#define AOTC_ATTN_NB 64  // keys per block (a multiple of two vectors)
#endif
#ifndef AOTC_ATTN_MIN_PAR_FLOPS
#define AOTC_ATTN_MIN_PAR_FLOPS 200000.0  // below this attention runs on one thread
#endif
#define AOTC_ATTN_MR 4  // rows per micro-kernel

#if defined(__AVX512F__)
#define AOTC_ATTN_VBYTES 64
#elif defined(__AVX__)
#define AOTC_ATTN_VBYTES 32
#else
#define AOTC_ATTN_VBYTES 16
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

// c[i][0 .. NV vectors) (+)= sum_k a[i * lda + k] * b[k * ldb + ...] for MR rows: the shared shape of
// scores (a = q rows, b = K^T) and of P @ V (a = probabilities, b = V).
template <int NV>
static inline void aotc_attn_micro(int64_t kn, const float* __restrict a, int64_t lda, const float* __restrict b,
                                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // fully unrolled so that the accumulators live in registers
  aotc_attn_v acc[AOTC_ATTN_MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < AOTC_ATTN_MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      acc[i][j] = accumulate ? aotc_attn_load(c + i * ldc + j * aotc_attn_vl) : aotc_attn_set1(0.0f);
  for (int64_t k = 0; k < kn; ++k) {
    aotc_attn_v bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = aotc_attn_load(b + k * ldb + j * aotc_attn_vl);
#pragma GCC unroll 8
    for (int i = 0; i < AOTC_ATTN_MR; ++i) {
      const aotc_attn_v av = aotc_attn_set1(a[i * lda + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_attn_fma(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < AOTC_ATTN_MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) aotc_attn_store(c + i * ldc + j * aotc_attn_vl, acc[i][j]);
}

// c (rows x cols, cols a multiple of the vector width) (+)= a (rows x kn) @ b (kn x cols), rows % MR == 0.
static inline void aotc_attn_gemm(int64_t rows, int64_t cols, int64_t kn, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < rows; i += AOTC_ATTN_MR) {
    int64_t j = 0;
    for (; j + 2 * aotc_attn_vl <= cols; j += 2 * aotc_attn_vl)
      aotc_attn_micro<2>(kn, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
    for (; j < cols; j += aotc_attn_vl)
      aotc_attn_micro<1>(kn, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
  }
}

static inline int64_t aotc_attn_roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

template <class SQ, class SK, class SV, class SM, class OffQ, class OffK, class OffV, class OffM, class Epi>
static void aotc_attention(int64_t nbatch, int64_t L, int64_t S, int64_t E, int64_t Ev, float scale, bool causal,
                           int mask_kind, const SQ* q, OffQ qoff, int64_t sql, int64_t sqe, const SK* k, OffK koff,
                           int64_t sks, int64_t ske, const SV* v, OffV voff, int64_t svs, int64_t sve, const SM* m,
                           OffM moff, int64_t sml, int64_t sms, Epi epi) {
  const int64_t MB = AOTC_ATTN_MB, NB = AOTC_ATTN_NB;
  const int64_t evp = aotc_attn_roundup(Ev > 0 ? Ev : 1, aotc_attn_vl);
  const int64_t blocks = (L + MB - 1) / MB;
  const int64_t tasks = nbatch * blocks;
  if (tasks <= 0) return;
  const double flops = 2.0 * (double)nbatch * (double)L * (double)S * (double)(E + Ev);
  const bool par = flops >= AOTC_ATTN_MIN_PAR_FLOPS;
  // per thread: q rows, K^T block, V block, scores, output rows, row max and sum
  const int64_t per = MB * E + E * NB + NB * evp + MB * NB + MB * evp + 2 * MB + 16;
  const int nthreads = par ? aotc_pool_threads() : 1;
  const int64_t per_slot = aotc_attn_roundup(per, 16);
  float* ws_all = static_cast<float*>(aligned_alloc(64, (size_t)(per_slot * nthreads) * sizeof(float)));
  if (ws_all == NULL) throw std::bad_alloc();
  aotc_pool_run(tasks, nthreads, [&](int64_t t, int slot) {
    float* ws = ws_all + slot * per_slot;
    float* qs = ws;
    float* kt = qs + MB * E;
    float* vb = kt + E * NB;
    float* sc = vb + NB * evp;
    float* out = sc + MB * NB;
    float* mx = out + MB * evp;
    float* sum = mx + MB;
    {
      const int64_t b = t / blocks, l0 = (t % blocks) * MB;
      const int64_t lb = L - l0 < MB ? L - l0 : MB;
      const int64_t qo = qoff(b), ko = koff(b), vo = voff(b), mo = mask_kind ? moff(b) : 0;
      for (int64_t r = 0; r < MB; ++r)
        for (int64_t e = 0; e < E; ++e)
          qs[r * E + e] = r < lb ? scale * (float)aotc_elem<SQ>::load(q, qo + (l0 + r) * sql + e * sqe) : 0.0f;
      memset(out, 0, sizeof(float) * MB * evp);
      for (int64_t r = 0; r < MB; ++r) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
      }
      const int64_t hi = causal ? (S < l0 + lb ? S : l0 + lb) : S;
      for (int64_t j0 = 0; j0 < hi; j0 += NB) {
        const int64_t nb = hi - j0 < NB ? hi - j0 : NB;
        for (int64_t j = 0; j < NB; ++j)  // read along rows of K (contiguous e), write K^T
          for (int64_t e = 0; e < E; ++e)
            kt[e * NB + j] = j < nb ? (float)aotc_elem<SK>::load(k, ko + (j0 + j) * sks + e * ske) : 0.0f;
        for (int64_t j = 0; j < NB; ++j)
          for (int64_t d = 0; d < evp; ++d)
            vb[j * evp + d] = j < nb && d < Ev ? (float)aotc_elem<SV>::load(v, vo + (j0 + j) * svs + d * sve) : 0.0f;
        aotc_attn_gemm(MB, NB, E, qs, E, kt, NB, sc, NB, false);
        for (int64_t r = 0; r < lb; ++r) {
          float* s = sc + r * NB;
          const int64_t row = l0 + r;
          if (mask_kind || nb < NB || (causal && j0 + NB > row)) {
            for (int64_t j = 0; j < NB; ++j) {
              bool keep = j < nb && (!causal || j0 + j <= row);
              if (keep && mask_kind == 1) keep = aotc_elem<SM>::load(m, mo + row * sml + (j0 + j) * sms) != 0;
              if (keep && mask_kind == 2) s[j] += (float)aotc_elem<SM>::load(m, mo + row * sml + (j0 + j) * sms);
              if (!keep) s[j] = -INFINITY;
            }
          }
          float top = mx[r];
#pragma omp simd reduction(max : top)
          for (int64_t j = 0; j < NB; ++j) top = s[j] > top ? s[j] : top;
          if (top == -INFINITY) {  // nothing attended yet: this block adds nothing to the row
            memset(s, 0, sizeof(float) * NB);
            continue;
          }
          const float alpha = aotc_exp(mx[r] - top);
          mx[r] = top;
          float total = 0.0f;
#pragma omp simd reduction(+ : total)
          for (int64_t j = 0; j < NB; ++j) {
            s[j] = aotc_exp(s[j] - top);
            total += s[j];
          }
          sum[r] = sum[r] * alpha + total;
          if (alpha != 1.0f) {
            float* o = out + r * evp;
#pragma omp simd
            for (int64_t d = 0; d < evp; ++d) o[d] *= alpha;
          }
        }
        aotc_attn_gemm(MB, evp, nb, sc, NB, vb, evp, out, evp, true);
      }
      for (int64_t r = 0; r < lb; ++r) {
        const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
        float* o = out + r * evp;
#pragma omp simd
        for (int64_t d = 0; d < evp; ++d) o[d] *= inv;
      }
      epi(b, l0, lb, (const float*)out, evp);
    }
  });
  free(ws_all);
}

#ifdef AOTC_SELFTEST_ATTENTION
// g++ -DAOTC_SELFTEST_ATTENTION -x c++ attention.h: causal GQA attention with a bool mask against a naive loop.
#include <cstdio>
#include <vector>

int main() {
  const int64_t B = 2, H = 4, G = 2, L = 37, S = 45, E = 24, Ev = 20;
  std::vector<float> q(B * H * L * E), k(B * (H / G) * S * E), v(B * (H / G) * S * Ev), out(B * H * L * Ev, -1.0f);
  std::vector<bool> keepv(L * S);
  bool* mask = new bool[L * S];
  unsigned x = 12345;
  auto rnd = [&]() { return (x = x * 1103515245u + 12345u, (float)((x >> 9) % 2000) / 1000.0f - 1.0f); };
  for (auto& a : q) a = rnd();
  for (auto& a : k) a = rnd();
  for (auto& a : v) a = rnd();
  for (int64_t i = 0; i < L * S; ++i) mask[i] = rnd() > -0.6f || i % S == 0;
  for (int64_t j = 0; j < S; ++j) mask[5 * S + j] = false;  // row 5 attends to nothing: zeros
  const float scale = 0.3f;
  aotc_attention(
      B * H, L, S, E, Ev, scale, true, 1, q.data(), [&](int64_t b) { return b * L * E; }, E, (int64_t)1, k.data(),
      [&](int64_t b) { return ((b / H) * (H / G) + (b % H) / G) * S * E; }, E, (int64_t)1, v.data(),
      [&](int64_t b) { return ((b / H) * (H / G) + (b % H) / G) * S * Ev; }, Ev, (int64_t)1, mask,
      [](int64_t) { return (int64_t)0; }, S, (int64_t)1,
      [&](int64_t b, int64_t l0, int64_t lb, const float* tile, int64_t ldt) {
        for (int64_t l = l0; l < l0 + lb; ++l)
          for (int64_t d = 0; d < Ev; ++d) out[(b * L + l) * Ev + d] = tile[(l - l0) * ldt + d];
      });
  double worst = 0;
  for (int64_t b = 0; b < B * H; ++b) {
    const int64_t kvh = (b / H) * (H / G) + (b % H) / G;
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> p(S);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += (double)q[(b * L + l) * E + e] * k[(kvh * S + j) * E + e];
        p[j] = (j <= l && mask[l * S + j]) ? s * scale : -INFINITY;
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
  delete[] mask;
  std::printf("attention self-test: max error %g\n", worst);
  return worst < 1e-4 ? 0 : 1;
}
#endif

#endif  // AOTC_ATTENTION_H
