// bf16 matmuls on AMX tiles (TDPBF16PS): what aotc_matmul_packed_bf16 (matmul.h) runs where the CPU has AMX
// and Linux lets the process use it, in place of the VDPBF16PS driver.
//
// The build-time packed B (bf16 pairs, [ceil(N / NR)][ceil(K / 2)][NR], matmul_bf16.h) is already AMX's B
// layout: a B tile is 16 rows of pairs x 16 columns, loaded from a panel at a row stride of NR pairs. A is
// packed per call into 16-row groups of 32-element (64-byte) chunks, zero past M and K, so that every tile
// is 16 x 64 bytes and one tile configuration serves every call. A block of 32 rows by two 16-column tile
// columns (of one panel, or of two where panels are 48 wide) keeps its 2 x 2 accumulator tiles over all of
// K, then stores them into the fp32 tile the driver's epilogue reads. Every row count takes this path on a
// CPU with AMX, so a row's result does not depend on the rows beside it (the server's batching promises it).
// Numerics: pair products exact in fp32, sums rounded to nearest even, denormals flushed, like VDPBF16PS
// (the two may differ in the last bits: a machine uses one or the other for every call).
// What it is not: the fp32 path (AMX has no fp32 multiply), nor attention's matmuls.
#ifndef AOTC_MATMUL_H
#include "matmul.h"
#endif
#ifndef AOTC_MATMUL_AMX_H
#define AOTC_MATMUL_AMX_H

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <cpuid.h>

// aotc_mm_amx = 0 turns AMX off (the self-test runs both paths); -1: use it where the CPU has it.
[[maybe_unused]] static int aotc_mm_amx = -1;

// Whether this process may run AMX bf16 (asked once): the CPU reports AMX-TILE and AMX-BF16 (CPUID 7.0
// EDX bits 24 and 22) and Linux grants the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, 5.16 and later;
// without the grant the first tile instruction faults).
static inline bool aotc_mm_have_amx() {
#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 11 && defined(__linux__) && defined(SYS_arch_prctl)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1)) return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  }();
  return has && aotc_mm_amx != 0;
#else
  return false;
#endif
}

#if defined(__AVX512F__) && defined(__GNUC__) && __GNUC__ >= 11 && defined(__linux__)

// Rows [m0, m0 + groups * 16) x all K of a bf16 A into groups of 16 rows x ``chunks`` chunks of 32 values:
// value (row r, k) of group g at dst[(g * chunks + k / 32) * 512 + r * 32 + k % 32], zero past M and K.
static inline void aotc_mm_amx_pack_a(uint16_t* __restrict dst, const aotc_bf16_tag* src, int64_t m0, int64_t groups,
                                      int64_t M, int64_t K, int64_t chunks, int64_t sam, int64_t sak) {
  for (int64_t g = 0; g < groups; ++g)
    for (int r = 0; r < 16; ++r) {
      const int64_t m = m0 + g * 16 + r;
      uint16_t* d = dst + g * chunks * 512 + r * 32;
      if (m >= M) {
        for (int64_t ch = 0; ch < chunks; ++ch) memset(d + ch * 512, 0, 64);
        continue;
      }
      const aotc_bf16_tag* row = src + m * sam;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const int64_t k0 = ch * 32, n = aotc_mm_min(32, K - k0);
        if (sak == 1) {
          memcpy(d + ch * 512, row + k0, 2 * (size_t)n);
        } else {
          for (int64_t c = 0; c < n; ++c) d[ch * 512 + c] = row[(k0 + c) * sak].bits;
        }
        if (n < 32) memset(d + ch * 512 + n, 0, 2 * (size_t)(32 - n));
      }
    }
}

struct aotc_mm_amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Every tile 16 rows x 64 bytes (C: 16 x 16 fp32; A: 16 rows x 32 bf16; B: 16 rows of pairs x 16 columns).
// A constant: GCC drops stores into a local configuration (it does not see LDTILECFG read them), and the
// garbage left in the unused tiles' fields made LDTILECFG fault.
__attribute__((target("amx-tile"))) static inline void aotc_mm_amx_configure() {
  alignas(64) static const aotc_mm_amx_cfg cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
  _tile_loadconfig(&cfg);
}

// B chunk ch of a tile column is rows of pairs [16 ch, 16 ch + 16) of its 16 columns in the panel (at the
// panel's row stride); the last chunk, when partial, comes from a zero-padded copy (``t0``, ``t1``, 64-byte
// rows), peeled off the loop: reading past the panel would read the next one, or past the weights.

// 32 rows x two tile columns of 16 (B tiles b0 and b1, from one panel or two): accumulators 0-3, A in 4-5,
// B in 6-7. Each chunk loads 4 tiles for 4 products: tile loads, not products, bound these kernels, and a
// 16 x 48 block (1 A and 3 B tiles for 3 products) ran 1.3-1.45x slower.
// Each product issued as soon as its tiles are loaded (2-6% over four loads, then four products).
#define AOTC_AMX_2X2(A, B0, B1, SB)  \
  _tile_loadd(4, A, 64);             \
  _tile_loadd(6, B0, SB);            \
  _tile_dpbf16ps(0, 4, 6);           \
  _tile_loadd(7, B1, SB);            \
  _tile_dpbf16ps(1, 4, 7);           \
  _tile_loadd(5, (A) + astride, 64); \
  _tile_dpbf16ps(2, 5, 6);           \
  _tile_dpbf16ps(3, 5, 7)
template <int NR>
__attribute__((target("amx-tile,amx-bf16"))) static void aotc_mm_amx_2x2(int64_t chunks, int64_t full, const uint16_t* ap,
                                                                        int64_t astride, const uint32_t* b0, const uint32_t* t0,
                                                                        const uint32_t* b1, const uint32_t* t1, float* c0,
                                                                        float* c1, int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t ch = 0; ch < full; ++ch) {
    AOTC_AMX_2X2(ap + ch * 512, b0 + ch * 16 * NR, b1 + ch * 16 * NR, NR * 4);
  }
  if (full < chunks) {
    AOTC_AMX_2X2(ap + full * 512, t0, t1, 64);
  }
  _tile_stored(0, c0, ldc * 4);
  _tile_stored(1, c1, ldc * 4);
  _tile_stored(2, c0 + 16 * ldc, ldc * 4);
  _tile_stored(3, c1 + 16 * ldc, ldc * 4);
}
#undef AOTC_AMX_2X2

// 32 rows x one tile column (the last of an odd count): accumulators 0-1, A in 2-3, B in 4.
#define AOTC_AMX_2X1(A, B0, SB)      \
  _tile_loadd(2, A, 64);             \
  _tile_loadd(4, B0, SB);            \
  _tile_dpbf16ps(0, 2, 4);           \
  _tile_loadd(3, (A) + astride, 64); \
  _tile_dpbf16ps(1, 3, 4)
template <int NR>
__attribute__((target("amx-tile,amx-bf16"))) static void aotc_mm_amx_2x1(int64_t chunks, int64_t full, const uint16_t* ap,
                                                                        int64_t astride, const uint32_t* b0, const uint32_t* t0,
                                                                        float* c0, int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t ch = 0; ch < full; ++ch) {
    AOTC_AMX_2X1(ap + ch * 512, b0 + ch * 16 * NR, NR * 4);
  }
  if (full < chunks) {
    AOTC_AMX_2X1(ap + full * 512, t0, 64);
  }
  _tile_stored(0, c0, ldc * 4);
  _tile_stored(1, c0 + 16 * ldc, ldc * 4);
}
#undef AOTC_AMX_2X1

__attribute__((target("amx-tile"))) static inline void aotc_mm_amx_release() { _tile_release(); }

// The driver: tasks of (batch, row block, column block) as aotc_mm_drive's, A packed once for all of them;
// each task runs its panels (outer: B streams once per task) against its row groups, then the epilogue.
// ``K`` counts bf16 values, ``kp`` pairs (B's rows).
template <int NV, class OffA, class Epi>
static void aotc_mm_drive_amx(int64_t batch, int64_t M, int64_t N, int64_t K, const aotc_bf16_tag* a, OffA offa,
                              int64_t sam, int64_t sak, const uint32_t* bp, int64_t kp, Epi epi) {
  constexpr int NR = NV * 16, ROWS = 32;  // blocks of 32 rows x 32 columns (two tile columns of 16)
  if (batch <= 0 || M <= 0 || N <= 0) return;
  const int64_t chunks = (kp + 15) / 16, full = kp / 16;
  const int64_t mpad = aotc_roundup(M, ROWS), gpad = mpad / 16;  // A groups of 16 rows per batch, zero past M
  // A tile product does ~16x an fp32 FMA's work, so a thread pays for itself at ~8x the flops; the weight
  // stream counts as in aotc_mm_drive (a byte ~10 flops of one core's time): a GEMV is memory-bound, and
  // left on one thread by its flops alone it read 4096 x 4096 bf16 weights at 23 GB/s instead of 37.
  const double work = 2.0 * (double)batch * (double)M * (double)N * (double)(K > 0 ? K : 1) / 8.0 +
                      10.0 * (double)N * (double)kp * 4.0;
  const int64_t most = aotc_pool_threads();
  const int64_t by_work = aotc_mm_min(most, (int64_t)(work / AOTC_MM_FLOPS_PER_THREAD));
  const int64_t want = by_work > 1 ? by_work * AOTC_MM_TASKS_PER_THREAD : 1;
  const int64_t mblocks = (mpad + AOTC_MM_MB - 1) / AOTC_MM_MB;
  const int64_t MB = aotc_roundup((mpad + mblocks - 1) / mblocks, ROWS);
  int64_t NB = aotc_mm_min(aotc_roundup(N, NR), 16 * NR);
  while (NB > NR && batch * mblocks * ((N + NB - 1) / NB) < want) NB = aotc_roundup(NB / 2, NR);
  const int64_t nblocks = (N + NB - 1) / NB, tasks = batch * mblocks * nblocks;
  // workspace, in floats: packed A (bf16, two to a float), then per thread a tile and the B tail chunks
  // (16 x 16 pairs per tile column)
  const int64_t a_all = aotc_roundup(batch * gpad * chunks * 256, 16);
  const int64_t per = aotc_roundup(MB * NB + 16 * NB, 16);
  const bool nested = omp_in_parallel() || aotc_pool_inside;
  const int nthreads = nested ? 1 : aotc_mm_threads(work, tasks);
  const aotc_mm_scratch<float> scratch((size_t)a_all + (size_t)per * (size_t)nthreads, nested);
  float* const ws = scratch.p;
  uint16_t* const apk = reinterpret_cast<uint16_t*>(ws);
  aotc_pool_run(batch * gpad, nthreads, [&](int64_t j, int) {
    const int64_t bi = j / gpad, g = j % gpad;
    aotc_mm_amx_pack_a(apk + (bi * gpad + g) * chunks * 512, a + offa(bi), g * 16, 1, M, K, chunks, sam, sak);
  });
  aotc_pool_run(tasks, nthreads, [&](int64_t t, int slot) {
    float* tile = ws + a_all + (int64_t)slot * per;
    uint32_t* tails = reinterpret_cast<uint32_t*>(tile + MB * NB);
    const int64_t bi = t / (mblocks * nblocks), mi = t / nblocks % mblocks, ni = t % nblocks;
    const int64_t m0 = mi * MB, n0 = ni * NB;
    const int64_t mb = aotc_mm_min(M - m0, MB), nb = aotc_mm_min(N - n0, NB);
    if (mb <= 0) return;  // a block of padding rows alone
    const int64_t rows = aotc_roundup(mb, ROWS), cols = aotc_roundup(nb, NR) / 16;  // tile columns
    const uint16_t* ablk = apk + (bi * gpad + m0 / 16) * chunks * 512;
    // tile column q: 16 columns at offset q % NV * 16 of panel q / NV; its tail chunk at tails + q * 256
    auto column = [&](int64_t q) { return bp + ((n0 / 16 + q) / NV) * kp * NR + (q % NV) * 16; };
    if (full < chunks)
      for (int64_t q = 0; q < cols; ++q) {
        uint32_t* tq = tails + q * 256;
        memset(tq, 0, sizeof(uint32_t) * 256);
        for (int64_t r = 0; r < kp - full * 16; ++r) memcpy(tq + r * 16, column(q) + (full * 16 + r) * NR, 64);
      }
    aotc_mm_amx_configure();
    for (int64_t q = 0; q < cols; q += 2) {
      for (int64_t r = 0; r < rows; r += ROWS) {
        const uint16_t* ap = ablk + r / 16 * chunks * 512;
        float* c = tile + r * cols * 16 + q * 16;
        if (q + 1 < cols)
          aotc_mm_amx_2x2<NR>(chunks, full, ap, chunks * 512, column(q), tails + q * 256, column(q + 1),
                              tails + (q + 1) * 256, c, c + 16, cols * 16);
        else
          aotc_mm_amx_2x1<NR>(chunks, full, ap, chunks * 512, column(q), tails + q * 256, c, cols * 16);
      }
    }
    aotc_mm_amx_release();  // no tile state left for context switches to save
    epi(bi, m0, mb, n0, nb, (const float*)tile, cols * 16);
  });
}
#endif

#endif  // AOTC_MATMUL_AMX_H
