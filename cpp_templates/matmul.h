// Batched matmul with a fused epilogue: C[b, m, n] = sum_k A[b][m, k] * B[b][k, n].
//
// Two entry points share one driver:
//   aotc_matmul<T>(...)         both operands strided (any strides, e.g. activations in attention); B is
//                               packed per task and K slice into the workspace.
//   aotc_matmul_packed<T>(...)  B is a constant weight packed at build time (aot/codegen/cpp_pack.py) into
//                               panels [ceil(N / NR)][K][NR] of T, zero past N: no call repacks it.
// A is converted to the accumulator type T (float for f32/f16/bf16, double for f64, int64_t for integers)
// while packing MR-row strips.
//
// Structure (GotoBLAS/BLIS): the output is split into MB x NB tiles, one task each of a loop over (batch,
// M-blocks, N-blocks; one thread may swap the two: see m_inner). A task walks K in KC slices: packs its A
// block into MR-high strips, then for each NR-wide B panel (kept in L1) runs the MR x NR register-blocked micro-kernel over every A strip (in
// L2), accumulating into a per-thread tile. Skinny blocks over a build-time packed B swap the two outer
// loops (panel_outer in aotc_mm_drive: each panel down all of K, A packed once). When K is done, the epilogue functor gets the finished tile
// while it is still in cache:  epi(b, m0, mb, n0, nb, tile, ldt)  with
// Acc(b, m, n) = tile[(m - m0) * ldt + (n - n0)].  The epilogue runs inside the parallel region and
// must not throw.
//
// Note (threads): a matmul uses one thread per AOTC_MM_FLOPS_PER_THREAD of work, at most OpenMP's
// current maximum, so small matmuls stay on one thread: a barrier costs microseconds when every thread is
// running, but a whole time slice (milliseconds) when another process holds the core one thread waits for.
//
// Note (workspace): tiles and packed A live in one per-library buffer that only grows, so a call after
// the first allocates nothing. aotc_run calls into one loaded library are serialised by the runtime; a
// matmul called inside a parallel region (nested in a caller's loop) takes a private buffer instead.
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
#include <type_traits>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "aotc_cpu.h"

#ifndef AOTC_MM_MB
#define AOTC_MM_MB 192  // rows per task at most (a multiple of every MR below); an A block stays in L2
#endif
#ifndef AOTC_MM_NB
#define AOTC_MM_NB 512  // columns per task at most (a multiple of every NR below)
#endif
// Bytes of L2 a task plans around: its packed A block over all of K, and for row tasks all of a build-time
// packed B. A package targets an ISA level, not a part, so the core's L2 is read once, at the first matmul:
// 1 MiB where it has 1 MiB or more (every AVX-512 part), else 256 KiB (Zen 2/3's 512 KiB, Haswell's 256).
// Measured, 2 threads, cpu_matmul_ab.py: on a 2 MiB-L2 Xeon an AVX2 package ran BERT's 512 x 256 x 768 at
// 220 GFLOP/s, 184 with 256 KiB; at AVX-512, 512 KiB in place of 1 MiB lost 11-29% on BERT's shapes, and a
// 1 MiB-L2 Zen 4 ran them well at 1 MiB. -DAOTC_MM_A_L2 / -DAOTC_MM_B_L2 fix either at build time.
static inline int64_t aotc_mm_sysfs_l2() {
  char path[80], text[32];
  for (int i = 0; i < 8; ++i) {
    int64_t level = 0, size = 0;
    for (const char* field : {"level", "type", "size"}) {
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, field);
      FILE* f = fopen(path, "r");
      if (!f) return 0;
      const bool got = fgets(text, sizeof text, f) != nullptr;
      fclose(f);
      if (!got) return 0;
      if (field[0] == 'l') level = strtoll(text, nullptr, 10);
      if (field[0] == 't' && text[0] == 'I') level = 0;  // an instruction cache
      if (field[0] == 's') {
        char* unit = nullptr;
        size = strtoll(text, &unit, 10);
        size <<= (*unit == 'K' ? 10 : *unit == 'M' ? 20 : 0);
      }
    }
    if (level == 2 && size > 0) return size;
  }
  return 0;
}

static inline double aotc_mm_l2_budget() {
#if defined(__AVX512F__)
  return (double)(1 << 20);
#else
  static const double bytes = aotc_mm_sysfs_l2() >= (1 << 20) ? (double)(1 << 20) : (double)(1 << 18);
  return bytes;
#endif
}

#ifndef AOTC_MM_A_L2
#define AOTC_MM_A_L2 aotc_mm_l2_budget()
#endif
#ifndef AOTC_MM_B_L2
#define AOTC_MM_B_L2 aotc_mm_l2_budget()
#endif
#ifndef AOTC_MM_ROW_STRIPS
// MR-row strips per row task at least (see aotc_mm_drive). 3 against 2 and 4 (2 threads, best-of wall):
// 512 x 768 x 256 0.51 ms against 0.54 and 0.57, 512 x 1024 x 256 with GELU 0.71-0.75 against 0.76-0.84.
#define AOTC_MM_ROW_STRIPS 3
#endif
#ifndef AOTC_MM_TASKS_PER_THREAD
#define AOTC_MM_TASKS_PER_THREAD 16  // at least, when the columns allow (see aotc_mm_drive)
#endif
#ifndef AOTC_MM_PANELS_BIG_A
#define AOTC_MM_PANELS_BIG_A 4  // B panels per task at least when one row block of A outgrows L2 (aotc_mm_drive)
#endif
#ifndef AOTC_MM_PF_SPREAD
#define AOTC_MM_PF_SPREAD 4  // steps of the micro-kernel per prefetched row of the next panel, at most
#endif
#ifndef AOTC_MM_FLOPS_PER_THREAD
#define AOTC_MM_FLOPS_PER_THREAD 4000000.0  // ~40 us of one core: less work than this per thread stays serial
#endif

// K slice: an MR x KC strip of A plus a KC x NR panel of B stay in L1 (48 KiB on the AVX-512 parts, 32 on
// AVX2 ones). AVX-512: 12 x 2 accumulators of 32 zmm registers, 14 loads per 24 FMAs, and a 24 KiB panel.
// Measured (benchmarks/cpu_matmul_ab.py, 1 thread, CPU time): the micro-kernel alone runs at 138 GFLOP/s
// against an FMA-only loop's 160 (86%) whatever the block (12x2, 14x2, 8x2, 8x3, 6x4, 4x6 vectors all
// 132-138, only a loop without A loads reaches 155), and MR 8/12/14 and KC 128-384 move whole matmuls by
// less than the noise (1-3%); the AVX2 6 x 2 block runs at 90 of 96 (94%).
#if defined(__AVX512F__)
#define AOTC_VBYTES 64
#define AOTC_MM_MR_DEFAULT 12
#define AOTC_MM_KC_DEFAULT 192
#elif defined(__AVX__)
#define AOTC_VBYTES 32
#define AOTC_MM_MR_DEFAULT 6  // 6 x 2 accumulators of 16 ymm registers
#define AOTC_MM_KC_DEFAULT 256
#else
#define AOTC_VBYTES 16
#define AOTC_MM_MR_DEFAULT 4
#define AOTC_MM_KC_DEFAULT 256
#endif
#ifndef AOTC_MM_KC
#define AOTC_MM_KC AOTC_MM_KC_DEFAULT
#endif
// K up to this many is one slice, not KC and a short rest: BERT's K = 256 ran as 192 + 64, the micro-kernel
// storing and reloading its accumulators for 64 steps. One slice (a 32 KiB panel and an A strip still fit
// the 48 KiB L1): 512 x 768 x 256 +0-4%, 512 x 1024 x 256 with GELU +1-6% (1 thread, CPU time, best of 20).
#ifndef AOTC_MM_KC_ONE
#define AOTC_MM_KC_ONE 256
#endif
#ifndef AOTC_MM_MR
#define AOTC_MM_MR AOTC_MM_MR_DEFAULT
#endif
#ifndef AOTC_MM_NV
#define AOTC_MM_NV 2  // vectors per micro-kernel row: the default block, MR x 2
#endif
#define AOTC_MM_NR_F32 (AOTC_MM_NV * AOTC_VBYTES / 4)  // panel width of the default block's packed weights
// The wide block, 8 x 3 vectors (AVX-512): 11 loads per 24 FMAs where 12 x 2 has 14. Build-time packed
// weights of matmuls with many rows take it (cpp_pack.py: matmul_panel), in panels of 48 columns.
// Note (measured, benchmarks/cpu_matmul_ab.py): on the Xeon 512 x 3072 x 768 and 2048^3 +3-6% on 2
// threads, 64 rows -3% (fewer, ragged column tasks); on Zen 4, whose 12 x 2 block already runs at its FMA
// peak, 128-512 rows +0-4%, 64 rows -3-4%, N = 256 -4-11% (5.3 panels).
#ifndef AOTC_MM_MR3
#define AOTC_MM_MR3 (AOTC_VBYTES == 64 ? 8 : 4)
#endif
// AOTC_MM_NB for the wide block, a multiple of 3 vectors. 5 panels, not 10: 2048^3 then has 99 tasks of
// ~1.7 ms, not 44 of 3.7, and a call's last task leaves the other thread idle half as long (Zen 4, 2
// threads, 7 rounds: 2048^3 +2-3%, to the rate of two separate one-thread processes; GPT-2's shapes +-1%).
#ifndef AOTC_MM_NB3
#define AOTC_MM_NB3 (AOTC_VBYTES == 64 ? 240 : 384)
#endif

// The rows and the widest columns of a task for a block of NV vectors: MR x NV accumulators.
template <int NV>
struct aotc_mm_tiles {
  static_assert(NV == 2 || NV == 3, "the matmul micro-kernel comes in blocks of 2 or 3 vectors a row");
  static constexpr int MR = NV == 2 ? AOTC_MM_MR : AOTC_MM_MR3;
  static constexpr int NB = NV == 2 ? AOTC_MM_NB : AOTC_MM_NB3;
};

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

// R x (NV vectors) register block, R <= MR: c[i][j] (+)= sum_k ap[k][i] * bp[k][j]. ``ap`` holds
// strips of MR rows (k-major), ``bp`` a panel of NR columns (k-major). With ``pf``, the first ``pfk`` steps
// each also prefetch one row of ``pf`` (a part of the next panel), so that panel is in cache when its turn
// comes: a weight panel streams from memory once per call, and this hides that behind arithmetic. The driver
// spreads a panel's rows over the strips that use the current one: a burst of a whole panel (2 lines per
// step) in one strip's call outruns the line-fill buffers and stalls the FMAs. Within a call the rows are
// spread too, one every up to AOTC_MM_PF_SPREAD steps: with few strips (the MLP's 64 rows: 6) one a step
// still came in bursts, and weights cold in memory ran 64 x 4096 x 4096 at 118 GFLOP/s against 140 with
// one every 4 (1 thread, CPU time; AVX2, at 100 GFLOP/s, needs half the bandwidth and did not move).
// One row of NR elements of a packed panel into the cache (the prefetch above; matmul_bf16.h's and
// conv_dw.h's micro-kernels too).
template <int NR, class T>
static inline __attribute__((always_inline)) void aotc_mm_prefetch_row(const T* row) {
  for (int l = 0; l < (int)(NR * sizeof(T)); l += 64) __builtin_prefetch((const char*)row + l);
}

// Row i of a register block: its NV accumulator vectors into c (the micro-kernels' last step: matmul's,
// conv_kernels.h's and conv_wino.h's).
template <class T, int NV, class V>
static inline __attribute__((always_inline)) void aotc_mm_store_row(T* c, const V* acc) {
  constexpr int L = (int)(sizeof(V) / sizeof(T));
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) memcpy(c + j * L, &acc[j], sizeof(V));
}

// A register block's first values: the R rows of c (a K slice after the first) or zeros.
template <class T, int R, int NV, class V>
static inline __attribute__((always_inline)) void aotc_mm_load_acc(V (&acc)[R][NV], const T* c, int64_t ldc, bool accumulate) {
  constexpr int L = (int)(sizeof(V) / sizeof(T));
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      if (accumulate)
        memcpy(&acc[i][j], c + i * ldc + j * L, sizeof(V));
      else
        acc[i][j] = V{};
    }
}

// A block of one or two rows (a GEMV: a classifier at batch 1) is packed densely (aotc_mm_few_rows) and runs
// here, P panels of B at once: R rows alone keep R x NV accumulators, too few chains to hide the FMA
// latency. Each output still sums its k in order in one chain, as aotc_mm_micro does, so a row's result
// does not depend on the rows beside it (the server's dynamic batching promises outputs bit for bit equal
// to a lone call's); partial sums over k were as fast but broke that. No software prefetch: each B byte is
// used once and in order, the hardware prefetcher keeps up, and the prefetches took issue slots.
template <class T, int R, int NV, int P>
static inline void aotc_mm_micro_few(int64_t kc, const T* __restrict ap, const T* __restrict bp, int64_t pstride,
                                     T* c, int64_t ldc, bool accumulate) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L;
  V acc[R][P * NV];  // panel p's vectors follow panel p - 1's in the tile row: one row of P * NV vectors
  aotc_mm_load_acc<T>(acc, c, ldc, accumulate);
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    V b[P * NV];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) memcpy(&b[p * NV + j], bp + p * pstride + k * NR + j * L, sizeof(V));
#pragma GCC unroll 2
    for (int i = 0; i < R; ++i) {
      const V a = aotc_vset1(ap[k * R + i]);
#pragma GCC unroll 16
      for (int j = 0; j < P * NV; ++j) acc[i][j] = aotc_vfma(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < R; ++i) aotc_mm_store_row<T, P * NV>(c + i * ldc, acc[i]);
}

// Up to 4 / R panels (``np``, at ``pstride`` apart) of R = ``rows`` rows: 8 chains with NV = 2.
template <class T, int NV>
static inline void aotc_mm_few(int rows, int np, int64_t kc, const T* ap, const T* bp, int64_t pstride, T* c,
                               int64_t ldc, bool accumulate) {
  if (rows == 1) {
    switch (np) {
      case 1: return aotc_mm_micro_few<T, 1, NV, 1>(kc, ap, bp, pstride, c, ldc, accumulate);
      case 2: return aotc_mm_micro_few<T, 1, NV, 2>(kc, ap, bp, pstride, c, ldc, accumulate);
      case 3: return aotc_mm_micro_few<T, 1, NV, 3>(kc, ap, bp, pstride, c, ldc, accumulate);
      default: return aotc_mm_micro_few<T, 1, NV, 4>(kc, ap, bp, pstride, c, ldc, accumulate);
    }
  }
  if (np == 1) return aotc_mm_micro_few<T, 2, NV, 1>(kc, ap, bp, pstride, c, ldc, accumulate);
  aotc_mm_micro_few<T, 2, NV, 2>(kc, ap, bp, pstride, c, ldc, accumulate);
}

// The rows R of a block that aotc_mm_micro_few takes (A packed R rows to a strip, not MR), or 0.
template <int MR>
static inline int aotc_mm_few_rows(int64_t mb) {
  return MR > 2 && mb <= 2 ? (int)mb : 0;
}

template <class T, int MR, int R, int NV>
static inline void aotc_mm_micro(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c,
                                 int64_t ldc, bool accumulate, const T* pf = NULL, int64_t pfk = 0) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L;
  V acc[R][NV];
  aotc_mm_load_acc<T>(acc, c, ldc, accumulate);
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    V b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(&b[j], bp + k * NR + j * L, sizeof(V));
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const V a = aotc_vset1(ap[k * MR + i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(a, b[j], acc[i][j]);
    }
  };
  int64_t k = 0;
  if (pf != NULL) {
    // a row of ``pf`` every ``sp`` steps, over as much of this call as the rows cover (matmul_bf16.h's
    // aotc_mm_pf_every; called here instead, BERT's 512 x 256 x 1024 ran 9% slower at AVX2 on 2 threads)
    const int64_t spread = pfk > 0 ? kc / pfk : 1;
    const int sp = spread < 1 ? 1 : (spread > AOTC_MM_PF_SPREAD ? AOTC_MM_PF_SPREAD : (int)spread);
    // SP steps per row as one unrolled body: the loop of a variable count per row ran BERT's 512 x 256 x 1024
    // (row tasks: three strips, a row every 2 steps) at 217 GFLOP/s against 237 (AVX2, 2 threads).
    auto run = [&](auto spc) __attribute__((always_inline)) {
      constexpr int SP = decltype(spc)::value;
      for (int64_t r = 0; r < pfk && k + SP <= kc; ++r, k += SP) {
        aotc_mm_prefetch_row<NR>(pf + r * NR);
#pragma GCC unroll 8
        for (int q = 0; q < SP; ++q) step(k + q);
      }
    };
    static_assert(AOTC_MM_PF_SPREAD >= 1 && AOTC_MM_PF_SPREAD <= 4, "the cases below");
    switch (sp) {
      case 1: run(std::integral_constant<int, 1>{}); break;
      case 2: run(std::integral_constant<int, 2>{}); break;
      case 3: run(std::integral_constant<int, 3>{}); break;
      default: run(std::integral_constant<int, AOTC_MM_PF_SPREAD>{}); break;
    }
  }
#pragma GCC unroll 2
  for (; k < kc; ++k) step(k);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) aotc_mm_store_row<T, NV>(c + i * ldc, acc[i]);
}

// The micro-kernel for the last ``rows`` (< MR) rows of a block: no work on the padding rows.
template <class T, int MR, int NV, int R = MR - 1>
static inline void aotc_mm_micro_tail(int rows, int64_t kc, const T* ap, const T* bp, T* c, int64_t ldc,
                                      bool accumulate, const T* pf, int64_t pfk) {
  if constexpr (R >= 1) {
    if (rows == R) return aotc_mm_micro<T, MR, R, NV>(kc, ap, bp, c, ldc, accumulate, pf, pfk);
    aotc_mm_micro_tail<T, MR, NV, R - 1>(rows, kc, ap, bp, c, ldc, accumulate, pf, pfk);
  }
}

// Strip s of a block of ``rows`` rows: MR rows from row s * MR, except that a last strip of fewer than
// MR / 2 rows shares with the one before, as two strips of about (MR + rest) / 2 rows: M = 64 with
// MR = 12 runs 4 x 12 + 8 + 8, not 5 x 12 + 4 (a 4-row block keeps 8 accumulators, too few to hide the
// FMA latency, and loads as much B as a full one). The strip count stays ceil(rows / MR).
static inline void aotc_mm_strip(int64_t rows, int MR, int64_t s, int64_t* r0, int* h) {
  const int64_t strips = (rows + MR - 1) / MR, rest = rows - (strips - 1) * MR;
  if (strips >= 2 && 2 * rest < MR && s >= strips - 2) {
    const int64_t two = MR + rest, first = (two + 1) / 2;
    *r0 = (strips - 2) * MR + (s == strips - 2 ? 0 : first);
    *h = (int)(s == strips - 2 ? first : two - first);
  } else {
    *r0 = s * MR;
    *h = (int)(rows - s * MR < MR ? rows - s * MR : MR);
  }
}

static inline int64_t aotc_roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
static inline int64_t aotc_mm_min(int64_t a, int64_t b) { return a < b ? a : b; }

// Pack rows [r0, r0 + rows) x cols [c0, c0 + cols) of a strided matrix into strips of W rows:
// dst[strip][c][w] = M[r0 + strip * W + w][c0 + c], zero past ``rows``. For A (W = MR) rows are m
// and cols are k; for B (W = NR) we pack the transpose view: rows are n and cols are k.
template <class T, class S>
static void aotc_mm_pack(T* __restrict dst, const S* src, int64_t r0, int64_t rows, int64_t rows_pad,
                         int64_t c0, int64_t cols, int64_t sr, int64_t sc, int W) {
  for (int64_t s = 0; s < rows_pad; s += W) {
    T* d = dst + s * cols;
    const int64_t live = rows - s < W ? rows - s : W;
    if (sc <= sr) {  // walk along columns (contiguous in src when sc == 1)
      for (int w = 0; w < W; ++w) {
        if (w < live) {
          const int64_t base = (r0 + s + w) * sr + c0 * sc;
          for (int64_t c = 0; c < cols; ++c) d[c * W + w] = (T)aotc_elem<S>::load(src, base + c * sc);
        } else {
          for (int64_t c = 0; c < cols; ++c) d[c * W + w] = T(0);
        }
      }
    } else {  // walk along the strip (contiguous in src when sr == 1)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t base = r0 * sr + (c0 + c) * sc;
        int w = 0;
        for (; w < live; ++w) d[c * W + w] = (T)aotc_elem<S>::load(src, base + (s + w) * sr);
        for (; w < W; ++w) d[c * W + w] = T(0);
      }
    }
  }
}

// The vector part of aotc_mm_pack_a for fp32 (AVX-512: MR <= 16 rows, AVX2: MR <= 8): L k-values of each of
// the MR rows in a register (rows past MR zero), an L x L in-register transpose, then one k's MR values per
// store. Returns how many of the kc columns it packed (a multiple of L); the caller packs the rest.
#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's intrinsics (_mm512_undefined_ps's __Y = __Y)
template <int MR>
static inline int64_t aotc_mm_pack_a_vec(float* __restrict d, const float* const* row, int64_t kc) {
  static_assert(MR <= 16, "one zmm per k");
  const __mmask16 live = (__mmask16)((1u << MR) - 1);
  int64_t c = 0;
  for (; c + 16 <= kc; c += 16) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int w = 0; w < 16; ++w) r[w] = w < MR ? _mm512_loadu_ps(row[w] + c) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved: t[2i] = r[2i][0] r[2i+1][0] r[2i][1] ...
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // quads of rows: 4 rows x 1 k per 128-bit lane
      const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d b0 = _mm512_castps_pd(t[4 * i + 2]), b1 = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
    }
    // r[4i + j] lane l: rows 4i..4i+3 at k = 4l + j. Gather the four quads' lane l into one zmm per k.
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512 q01lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44);  // lanes 0,1 of quad 0, then quad 1
      const __m512 q01hi = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xee);  // lanes 2,3
      const __m512 q23lo = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
      const __m512 q23hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xee);
      t[j] = _mm512_shuffle_f32x4(q01lo, q23lo, 0x88);       // k = j
      t[4 + j] = _mm512_shuffle_f32x4(q01lo, q23lo, 0xdd);   // k = 4 + j
      t[8 + j] = _mm512_shuffle_f32x4(q01hi, q23hi, 0x88);   // k = 8 + j
      t[12 + j] = _mm512_shuffle_f32x4(q01hi, q23hi, 0xdd);  // k = 12 + j
    }
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) _mm512_mask_storeu_ps(d + (c + k) * MR, live, t[k]);
  }
  return c;
}
#pragma GCC diagnostic pop
#define AOTC_MM_PACK_A_VEC 16
#elif defined(__AVX2__)
template <int MR>
static inline int64_t aotc_mm_pack_a_vec(float* __restrict d, const float* const* row, int64_t kc) {
  static_assert(MR <= 8, "one ymm per k");
  int64_t c = 0;
  for (; c + 8 <= kc; c += 8) {
    __m256 r[8], t[8];
#pragma GCC unroll 8
    for (int w = 0; w < 8; ++w) r[w] = w < MR ? _mm256_loadu_ps(row[w] + c) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {  // r[4i + j] lane l: rows 4i..4i+3 at k = 4l + j
      r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
      r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);      // k = j
      t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);  // k = 4 + j
    }
    // One k's MR values per store: the full ymm in k order (its junk past MR lands on later k, written
    // after), in pieces where the junk would pass the strip's end.
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      float* o = d + (c + k) * MR;
      if ((c + k) * MR + 8 <= kc * MR) {
        _mm256_storeu_ps(o, t[k]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, t[k]);
        for (int w = 0; w < MR; ++w) o[w] = tmp[w];
      }
    }
  }
  return c;
}
#define AOTC_MM_PACK_A_VEC 8
#endif

// Pack rows [m0, m0 + mb) x cols [k0, k0 + kc) of A into the strips of aotc_mm_strip: strip s at
// dst + s * MR * kc, zero past its rows. A full strip of a row-major A (sak == 1) reads its MR rows side
// by side and writes each k's MR values together: twice as fast as a row at a time with stores MR apart
// (2048 x 2048: 2.7 ms, was 5.5), which made BERT's 512 x 256 x 1024 6-10% slower (A is packed on every
// call, B at build time). For fp32 the k-values of a full strip move L at a time through registers
// (aotc_mm_pack_a_vec): in L2 twice as fast again (96 x 512: 5 us, was 10), from memory ~25% (512 x 1024:
// 0.09 ms, was 0.12); whole matmuls +0-3% (benchmarks/cpu_matmul_ab.py, 1 thread).
template <class T, class S, int MR>
static void aotc_mm_pack_a(T* __restrict dst, const S* src, int64_t m0, int64_t mb, int64_t k0, int64_t kc,
                           int64_t sam, int64_t sak) {
  const int64_t strips = (mb + MR - 1) / MR;
  for (int64_t s = 0; s < strips; ++s) {
    int64_t r0;
    int h;
    aotc_mm_strip(mb, MR, s, &r0, &h);
    T* d = dst + s * MR * kc;
    if (sak == 1 && h == MR) {
      const S* row[MR];
      for (int w = 0; w < MR; ++w) row[w] = src + (m0 + r0 + w) * sam + k0;
      int64_t c = 0;
#ifdef AOTC_MM_PACK_A_VEC
      if constexpr (std::is_same<T, float>::value && std::is_same<S, float>::value && MR <= AOTC_MM_PACK_A_VEC)
        c = aotc_mm_pack_a_vec<MR>(d, row, kc);
#endif
      for (; c < kc; ++c)
#pragma GCC unroll 16
        for (int w = 0; w < MR; ++w) d[c * MR + w] = (T)aotc_elem<S>::load(row[w], c);
    } else {
      aotc_mm_pack<T, S>(d, src, m0 + r0, h, MR, k0, kc, sam, sak, MR);
    }
  }
}

#include "matmul_bf16.h"  // bf16 pairs: their A packing and micro-kernels (it uses the strips and stores above)

// B panels packed at build time: panel p = columns [p * NR, p * NR + NR), all K rows, k-major.
template <class T>
struct aotc_mm_bpacked {
  typedef T elem;  // what the panels hold: the accumulator type, or uint32_t bf16 pairs (aotc_matmul_packed_bf16)
  const T* p;
  int64_t K;
  static constexpr bool packs = false;
  // The KC x NR slices of columns [n0, n0 + nb) (n0 a multiple of NR) at k0, and the stride between panels.
  template <int NR>
  const T* slice(int64_t, int64_t n0, int64_t, int64_t, int64_t k0, int64_t, T*, int64_t* stride) const {
    *stride = K * NR;
    return p + (n0 / NR) * K * NR + k0 * NR;
  }
};

// B strided (an activation): packed per task and K slice into the workspace.
template <class T, class S, class Off>
struct aotc_mm_bstrided {
  typedef T elem;
  const S* p;
  Off off;
  int64_t sk, sn;
  static constexpr bool packs = true;
  template <int NR>
  const T* slice(int64_t bi, int64_t n0, int64_t nb, int64_t nbp, int64_t k0, int64_t kc, T* ws,
                 int64_t* stride) const {
    aotc_mm_pack<T, S>(ws, p + off(bi), n0, nb, nbp, k0, kc, sn, sk, NR);
    *stride = kc * NR;
    return ws;
  }
};

// The per-library workspace (see the note at the top): at least ``bytes``, 64-byte aligned, kept.
static void* aotc_mm_workspace(size_t bytes) {
  static void* buf = NULL;
  static size_t cap = 0;
  if (bytes > cap) {
    free(buf);
    cap = 0;
    buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (buf == NULL) throw std::bad_alloc();
    cap = bytes;
  }
  return buf;
}

// One call's workspace of ``n`` elements: the library's kept one (aotc_mm_workspace), or, called from inside
// a parallel region (a caller's own loop, ``nested``), a private one freed with this object: the kept one is
// shared by the library's top-level calls only. Freed on scope exit, also when an exception passes.
template <class T>
struct aotc_mm_scratch {
  T* p = nullptr;
  T* own = nullptr;
  aotc_mm_scratch(size_t n, bool nested) {
    const size_t bytes = n * sizeof(T);
    if (!nested) {
      p = static_cast<T*>(aotc_mm_workspace(bytes));
      return;
    }
    own = static_cast<T*>(aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (own == NULL) throw std::bad_alloc();
    p = own;
  }
  aotc_mm_scratch(const aotc_mm_scratch&) = delete;
  aotc_mm_scratch& operator=(const aotc_mm_scratch&) = delete;
  ~aotc_mm_scratch() { free(own); }
};

// Threads for ``flops`` of work in ``tasks`` tasks.
static inline int aotc_mm_threads(double flops, int64_t tasks) {
  const int most = aotc_pool_threads();
  const double by_work = flops / AOTC_MM_FLOPS_PER_THREAD;
  int n = by_work < (double)most ? (int)by_work : most;
  n = (int64_t)n < tasks ? n : (int)tasks;
  return n > 1 ? n : 1;
}

template <class T, int NV, class SA, class OffA, class BSrc, class Epi>
static void aotc_mm_drive(int64_t batch, int64_t M, int64_t N, int64_t K, const SA* a, OffA offa, int64_t sam,
                          int64_t sak, const BSrc& bsrc, Epi epi, int64_t ka = 0) {
  typedef typename aotc_mm_vec<T>::type V;
  // P: the packed operands' element. T, or bf16 pairs (uint32_t, aotc_matmul_packed_bf16): then K counts
  // pairs and ``ka`` is A's own K, in bf16 elements.
  typedef typename BSrc::elem P;
  static_assert(sizeof(P) == sizeof(T), "the workspace holds packed operands and tiles alike");
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int MR = aotc_mm_tiles<NV>::MR, NR = NV * L, NBMAX = aotc_mm_tiles<NV>::NB;
  static_assert(AOTC_MM_MB % MR == 0 && NBMAX % NR == 0, "tile sizes must be multiples of MR, NR");
  if (batch <= 0 || M <= 0 || N <= 0) return;
  const int64_t KC = K <= AOTC_MM_KC_ONE ? (K > 0 ? K : 1) : AOTC_MM_KC;
  // Work in flops, plus the weight stream: few rows (a GEMV, MobileNet's classifier at batch 1) read every
  // byte of B for two flops each, memory-bound, so a byte counts as ~10 flops of one core's time.
  const double flops = 2.0 * (double)batch * (double)M * (double)N * (double)(K > 0 ? K : 1) +
                       (BSrc::packs ? 0.0 : 10.0 * (double)N * (double)K * sizeof(T));
  const int64_t most = aotc_pool_threads();
  // Tiles: rows up to MB, then columns up to NB, narrowed (in whole panels) until there are a few tasks
  // per thread that the work can pay for.
  // Threads claim tasks one at a time, so a loop ends within one task of balanced: 16 tasks per thread
  // make that 1/32 of a call on 2 threads where 4 made it 1/8 (the MLP's 64 x 4096 x 4096 ran 8 tasks of
  // 512 columns). One thread gets no narrowing.
  const int64_t by_work = aotc_mm_min(most, (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD));
  const int64_t want = by_work > 1 ? by_work * AOTC_MM_TASKS_PER_THREAD : 1;
  // Note (row tasks): a build-time packed B that fits in L2 (BERT's weights: 256-1024 x 256-1024) is split
  // by rows only, each task a few strips of rows across all of N that packs its own rows of A. Each
  // thread's L2 then holds all of B, and A is packed once, by the thread that uses it. The tiles of
  // MB x NB below instead packed A in a pass of its own before the tasks, so that on 2 threads half the
  // packed A was read from the other core's cache (and the pass itself scaled poorly): 512 x 256 x 1024
  // scaled 1.6x from 1 to 2 threads, and 1.85x with no packing at all.
  const bool row_tasks = !BSrc::packs && by_work > 1 && (double)N * (double)K * sizeof(T) <= AOTC_MM_B_L2 &&
                         batch * M >= (int64_t)AOTC_MM_ROW_STRIPS * MR * by_work;
  // Row blocks of equal height, each at most AOTC_MM_MB: every row block streams all of B once, so M = 128
  // takes one block of 128, not 120 + 8 (two passes over the weights, the second for 8 rows). Row tasks
  // take about ``want`` blocks, each of AOTC_MM_ROW_STRIPS strips at least (a B panel loaded to L1 serves
  // them all).
  int64_t mblocks = (M + AOTC_MM_MB - 1) / AOTC_MM_MB;
  if (row_tasks) {
    const int64_t per_batch = (want + batch - 1) / batch;
    int64_t mb = aotc_roundup((M + per_batch - 1) / per_batch, MR);
    mb = aotc_mm_min(mb < AOTC_MM_ROW_STRIPS * MR ? AOTC_MM_ROW_STRIPS * MR : mb, AOTC_MM_MB);
    mblocks = (M + mb - 1) / mb;
  }
  const int64_t MB = aotc_roundup((M + mblocks - 1) / mblocks, MR);
  int64_t NB = row_tasks ? aotc_roundup(N, NR) : aotc_mm_min(aotc_roundup(N, NR), (int64_t)NBMAX);
  while (!row_tasks && NB > NR && batch * mblocks * ((N + NB - 1) / NB) < want) NB = aotc_roundup(NB / 2, NR);
  // Note (big A): a task walks K in slices, each slice of its A block against each of its panels, so every
  // task reads all of its A block once. Past AOTC_MM_A_L2 (GPT-2's fc-proj, 128 x 768 x 3072: 1.6 MiB) the
  // streaming B pushes A out of L2, and tasks of one panel (where the narrowing above ends on 2 threads)
  // fetched all of A from L3 or the other core once per 32 columns. Tasks keep AOTC_MM_PANELS_BIG_A
  // panels while every thread still gets one: 2 threads, CPU time, 31 interleaved rounds (cpu_matmul_ab.py
  // --cpu-time [--cold]), against 1 panel: 128 x 768 x 3072 +7/+6% (hot/cold), 64 x 1024 x 4096 +3/+6%;
  // 2 panels +2-8%, 8 panels within 3% of 4. Several row blocks too (GPT-2's fc-proj at 4 x 128 tokens,
  // three blocks of 180 x 3072, had tasks of 2 panels): 512 x 768 x 3072 +8% cold (15 rounds), 2048^3 +0-1%.
  if (!row_tasks && (double)MB * (double)K * sizeof(T) > AOTC_MM_A_L2) {
    const int64_t threads = by_work > 1 ? by_work : 1;
    const int64_t floor = aotc_mm_min(AOTC_MM_PANELS_BIG_A * NR, aotc_roundup((N + threads - 1) / threads, NR));
    NB = aotc_mm_min(NB < floor ? floor : NB, aotc_roundup(N, NR));
  }
  const int64_t nblocks = (N + NB - 1) / NB;
  const int64_t tasks = batch * mblocks * nblocks;
  const int64_t kc_max = K < KC ? (K > 0 ? K : 1) : KC, kslices = K > 0 ? (K + KC - 1) / KC : 0;
  // A is packed once for all column blocks when there are several and it fits: then narrow tasks (for
  // balance between threads) cost no repacking. Block (b, mi), slice k0 starts at (b * mblocks + mi) *
  // MB * K + k0 * mbp.
  // With B packed at build time and an A block whose every K slice fits in L2 together (skinny M: the
  // MLP's and GPT-2's 64-512 rows), a task walks each B panel down all of K (panel_outer) instead of each
  // K slice across all panels: the weights then stream in memory order (the hardware prefetcher follows,
  // and the software prefetch reads the bytes right after), and a panel's tile columns stay in L1 over K.
  const int64_t ablocks = batch * mblocks;
  const bool a_fits = !BSrc::packs && (double)MB * (double)K * sizeof(T) <= AOTC_MM_A_L2;
  const bool shared_a = !row_tasks && (nblocks > 1 || a_fits) &&
                        (double)ablocks * (double)(MB * kc_max * kslices) * sizeof(T) <= 32e6;
  const bool panel_outer = a_fits && shared_a;
  const int64_t a_all = shared_a ? aotc_roundup(ablocks * MB * kc_max * kslices, 64 / sizeof(T)) : 0;
  // per-thread workspace: tile, packed A block, packed B panels (when B is not prepacked), in T elements
  const int64_t per = aotc_roundup(MB * NB + MB * kc_max + (BSrc::packs ? NB * kc_max : 0), 64 / sizeof(T));
  // Called from inside a parallel region (a caller's own loop), a matmul runs serially on a private
  // workspace: the kept one is shared by the library's top-level calls only.
  const bool nested = omp_in_parallel() || aotc_pool_inside;
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  const aotc_mm_scratch<T> scratch((size_t)a_all + (size_t)per * (size_t)nthreads, nested);
  T* const ws_base = scratch.p;
  P* const apacked = reinterpret_cast<P*>(ws_base);
  T* const ws_all = ws_base + a_all;
  {
    if (shared_a) {
      aotc_pool_run(ablocks * kslices, nthreads, [&](int64_t j, int) {
        const int64_t blk = j / kslices, k0 = j % kslices * KC, bi = blk / mblocks, m0 = blk % mblocks * MB;
        const int64_t mb = aotc_mm_min(M - m0, MB);
        aotc_mm_pack_a_any<T, SA, MR>(apacked + blk * MB * K + k0 * aotc_roundup(mb, MR), a + offa(bi), m0, mb, k0,
                                      aotc_mm_min(K - k0, KC), sam, sak, ka);
      });
    }
    // Task t is (batch, row block, column block). On one thread, row blocks go innermost when a column
    // block of B fits in L2 with room to spare: the tasks that read one block of B then run next to each
    // other, so B streams from memory about once, not once per row block (GPT-2 at 4 x 128 tokens has three
    // blocks of 176 rows). On several threads each walks a contiguous share of the tasks (aotc_pool_claim):
    // with row blocks outermost that share is its own row blocks, whose A it packed itself, where row blocks
    // innermost made every thread read all of A, half of it from the other core. 2 threads, against row
    // blocks innermost (cpu_matmul_ab.py, three runs hot and --cold, wall): 512 x 768 x 768 +5-11% at AVX2
    // and AVX-512, GPT-2's and BERT's other shapes and 1024^3 -2% to +9%. On one thread, CPU time, row blocks
    // outermost gave 0.94-1.00: one thread keeps them innermost.
    const bool m_inner = nthreads == 1 && (double)NB * (double)K * sizeof(T) < AOTC_MM_A_L2;
    auto coords = [&](int64_t t, int64_t* bi, int64_t* mi, int64_t* ni) {
      *bi = t / (mblocks * nblocks);
      *mi = m_inner ? t % mblocks : t / nblocks % mblocks;
      *ni = m_inner ? t / mblocks % nblocks : t % nblocks;
    };
    // The first B slice of task ``t``, or NULL: a task's last panel prefetches the first of the task this
    // thread likely claims next (t + 1: a thread walks its own share of the tasks, aotc_pool_claim), so
    // the stream of a build-time packed B has no cold start per task; narrow tasks (2 threads, 32-64
    // columns) made that a cache miss every 2-8 panels.
    auto first_slice = [&](int64_t t) -> const P* {
      if constexpr (BSrc::packs) {
        return NULL;
      } else {
        if (t >= tasks) return NULL;
        int64_t bi, mi, ni, ps = 0;
        coords(t, &bi, &mi, &ni);
        return bsrc.template slice<NR>(bi, ni * NB, 0, 0, 0, 0, NULL, &ps);
      }
    };
    aotc_pool_run(tasks, nthreads, [&](int64_t t, int slot) {
      T* tile = ws_all + (int64_t)slot * per;
      int64_t bi, mi, ni;
      coords(t, &bi, &mi, &ni);
      const int64_t m0 = mi * MB, n0 = ni * NB;
      const int64_t mb = aotc_mm_min(M - m0, MB), nb = aotc_mm_min(N - n0, NB);
      const int64_t mbp = aotc_roundup(mb, MR), nbp = aotc_roundup(nb, NR);
      P* bws = reinterpret_cast<P*>(tile + MB * NB + MB * kc_max);
      const SA* ab = a + offa(bi);
      // One KC x NR panel slice ``bj`` against every strip of ``ap`` into tile columns [js, js + NR), the
      // next slice in ``next`` prefetched a part per strip.
      auto panel = [&](const P* ap, int64_t kc, const P* bj, const P* next, int64_t js, bool accumulate) {
        const int64_t strips = mbp / MR, chunk = (kc + strips - 1) / strips;
        for (int64_t s = 0; s < strips; ++s) {
          int64_t r0;
          int h;
          aotc_mm_strip(mb, MR, s, &r0, &h);
          const P* pf = next != NULL && s * chunk < kc ? next + s * chunk * NR : NULL;
          const int64_t pfk = aotc_mm_min(chunk, kc - s * chunk);
          T* c = tile + r0 * nbp + js;
          if constexpr (!std::is_same<P, T>::value)
            aotc_mm_micro_pairs<MR, NV>(h, kc, ap + s * MR * kc, bj, c, nbp, accumulate, pf, pfk);
          else if (h == MR)
            aotc_mm_micro<T, MR, MR, NV>(kc, ap + s * MR * kc, bj, c, nbp, accumulate, pf, pfk);
          else
            aotc_mm_micro_tail<T, MR, NV>(h, kc, ap + s * MR * kc, bj, c, nbp, accumulate, pf, pfk);
        }
      };
      // One or two rows (fp32): aotc_mm_few over the panels from column js, as many as it takes at once.
      int few = 0;
      if constexpr (std::is_same<P, T>::value) few = aotc_mm_few_rows<MR>(mb);
      auto few_panels = [&](int64_t js) -> int64_t {
        return few ? aotc_mm_min(4 / few, (nbp - js) / NR) : 1;
      };
      auto few_run = [&](const P* ap, int64_t kc, const P* bj, int64_t pstride, int64_t js, bool accumulate) {
        if constexpr (std::is_same<P, T>::value)
          aotc_mm_few<T, NV>(few, (int)few_panels(js), kc, ap, bj, pstride, tile + js, nbp, accumulate);
      };
      if (K <= 0) memset(tile, 0, sizeof(T) * (size_t)(mb * nbp));
      if (panel_outer) {  // each panel down all of K: B streams in memory order, its tile columns stay in L1
        int64_t pstride = 0;
        const P* b0 = bsrc.template slice<NR>(bi, n0, nb, nbp, 0, K, bws, &pstride);
        const P* ablk = apacked + (bi * mblocks + mi) * MB * K;
        for (int64_t js = 0; js < nbp; js += few_panels(js) * NR)
          for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = aotc_mm_min(K - k0, KC);
            const P* bj = b0 + (js / NR) * pstride + k0 * NR;
            const bool last = js + NR >= nbp && k0 + KC >= K;
            if (few)
              few_run(ablk + k0 * mbp, kc, bj, pstride, js, k0 > 0);
            else
              panel(ablk + k0 * mbp, kc, bj, last ? first_slice(t + 1) : bj + kc * NR, js, k0 > 0);
          }
      } else {
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          const int64_t kc = aotc_mm_min(K - k0, KC);
          int64_t pstride = 0;
          const P* bp = bsrc.template slice<NR>(bi, n0, nb, nbp, k0, kc, bws, &pstride);
          const P* ap = apacked + (bi * mblocks + mi) * MB * K + k0 * mbp;
          if (!shared_a) {
            P* own_ap = reinterpret_cast<P*>(tile + MB * NB);
            aotc_mm_pack_a_any<T, SA, MR>(own_ap, ab, m0, mb, k0, kc, sam, sak, ka);
            ap = own_ap;
          }
          // The next K slice's first panel (or the next task's), prefetched during this slice's last: a
          // build-time packed B only (a strided one is packed per slice, in the workspace).
          const P* next_slice = NULL;
          if constexpr (!BSrc::packs) {
            if (k0 + KC < K) {
              int64_t ps = 0;
              next_slice = bsrc.template slice<NR>(bi, n0, nb, nbp, k0 + KC, 0, bws, &ps);
            } else {
              next_slice = first_slice(t + 1);
            }
          }
          for (int64_t js = 0; js < nbp; js += few_panels(js) * NR) {
            const P* bj = bp + (js / NR) * pstride;
            if (few)
              few_run(ap, kc, bj, pstride, js, k0 > 0);
            else
              panel(ap, kc, bj, js + NR < nbp ? bj + pstride : next_slice, js, k0 > 0);
          }
        }
      }
      epi(bi, m0, mb, n0, nb, (const T*)tile, nbp);
    });
  }
}

// The batched matmul of two strided operands. ``offa(b)``/``offb(b)`` give the element offset of batch b.
template <class T, class SA, class SB, class OffA, class OffB, class Epi>
void aotc_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, const SA* a, OffA offa, int64_t sam,
                 int64_t sak, const SB* b, OffB offb, int64_t sbk, int64_t sbn, Epi epi) {
  const aotc_mm_bstrided<T, SB, OffB> bsrc{b, offb, sbk, sbn};
  aotc_mm_drive<T, AOTC_MM_NV>(batch, M, N, K, a, offa, sam, sak, bsrc, epi);
}

// The batched matmul with a build-time packed B (the same for every batch): ``bp`` is [ceil(N/NR)][K][NR],
// NR = NV vectors (the block the packing chose: aotc_mm_tiles).
template <class T, int NV = AOTC_MM_NV, class SA, class OffA, class Epi>
void aotc_matmul_packed(int64_t batch, int64_t M, int64_t N, int64_t K, const SA* a, OffA offa, int64_t sam,
                        int64_t sak, const T* bp, Epi epi) {
  const aotc_mm_bpacked<T> bsrc{bp, K};
  aotc_mm_drive<T, NV>(batch, M, N, K, a, offa, sam, sak, bsrc, epi);
}

#include "matmul_amx.h"  // the bf16 driver on AMX tiles (it uses the pool, threads and workspace above)

// The bf16 matmul with a build-time packed B of bf16 pairs (matmul_bf16.h): ``bp`` is
// [ceil(N/NR)][ceil(K/2)][NR] pairs, NR = NV vectors; A's elements and the tile's are bf16 and fp32.
template <int NV = AOTC_MM_NV, class OffA, class Epi>
void aotc_matmul_packed_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, const aotc_bf16_tag* a, OffA offa,
                             int64_t sam, int64_t sak, const aotc_bf16_tag* bp, Epi epi) {
  const int64_t kp = K > 0 ? (K + 1) / 2 : 0;
  const aotc_mm_bpacked<uint32_t> bsrc{reinterpret_cast<const uint32_t*>(static_cast<const void*>(bp)), kp};
#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 11 && defined(__linux__)
  if (aotc_mm_have_amx()) return aotc_mm_drive_amx<NV>(batch, M, N, K, a, offa, sam, sak, bsrc.p, kp, epi);
#endif
  aotc_mm_drive<float, NV>(batch, M, N, kp, a, offa, sam, sak, bsrc, epi, K);
}

#ifdef AOTC_SELFTEST_MATMUL
#include <vector>
// C[batch, M, N] = A[batch][M, K] @ B, both strided and with B packed (the same B for every batch), on
// small integers (exact in fp32), at sizes that are no multiple of the blocks.
// The packed B in panels of NV vectors.
template <int NV = AOTC_MM_NV>
static int aotc_mm_check(int64_t batch, int64_t M, int64_t N, int64_t K) {
  const int64_t NR = NV * AOTC_VBYTES / 4, P = (N + NR - 1) / NR;
  std::vector<float> a(batch * M * K), b(N * K), bp(P * K * NR, 0.0f), c(batch * M * N, -1.0f), d(c);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (float)((i * 7) % 13) - 6.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = (float)((i * 5) % 11) - 5.0f;
  for (int64_t n = 0; n < N; ++n)  // b is stored transposed: B[k, n] = b[n * K + k]
    for (int64_t k = 0; k < K; ++k) bp[(n / NR * K + k) * NR + n % NR] = b[n * K + k];
  auto into = [&](std::vector<float>& out) {
    return [&](int64_t bi, int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float* tile, int64_t ldt) {
      for (int64_t m = m0; m < m0 + mb; ++m)
        for (int64_t n = n0; n < n0 + nb; ++n) out[(bi * M + m) * N + n] = tile[(m - m0) * ldt + (n - n0)];
    };
  };
  auto offa = [&](int64_t bi) { return bi * M * K; };
  aotc_matmul<float>(batch, M, N, K, a.data(), offa, K, 1, b.data(), [](int64_t) { return (int64_t)0; }, 1, K,
                     into(c));
  aotc_matmul_packed<float, NV>(batch, M, N, K, a.data(), offa, K, 1, bp.data(), into(d));
  int fails = 0;
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += (double)a[(bi * M + m) * K + k] * b[n * K + k];
        const int64_t i = (bi * M + m) * N + n;
        fails += (c[i] != (float)ref) + (d[i] != (float)ref);
      }
  return fails;
}

// The bf16 path: A [batch][M, K] and B [K, N] of small integers (exact in bf16, their sums exact in fp32),
// B packed into pairs as cpp_pack.py does, A strided with a row pitch past K (sak == 1) or transposed
// (sak != 1): the VDPBF16PS kernel where the CPU has it, then the widening one.
template <int NV = AOTC_MM_NV>
static int aotc_mm_check_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, bool transposed) {
  const int64_t NR = NV * AOTC_VBYTES / 4, P = (N + NR - 1) / NR, KP = (K + 1) / 2, pitch = K + 3;
  std::vector<aotc_bf16_tag> a(batch * M * pitch + M * K), bp(P * KP * NR * 2, aotc_bf16_tag{0});
  std::vector<float> av(a.size()), b(K * N), c(batch * M * N, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) {
    av[i] = (float)((i * 7) % 13) - 6.0f;
    a[i].bits = (uint16_t)(aotc_f32_bits(av[i]) >> 16);
  }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      b[k * N + n] = (float)((k * 5 + n * 3) % 11) - 5.0f;
      bp[((n / NR * KP + k / 2) * NR + n % NR) * 2 + k % 2].bits = (uint16_t)(aotc_f32_bits(b[k * N + n]) >> 16);
    }
  const int64_t sam = transposed ? 1 : pitch, sak = transposed ? M : 1, per = transposed ? M * K : M * pitch;
  auto offa = [&](int64_t bi) { return bi * per; };
  int fails = 0;
  for (int pass = 0; pass < 3; ++pass) {  // AMX, VDPBF16PS, widened
    aotc_mm_amx = pass == 0 ? -1 : 0;
    aotc_mm_dpbf16 = pass == 1 ? 1 : 0;
    if ((pass == 0 && !aotc_mm_have_amx()) || (pass == 1 && !aotc_mm_have_dpbf16())) continue;
    aotc_matmul_packed_bf16<NV>(batch, M, N, K, a.data(), offa, sam, sak, bp.data(),
                                [&](int64_t bi, int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float* tile, int64_t ldt) {
                                  for (int64_t m = m0; m < m0 + mb; ++m)
                                    for (int64_t n = n0; n < n0 + nb; ++n) c[(bi * M + m) * N + n] = tile[(m - m0) * ldt + (n - n0)];
                                });
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0;
          for (int64_t k = 0; k < K; ++k) ref += (double)av[bi * per + m * sam + k * sak] * b[k * N + n];
          fails += c[(bi * M + m) * N + n] != (float)ref;
        }
  }
  aotc_mm_dpbf16 = aotc_mm_amx = -1;
  if (fails) printf("bf16 matmul: %d wrong at %ldx%ldx%ldx%ld%s\n", fails, (long)batch, (long)M, (long)N, (long)K, transposed ? " (A transposed)" : "");
  return fails;
}

int main() {
  int fails = aotc_mm_check(2, 37, 70, 300);  // K over one slice, N and M ragged
  fails += aotc_mm_check(1, 5, 3, 7);          // K < KC, N < NR, M < MR
  fails += aotc_mm_check(3, 130, 600, 40);     // several tiles in both directions
  fails += aotc_mm_check(1, 401, 70, 33);      // rows over AOTC_MM_MB: equal row blocks, the last shorter
  fails += aotc_mm_check(2, 301, 70, 300);     // row tasks (B fits in L2) on 2 threads or more
  for (int64_t m = 1; m <= 3 * AOTC_MM_MR + 1; ++m)  // every split of the last two strips (aotc_mm_strip)
    fails += aotc_mm_check(1, m, 2 * AOTC_MM_NR_F32 + 3, m % 3 == 0 ? 1 : 9);  // K = 1 too
  fails += aotc_mm_check(1, 64, 1, 500);       // one column, rows 4 x 12 + 8 + 8 on AVX-512
  fails += aotc_mm_check(1, 37, 200, 7300);    // one row block of A past AOTC_MM_A_L2, N ragged: wide tasks
  fails += aotc_mm_check(1, 401, 200, 2000);   // three row blocks, each past AOTC_MM_A_L2: wide tasks too
  fails += aotc_mm_check(3, 1, 1000, 1283);    // GEMVs (aotc_mm_micro_few): K over slices, ragged panel groups
  fails += aotc_mm_check(2, 2, 70, 301);
  // The wide block: ragged strips and panels, row tasks, big A, several tiles.
  for (int64_t m = 1; m <= 2 * AOTC_MM_MR3 + 1; ++m) fails += aotc_mm_check<3>(1, m, 3 * AOTC_MM_NR_F32 + 5, 9);
  fails += aotc_mm_check<3>(2, 301, 70, 300);
  fails += aotc_mm_check<3>(1, 401, 200, 2000);
  fails += aotc_mm_check<3>(3, 130, 1000, 40);
#pragma omp parallel num_threads(2) reduction(+ : fails)
  fails += aotc_mm_check(2, 19, 40, 50);  // nested in a caller's parallel region: private workspaces
  // bf16 pairs: odd K (a half pair), K over several slices, ragged strips and panels, row tasks, big A
  for (int t = 0; t < 2; ++t) {
    fails += aotc_mm_check_bf16(2, 37, 70, 301, t);
    fails += aotc_mm_check_bf16(1, 5, 3, 7, t);
    fails += aotc_mm_check_bf16(3, 130, 600, 40, t);
    fails += aotc_mm_check_bf16(2, 301, 70, 300, t);
    fails += aotc_mm_check_bf16(1, 1, 33, 1, t);
    fails += aotc_mm_check_bf16(1, 37, 200, 4001, t);
    fails += aotc_mm_check_bf16<3>(1, 19, 3 * AOTC_MM_NR_F32 + 5, 9, t);
    fails += aotc_mm_check_bf16<3>(2, 301, 70, 301, t);
  }
  return fails != 0;
}
#endif

#endif  // AOTC_MATMUL_H
