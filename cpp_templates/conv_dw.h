// An inverted-residual block (MobileNetV2's expand 1x1 -> depthwise -> project 1x1) in one pass over the
// image, row by row, so that the expanded activations (6x the block's input and output) never leave the
// cache: each thread keeps a ring of KH expanded input rows, runs the depthwise conv over them into one
// row, and projects that row straight away. Run as three kernels the 6x tensor is written and read twice
// (expand -> dw -> project): on the first blocks of MobileNetV2 (96 x 112 x 112 floats, 4.8 MB each way)
// that traffic, not arithmetic, is the time.
//
//   aotc_conv_block<T, NVE, NVP, CE, CH>(se, x, xs, we, sd, wd, sp, wp, epi_e, epi_d, epi_p)
//     CE, CH: se.C and sd.C when known at compile time (0: not), for the 1x1 convs' row micro-kernel.
//     se: the expand conv's shape (1x1, stride 1, unpadded, groups 1); x its channels-last input (channel
//         stride 1, any n/h/w strides); we its weight packed as aotc_conv2d_packed's (panels of NVE vectors).
//     sd: the depthwise conv's shape (groups == C == O == se.O, dilation 1); wd its weight [kh][kw][C].
//     sp: the project conv's shape (1x1, stride 1, unpadded, groups 1, C == se.O); wp packed (NVP vectors).
//   Epilogues: epi_e and epi_d get a run of pixels,  epi(n, p0, pb, oc0, ocb, tile, ldt, dst),  tile as
//   aotc_conv2d_packed's (Acc(n, oc, p) = tile[(p - p0) * ldt + (oc - oc0)]), and store their value of
//   pixel p, channel oc at dst[(p - p0) * ldt + oc]: the rows the next stage reads (for epi_d the tile
//   itself: in place). epi_p is aotc_conv2d_packed's epilogue, writing the block's output. epi_e and epi_d
//   may instead be an aotc_conv_clamp<T> (bias, ReLU6: conv_depthwise.h), applied to the accumulators in registers:
//   no pass over the rows at all; epi_p an aotc_conv_out<T> (conv.h: bias, residual, clamp), the projection
//   then written from its registers where O is whole vectors (its pass over a tile was ~4% of MobileNetV2's
//   blocks at AVX2, most where a residual is added).
//
// Steps: R output rows at a time (at least AOTC_BLOCK_PIXELS pixels: full micro-kernel strips on a 7x7
// image too), from a ring of the (R - 1) * sh + KH input rows they need; each step expands only the rows
// the ring does not hold yet. Threads: one task per image and either strip of output rows (a strip
// recomputes the KH - sh expanded rows it shares with the strip above: a few percent at 56 rows, a third
// at 7) or slice of hidden channels (partial sums of the projection, added up at the end): batch 1 splits
// over rows or channels, not images, whichever a cost model says ends soonest (see aotc_conv_block).
// Epilogues run inside the pool's tasks and must not throw.
#ifndef AOTC_CONV_DW_H
#define AOTC_CONV_DW_H

#ifdef AOTC_SELFTEST_CONV_DW  // small shapes on two threads
#define AOTC_MM_FLOPS_PER_THREAD 1.0
#define AOTC_BLOCK_PIXELS 24
#endif

#include <algorithm>

#include "conv.h"

#ifndef AOTC_BLOCK_PIXELS
// Pixels per 1x1 call at most, and output pixels per step at least (a multiple of every MR). 144 rather
// than 96: fewer calls and steps, each longer (MobileNetV2's blocks 0-4% faster at AVX-512 and AVX2; 192
// was no better).
#define AOTC_BLOCK_PIXELS 144
#endif

#ifndef AOTC_BLOCK_PIECES
// Pieces per strip of rows (at most: whole steps each). A strip in one task left a thread that finished
// early nothing to take: MobileNetV2's 112x112 and 56x56 blocks ran as two tasks on two threads, and when
// the other core was slower for a while (a neighbour's bursts, a noisy host) the caller waited up to half
// of each block (see aotc_conv_block).
#define AOTC_BLOCK_PIECES 4
#endif

// min(max(v + b, lo), hi), a NaN passing as in aotc_conv_vfin (conv_depthwise.h), in three instructions where the
// compares and blends of the generic form take nine: x86's maxps/minps return their second operand when
// either is a NaN. After a 1x1 conv of 16 or 24 input channels (MobileNetV2's first blocks) the generic
// clamp was a third of the block's time (perf). A zero of either sign may come out as the other.
template <class T, class V>
static inline V aotc_block_vclamp(V v, const T* b, V lo, V hi) {
  if (b != NULL) {
    V bv;
    memcpy(&bv, b, sizeof(V));
    v += bv;
  }
#if AOTC_VBYTES == 64
  if constexpr (std::is_same<T, float>::value)
    // maskz with every lane: the same instruction, without _mm512_undefined_ps's -Wmaybe-uninitialized
    return (V)_mm512_maskz_min_ps(0xffff, (__m512)hi, _mm512_maskz_max_ps(0xffff, (__m512)lo, (__m512)v));
#elif AOTC_VBYTES == 32 && defined(__AVX__)
  if constexpr (std::is_same<T, float>::value)
    return (V)_mm256_min_ps((__m256)hi, _mm256_max_ps((__m256)lo, (__m256)v));
#endif
  v = ((v != v) | (v > lo)) ? v : lo;
  return ((v != v) | (v < hi)) ? v : hi;
}

// An MR x NV block of accumulators into c (pitch ldc), ``fin``'s clamp (NULL: none) applied on the way; its
// bias is already in the accumulators (aotc_block_1x1_part starts them there), or with ``out`` added here.
// Always inlined: called apart, the accumulators went through memory (the 112x112 block 1.7x slower once
// aotc_block_1x1 grew past GCC's inlining budget).
template <class T, int MR, int NV, class V>
static inline __attribute__((always_inline)) void aotc_block_store(V (&acc)[MR][NV], T* c, int64_t ldc, const aotc_conv_clamp<T>* fin,
                                                                   const aotc_block_out<T>* out = NULL) {
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  if (out != NULL) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        V v;
        if (out->bias != NULL) {
          memcpy(&v, out->bias + j * L, sizeof(V));
          acc[i][j] += v;
        }
        if (out->res != NULL) {
          memcpy(&v, out->res + i * out->ldres + j * L, sizeof(V));
          acc[i][j] += v;
        }
      }
  }
  if (fin != NULL) {
    const V lo = aotc_vset1(fin->lo), hi = aotc_vset1(fin->hi);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_block_vclamp<T>(acc[i][j], (const T*)NULL, lo, hi);
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(c + i * ldc + j * L, &acc[i][j], sizeof(V));
}

// conv_kernels.h's micro-kernels for a 1x1 conv (one tap of C channels) with ``fin`` applied to the accumulators
// before they are stored (aotc_block_store): MR pixels, the NV vectors of the NVP-vector panel b this pass
// computes. STEP > 0: the row kernel, pixel i at a + i * STEP; STEP == 0: pixel i at ind[i]. The expand
// convs of 16 or 24 input channels (MobileNetV2's 112x112 and 56x56 blocks) spent a sixth of their block
// in a pass over the stored tile.
template <class T, int MR, int NV, int NVP, int STEP>
static inline void aotc_block_1x1_part(int64_t C, const T* a, const T* const* ind, const T* __restrict b, T* c, int64_t ldc,
                                       const aotc_conv_clamp<T>* fin, const T* bias, const T* pf, int64_t pfk,
                                       const aotc_block_out<T>* out) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), NR = NVP * L;
  // with ``fin`` the accumulators start at the bias: an add per accumulator fewer on the FMA ports (the
  // expand convs of 16 to 32 input channels take 16 to 32 multiply-adds per accumulator)
  V acc[MR][NV], b0[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    b0[j] = V{};
    if (fin != NULL && bias != NULL) memcpy(&b0[j], bias + j * L, sizeof(V));
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = b0[j];
  const T* p[STEP > 0 ? 1 : MR];
  if constexpr (STEP == 0)
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) p[i] = ind[i];
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    const T* ak = NULL;
    if constexpr (STEP > 0) {
      ak = a + k;
      __asm__("" : "+r"(ak));  // one load per broadcast (conv_kernels.h's aotc_conv_row_micro_part says why)
    }
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(&bv[j], b + k * NR + j * L, sizeof(V));
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      V av;
      if constexpr (STEP > 0)
        av = aotc_vset1(ak[i * STEP]);
      else
        av = aotc_vset1(p[i][k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(av, bv[j], acc[i][j]);
    }
  };
  int64_t k = 0;
  // the first pfk steps each prefetch a row of the next panel (aotc_block_1x1 spreads its rows over the strips)
  for (const int64_t n = pfk < C ? pfk : C; k < n; ++k) {
    aotc_mm_prefetch_row<NR>(pf + k * NR);
    step(k);
  }
#pragma GCC unroll 2
  for (; k < C; ++k) step(k);
  aotc_block_store<T, MR, NV>(acc, c, ldc, fin, out);
}

// The first NU of the panel's NV vectors (NU < NV: a last panel of fewer channels, the rest not computed)
template <class T, int MR, int NV, int STEP, int NU = NV>
static inline void aotc_block_1x1_micro(int64_t C, const T* a, const T* const* ind, const T* __restrict b, T* c,
                                        int64_t ldc, const aotc_conv_clamp<T>* fin, const T* bias, const T* pf,
                                        int64_t pfk, const aotc_block_out<T>* out) {
  constexpr int L = (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T)), NH = aotc_conv_split<MR, NU>::value;
  for (int j0 = 0; j0 < NU; j0 += NH) {
    const aotc_block_out<T> o = out != NULL ? out->at(0, j0 * L) : aotc_block_out<T>{};
    aotc_block_1x1_part<T, MR, NH, NV, STEP>(C, a, ind, b + j0 * L, c + j0 * L, ldc, fin, bias != NULL ? bias + j0 * L : NULL,
                                             pf, j0 == 0 ? pfk : 0, out != NULL ? &o : NULL);
  }
}

// f(std::integral_constant<int, nu>()) for nu in [1, NU]
template <int NU, class F>
static inline void aotc_block_vectors(int nu, F f) {
  if constexpr (NU > 1)
    if (nu < NU) return aotc_block_vectors<NU - 1>(nu, f);
  f(std::integral_constant<int, NU>());
}

// Whether aotc_block_1x1 covers np pixels with strips that start inside them (no padding rows): at least MR
// pixels, or MR / 2 to 3 MR / 4 (aotc_conv_row_strips; np in (3 MR / 4, MR) would take a full strip).
template <int NV>
static inline bool aotc_block_exact(int64_t np) {
  constexpr int MR = aotc_conv_mr<NV>::value, MR2 = MR / 2 > 0 ? MR / 2 : 1;
  return np >= MR || (np >= MR2 && np <= 3 * MR / 4);
}

// The np pixels of image xn from pixel q = ih * W + iw on (channels [0, C) each, channel stride 1) x the
// packed weight wp, O output channels, into c[p - q][0 .. roundup(O, NR)); wp's panels are kp >= C rows
// long (rows [k0, k0 + C) of a weight packed for kp input channels: wp points at row k0 of the first panel,
// wp + k0 * NR). ``fin`` (NULL: none) is applied on the accumulators (``bias``: image n's, roundup(O, NR)
// long, or NULL).
// At least MR pixels (the usual case; or MR / 2 to 3 MR / 4) go in strips of MR, a last short one as
// MR / 2 or MR / 4 or overlapping the strip before (conv_kernels.h's aotc_conv_row_strips; the overlap's rows are
// computed and stored again, equal): exactly np rows are written. A 7x7 image's 49 pixels padded to 60 rows
// of strips of 12 (AVX-512) took a fifth more multiply-adds than the pixels need, and MobileNetV2's small
// blocks are mostly their 1x1 convs. Fewer pixels take whole strips with padding: then without ``fin`` c
// has roundup(np, MR) rows (the padding rows are written too), with it the last strip goes through
// ``tail`` (MR x ldc) and only np rows are written.
// STEP: the pixel stride sxw when known at compile time (0: not). Where the pixels are evenly spaced
// (sxh == W * sxw) a strip then takes the row form of aotc_block_1x1_micro, each broadcast one load at a
// fixed offset, where the pointer form re-reads its MR pixel pointers from the stack: a load per broadcast
// more, which on the 1x1 convs of 16 to 32 input channels left the load ports, not the FMAs, the limit
// (AVX-512, MobileNetV2's blocks 5-24% faster). AVX2's strips of 6 keep their pointers in registers:
// the pointer form there (the row form measured 0-4% slower).
// ``out`` (NULL: none; only where aotc_block_exact holds): the strips' output as aotc_block_store takes it, its
// bias at out->bias + js for panel js and pixel i's residual at out->res + i * out->ldres.
template <class T, int NV, int STEP = 0>
static inline void aotc_block_1x1(const T* xn, int64_t sxh, int64_t sxw, int64_t W, int64_t q, int64_t np, int64_t C,
                                  int64_t kp, int64_t O, const T* wp, const T** ind, T* c, int64_t ldc,
                                  const aotc_conv_clamp<T>* fin = NULL, const T* bias = NULL, T* tail = NULL,
                                  const aotc_block_out<T>* out = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), NR = NV * L, MR = aotc_conv_mr<NV>::value;
  constexpr int MR2 = MR / 2 > 0 ? MR / 2 : 1, MR4 = MR / 4 > 0 ? MR / 4 : 1;
  const bool exact = aotc_block_exact<NV>(np);
  const int64_t strips = (np + MR - 1) / MR, rows = exact ? np : strips * MR;
  for (int64_t i = 0, h = q / W, w = q % W; i < rows; ++i) {
    ind[i] = i < np ? xn + h * sxh + w * sxw : ind[0];  // past np: any real pixel
    if (++w == W) w = 0, ++h;
  }
  constexpr bool rowk = STEP > 0 && MR > 8;
  const bool even = rowk && sxw == STEP && (sxh == W * sxw || q % W + np <= W);  // one row, or dense rows
  // M pixels from ind[i] into dst, the panel's first NU vectors; ``real``: all M of them are pixels, none padding
  // Each strip of a panel prefetches its share of the next panel's C rows: the weights stream from L3 or
  // memory once per call (at one thread all of MobileNetV2's 14 MB), and a panel's first strip waited on them.
  const int64_t chunk = (C + strips - 1) / strips;
  auto strip = [&](auto m, auto nu, int64_t i, int64_t js, T* dst, bool real = true) {
    constexpr int M = decltype(m)::value, NU = decltype(nu)::value;
    const T* b = bias != NULL ? bias + js : NULL;
    const int64_t k0 = aotc_mm_min(i / MR, strips - 1) * chunk;
    const T* pf = js + NR < O && k0 < C ? wp + (js + NR) * kp + k0 * NR : NULL;
    const int64_t pfk = pf != NULL ? aotc_mm_min(chunk, C - k0) : 0;
    const aotc_block_out<T> o = out != NULL ? out->at(i, js) : aotc_block_out<T>{};
    const aotc_block_out<T>* so = out != NULL ? &o : NULL;
    if constexpr (rowk) {
      if (even && real) {  // pixel i + j at ind[i] + j * STEP
        aotc_block_1x1_micro<T, M, NV, STEP, NU>(C, ind[i], NULL, wp + js * kp, dst, ldc, fin, b, pf, pfk, so);
        return;
      }
    }
    aotc_block_1x1_micro<T, M, NV, 0, NU>(C, NULL, ind + i, wp + js * kp, dst, ldc, fin, b, pf, pfk, so);
  };
  for (int64_t js = 0; js < O; js += NR) {
    // a last panel's vectors past O are not computed (their columns of c are not written): 144 channels in
    // panels of 32 (AVX-512), 24 in panels of 16 (AVX2)
    const int nu = (int)aotc_mm_min((int64_t)NV, (O - js + L - 1) / L);
    aotc_block_vectors<NV>(nu, [&](auto vu) {
      if (exact) {
        aotc_conv_row_strips<MR, MR2, MR4>(0, np, [&](auto m, int64_t i) { strip(m, vu, i, js, c + i * ldc + js); });
        return;
      }
      for (int64_t si = 0; si < strips; ++si) {
        const bool real = si * MR + MR <= np;
        if (fin == NULL || real) {
          strip(std::integral_constant<int, MR>(), vu, si * MR, js, c + si * MR * ldc + js, real);
          continue;
        }
        strip(std::integral_constant<int, MR>(), vu, si * MR, js, tail + js, false);
        for (int64_t i = 0; i < np - si * MR; ++i) memcpy(c + (si * MR + i) * ldc + js, tail + i * ldc + js, NR * sizeof(T));
      }
    });
  }
}

// The first of the pieces of at most ``most`` pixels that ``rest`` pixels split into evenly: 98 as 49 + 49,
// not 96 + 2 (a piece too short for aotc_block_1x1's unpadded strips).
static inline int64_t aotc_block_piece(int64_t rest, int64_t most) {
  const int64_t pieces = (rest + most - 1) / most;
  return (rest + pieces - 1) / pieces;
}

// Whether a stage's epilogue is the register one (aotc_conv_clamp) rather than a lambda over rows.
template <class T, class Epi>
struct aotc_block_fin : std::is_same<typename std::decay<Epi>::type, aotc_conv_clamp<T>> {};

template <class T, int NVE, int NVP, int CE = 0, int CH = 0, class EpiE, class EpiD, class EpiP>
void aotc_conv_block(const aotc_conv_shape& se, const T* x, aotc_conv_strides xs, const T* we, const aotc_conv_shape& sd,
                     const T* wd, const aotc_conv_shape& sp, const T* wp, EpiE epi_e, EpiD epi_d, EpiP epi_p) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NRE = NVE * L, NRP = NVP * L, EP = AOTC_BLOCK_PIXELS;
  static_assert(EP % aotc_conv_mr<NVE>::value == 0 && EP % aotc_conv_mr<NVP>::value == 0, "AOTC_BLOCK_PIXELS: a multiple of MR");
  if (sd.N <= 0 || sd.OH <= 0 || sd.OW <= 0 || sd.C <= 0) return;
  const int64_t N = sd.N, H = sd.H, W = sd.W, OH = sd.OH, OW = sd.OW, hid = sd.C, KH = sd.KH, sh = sd.sh;
  const int64_t ldr = aotc_roundup(hid, NRE);  // pitch of an expanded pixel (the expand's tile)
  const int64_t ldd = aotc_roundup(hid, L);    // pitch of a depthwise output pixel
  const int64_t ldp = aotc_roundup(sp.O, NRP); // pitch of a projected pixel
  // the pixel strides of the two 1x1 convs' inputs when codegen knows them: the expand's input channels
  // CE (dense channels-last input), the depthwise rows' pitch ldd for CH hidden channels
  constexpr int SE = CE, SP = CH > 0 ? (CH + L - 1) / L * L : 0;
  static_assert(CE >= 0 && CH >= 0, "CE, CH: channel counts, or 0");
  // Threads by flops. A task is an image's (strip of output rows) x (slice of hidden channels); one of the
  // two is split, by a cost model of the multiply-adds of the slowest thread:
  // - strips: each expands the input rows it needs, the KH - sh rows it shares with the next strip computed
  //   twice (a few percent at 56 rows, a third at 7);
  // - slices (of whole expand panels): nothing computed twice and each thread reads only its part of the
  //   weights, but each projects into partial sums of the whole image that the caller adds up afterwards.
  // Note: MobileNetV2's 14x14 and 7x7 blocks split by slices, its larger ones by strips (the partial sums
  // of a 56x56 image would leave the cache); a batch as large as the thread count splits by images alone.
  const double per_out = (double)hid * (KH * sd.KW + sp.O), per_in = (double)se.C * hid;
  const double flops = 2.0 * (double)N * ((double)H * W * per_in + (double)OH * OW * per_out);
  const bool nested = aotc_pool_inside || omp_in_parallel();
  const int64_t most = nested ? 1 : aotc_pool_threads();
  int64_t threads = aotc_mm_min(most, (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD));
  if (threads < 1) threads = 1;
  const int64_t per_image = (threads + N - 1) / N, panels = (hid + NRE - 1) / NRE;
  int64_t strips = 1, slices = 1, pp = panels;  // pp: expand panels per slice
  double best = 0;
  for (int64_t s = 1; s <= aotc_mm_min(OH, per_image); ++s) {
    const int64_t rows = (OH + s - 1) / s, in_rows = aotc_mm_min((rows - 1) * sh + KH, H);
    const double cost = (double)((N * s + threads - 1) / threads) * ((double)in_rows * W * per_in + (double)rows * OW * per_out);
    if (s == 1 || cost < best) best = cost, strips = s;
  }
  for (int64_t s = 2; s <= aotc_mm_min(panels, per_image); ++s) {
    const int64_t spp = (panels + s - 1) / s, n_sl = (panels + spp - 1) / spp, part = aotc_mm_min(spp * NRE, hid);
    const double slice = (double)part / hid * ((double)H * W * per_in + (double)OH * OW * per_out);
    const double cost = (double)((N * n_sl + threads - 1) / threads) * slice + 2.0 * N * n_sl * OH * OW * sp.O;
    if (cost < 0.95 * best) best = cost, strips = 1, slices = n_sl, pp = spp;
  }
  // Row steps: R output rows at a time (at least EP pixels when the image has them), from a ring of the
  // cap input rows they need.
  const int64_t R = aotc_mm_min((EP + OW - 1) / OW, OH), cap = (R - 1) * sh + KH;
  // the depthwise two output rows at a time where that loads fewer inputs (aotc_conv_dw_row2: a 3x3 at stride 1)
  const bool pairs = KH == 3 && sd.KW == 3 && sh == 1 && sd.sw == 1;
  // Pieces: a strip's steps in up to AOTC_BLOCK_PIECES runs, each a task. The thread whose share holds a
  // strip claims its pieces in order and carries its ring from one to the next, so nothing is computed
  // twice; a thread that runs out of its own takes the last piece left of another's strip (aotc_pool_claim)
  // and expands the KH - sh rows that piece shares with the one above again: a cost paid only when the
  // other thread is a whole piece behind.
  const int64_t pieces = slices > 1 ? 1 : std::max<int64_t>(1, aotc_mm_min((int64_t)AOTC_BLOCK_PIECES, (OH / strips + R - 1) / R));
  const int64_t tasks = N * strips * slices * pieces;
  threads = aotc_mm_min(threads, tasks);
  // Per image and slice (slices > 1): its partial sums, every pixel of the image (and EP rows the last
  // 1x1 call may pad with).
  const int64_t part_sz = slices > 1 ? aotc_roundup((OH * OW + EP) * ldp, 16) : 0;
  const int64_t align = 64 / (int64_t)sizeof(T), ptr = (int64_t)((sizeof(void*) + sizeof(T) - 1) / sizeof(T));
  const int64_t ring_sz = aotc_roundup(cap * W * ldr, align), etile_sz = aotc_roundup(EP * ldr, align);
  const int64_t drow_sz = aotc_roundup(R * OW * ldd, align), ptile_sz = aotc_roundup(EP * ldp, align);
  const int64_t ind_sz = aotc_roundup((EP + KH + sh) * ptr, align);  // pixel pointers, then KH + sh row pointers
  const int64_t per = ring_sz + etile_sz + drow_sz + ptile_sz + ind_sz + aotc_roundup(ldr, align);  // + the expand's bias
  const aotc_mm_scratch<T> scratch((size_t)(per * threads + part_sz * N * slices), nested);
  T* ws_all = scratch.p;
  T* parts = ws_all + per * threads;
  // an aotc_conv_out projection epilogue's clamp, applied after its bias and residual (aotc_conv_out::at); none
  // where it cannot change a value
  aotc_conv_clamp<T> clamp_p{NULL, 0, T(0), T(0)};
  const aotc_conv_clamp<T>* fin_p = NULL;
  if constexpr (aotc_conv_is_out<T, EpiP>::value) {
    clamp_p = {NULL, 0, epi_p.fin.lo, epi_p.fin.hi};
    if (clamp_p.bounded()) fin_p = &clamp_p;
  }
  // Per slot: its last task (whose rows its ring still holds)
  int64_t last_task[AOTC_POOL_MAX];
  for (int64_t i = 0; i < threads; ++i) last_task[i] = -1;
  aotc_pool_run(tasks, (int)threads, [&](int64_t task, int slot) {
    T* ring = ws_all + (int64_t)slot * per;  // input row ih at ring + (ih % cap) * W * ldr
    T* etile = ring + ring_sz;
    T* drow = etile + etile_sz;
    T* ptile = drow + drow_sz;
    const T** ind = reinterpret_cast<const T**>(ptile + ptile_sz);
    const T** rows = ind + EP;
    T* ebias = ptile + ptile_sz + ind_sz;  // the expand's bias for image n, zero past hid (its packed panels' width)
    const int64_t n = task / (strips * pieces * slices), st = task / (pieces * slices) % strips;
    const int64_t pc = task / slices % pieces, sl = task % slices;
    const int64_t h0 = sl * pp * NRE, h1 = aotc_mm_min(h0 + pp * NRE, hid), hb = h1 - h0;  // the hidden channels
    T* part = slices > 1 ? parts + (n * slices + sl) * part_sz : NULL;
    const aotc_conv_clamp<T>* fin_e = NULL;
    aotc_conv_clamp<T> fin_d{NULL, 0, T(0), T(0)};  // image n's (aotc_conv_dw_row indexes its bias by channel)
    if constexpr (aotc_block_fin<T, EpiE>::value) {
      fin_e = &epi_e;
      for (int64_t c = 0; c < ldr; ++c) ebias[c] = epi_e.bias != NULL && c < hid ? epi_e.bias[n * epi_e.bias_n + c] : T(0);
    }
    if constexpr (aotc_block_fin<T, EpiD>::value) {
      fin_d = epi_d;
      if (fin_d.bias != NULL) fin_d.bias += n * fin_d.bias_n;
    }
    // this piece's output rows [oh0, oh1): its steps of the strip's
    const int64_t top = st * OH / strips, bottom = (st + 1) * OH / strips, steps = (bottom - top + R - 1) / R;
    const int64_t oh0 = aotc_mm_min(top + pc * steps / pieces * R, bottom);
    const int64_t oh1 = aotc_mm_min(top + (pc + 1) * steps / pieces * R, bottom);
    const T* xn = x + xs.off + n * xs.s0;
    // input rows [.., have) of this strip are in the ring (the last cap of them): those the piece above
    // needed (up to its last row, oh0 - 1), when this thread ran it just before
    const bool carry = pc > 0 && last_task[slot] == task - 1;
    int64_t have = carry ? aotc_mm_min((oh0 - 1) * sh - sd.ph + KH, H) : 0;
    last_task[slot] = task;
    for (int64_t oh = oh0; oh < oh1; oh += R) {
      const int64_t r = aotc_mm_min(R, oh1 - oh);
      const int64_t need0 = std::max<int64_t>(oh * sh - sd.ph, 0);
      const int64_t need1 = aotc_mm_min((oh + r - 1) * sh - sd.ph + KH, H);  // dilation 1: consecutive rows
      // expand the rows not in the ring yet, in pieces of at most EP pixels that do not wrap around it
      for (int64_t q = std::max<int64_t>(need0, oh == oh0 && !carry ? need0 : have) * W; q < need1 * W;) {
        const int64_t ih = q / W, wrap = (ih - ih % cap + cap) * W;
        const int64_t np = aotc_block_piece(aotc_mm_min(need1 * W, wrap) - q, EP);
        T* dst = ring + ((ih % cap) * W + q % W) * ldr;
        if constexpr (aotc_block_fin<T, EpiE>::value) {
          aotc_block_1x1<T, NVE, SE>(xn, xs.s2, xs.s3, W, q, np, se.C, se.C, hb, we + h0 * se.C, ind, dst + h0, ldr, fin_e,
                                     ebias + h0, etile);
        } else {
          aotc_block_1x1<T, NVE, SE>(xn, xs.s2, xs.s3, W, q, np, se.C, se.C, hb, we + h0 * se.C, ind, etile, ldr);
          epi_e(n, q, np, h0, hb, (const T*)etile, ldr, dst);
        }
        q += np;
      }
      if (need1 > have) have = need1;
      // a register epilogue in the row kernel, on the accumulators (aotc_conv_vfin's max/min): no pass over the rows
      const aotc_conv_clamp<T>* fin = aotc_block_fin<T, EpiD>::value ? &fin_d : NULL;
      for (int64_t j = 0; j < r; ++j) {
        const bool two = pairs && j + 1 < r;  // rows j and j + 1 (aotc_conv_dw_row2)
        for (int64_t i = 0; i < KH + (two ? sh : 0); ++i) {
          const int64_t ih = (oh + j) * sh - sd.ph + i;
          rows[i] = ih >= 0 && ih < H ? ring + (ih % cap) * W * ldr : NULL;
        }
        if (two) {
          aotc_conv_dw_row2<T>(sd, rows, ldr, wd, h0, hb, drow + j * OW * ldd + h0, drow + (j + 1) * OW * ldd + h0, ldd, fin);
          ++j;
          continue;
        }
        if (sd.KW == 3)
          aotc_conv_dw_row<T, 3>(sd, rows, ldr, wd, h0, hb, drow + j * OW * ldd + h0, ldd, fin);
        else
          aotc_conv_dw_row<T, 0>(sd, rows, ldr, wd, h0, hb, drow + j * OW * ldd + h0, ldd, fin);
      }
      if constexpr (!aotc_block_fin<T, EpiD>::value) epi_d(n, oh * OW, r * OW, h0, hb, (const T*)(drow + h0), ldd, drow);
      for (int64_t q = 0, np; q < r * OW; q += np) {
        np = aotc_block_piece(r * OW - q, EP);
        if (part != NULL) {  // this slice's share of the projection, straight into its partial sums
          aotc_block_1x1<T, NVP, SP>(drow + h0, 0, ldd, r * OW, q, np, hb, hid, sp.O, wp + h0 * NRP, ind, part + (oh * OW + q) * ldp, ldp);
          continue;
        }
        if constexpr (aotc_conv_is_out<T, EpiP>::value) {
          if (sp.O % L == 0 && aotc_block_exact<NVP>(np)) {  // the output from the registers, no pass over a tile
            const int64_t p = n * epi_p.P + oh * OW + q;
            const aotc_block_out<T> out = epi_p.at(n, oh * OW + q);
            aotc_block_1x1<T, NVP, SP>(drow, 0, ldd, r * OW, q, np, hid, hid, sp.O, wp, ind, epi_p.out + p * sp.O, sp.O, fin_p,
                                       NULL, NULL, &out);
            continue;
          }
        }
        aotc_block_1x1<T, NVP, SP>(drow, 0, ldd, r * OW, q, np, hid, hid, sp.O, wp, ind, ptile, ldp);
        epi_p(n, oh * OW + q, np, (int64_t)0, sp.O, (const T*)ptile, ldp);
      }
    }
  });
  // slices: add each image's partial sums into its first slice's, EP pixels at a time, and hand them to epi_p
  for (int64_t n = 0; n < (slices > 1 ? N : 0); ++n)
    for (int64_t p0 = 0; p0 < OH * OW; p0 += EP) {
      const int64_t np = aotc_mm_min((int64_t)EP, OH * OW - p0);
      T* acc = parts + n * slices * part_sz + p0 * ldp;
      for (int64_t sl = 1; sl < slices; ++sl) {
        const T* add = acc + sl * part_sz;
        for (int64_t i = 0; i < np * ldp; i += L) {
          V a, b;
          memcpy(&a, acc + i, sizeof(V));
          memcpy(&b, add + i, sizeof(V));
          a += b;
          memcpy(acc + i, &a, sizeof(V));
        }
      }
      epi_p(n, p0, np, (int64_t)0, sp.O, (const T*)acc, ldp);
    }
}

// The block over bf16 input and depthwise weight (a bf16 model; the 1x1 convs' weights are widened when
// packed): the input copied to dense channels-last T once (conv.h's scratch), the depthwise weight widened,
// then the block above. Its rows stay T: the expanded and depthwise values are not rounded to bf16 between
// the stages (the epilogues store T into them), only the output.
template <class T, int NVE, int NVP, int CE = 0, int CH = 0, class SX, class SW, class EpiE, class EpiD, class EpiP>
void aotc_conv_block(const aotc_conv_shape& se, const SX* x, aotc_conv_strides xs, const T* we, const aotc_conv_shape& sd,
                     const SW* wd, const aotc_conv_shape& sp, const T* wp, EpiE epi_e, EpiD epi_d, EpiP epi_p) {
  static_assert(!std::is_same<SX, T>::value || !std::is_same<SW, T>::value, "the block above takes these");
  if (se.N <= 0 || se.H <= 0 || se.W <= 0) return;
  const std::vector<T> wdt = aotc_conv_widened<T>(wd, sd.KH * sd.KW * sd.C);
  aotc_conv_block<T, NVE, NVP, CE, CH>(se, aotc_conv_nhwc<T>(se, x, xs), aotc_conv_dense(se), we, sd, wdt.data(), sp, wp, epi_e,
                                       epi_d, epi_p);
}

#ifdef AOTC_SELFTEST_CONV_DW
// The block against the three convs it replaces (aotc_conv2d_packed, a naive depthwise loop, aotc_conv2d_packed)
// with ReLU6 after the first two and a residual after the last, on small integer data (exact in fp32).
#include <stdio.h>

template <int NVE, int NVP, int CE = 0, int CH = 0>
static int aotc_block_check(int64_t N, int64_t C, int64_t H, int64_t W, int64_t hid, int64_t O, int64_t stride,
                            int threads, bool fin = false, bool out = false) {
  constexpr int L = AOTC_VBYTES / 4, NRE = NVE * L, NRP = NVP * L;
  const int64_t OH = (H - 1) / stride + 1, OW = (W - 1) / stride + 1;
  const aotc_conv_shape se{N, C, H, W, hid, 1, 1, H, W, 1, 1, 0, 0, 1, 1, 1};
  const aotc_conv_shape sd{N, hid, H, W, hid, 3, 3, OH, OW, stride, stride, 1, 1, 1, 1, hid};
  const aotc_conv_shape sp{N, hid, OH, OW, O, 1, 1, OH, OW, 1, 1, 0, 0, 1, 1, 1};
  std::vector<float> x(N * H * W * C), we((hid + NRE - 1) / NRE * NRE * C, 0.0f), wd(9 * hid);
  std::vector<float> wp((O + NRP - 1) / NRP * NRP * hid, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (int64_t o = 0; o < hid; ++o)
    for (int64_t c = 0; c < C; ++c) we[(o / NRE * C + c) * NRE + o % NRE] = (float)((o * 3 + c) % 5) - 2.0f;
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = (float)((i * 5) % 7) - 3.0f;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < hid; ++c) wp[(o / NRP * hid + c) * NRP + o % NRP] = (float)((o + 2 * c) % 3) - 1.0f;
  const bool res = stride == 1 && C == O;
  auto relu6 = [](float v) { return v < 0 ? 0.0f : v > 6 ? 6.0f : v; };
  // the three kernels through full-size buffers
  std::vector<float> e(N * H * W * hid), d(N * OH * OW * hid), want(N * OH * OW * O), got(want.size(), -1.0f);
  const aotc_conv_strides xs{0, H * W * C, 1, W * C, C};
  const aotc_conv_strides ds{0, OH * OW * hid, 1, OW * hid, hid};
  aotc_pool_set_threads(threads);
  aotc_conv2d_packed<float, NVE>(se, x.data(), xs, we.data(), [&](int64_t n, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
    for (int64_t p = p0; p < p0 + pb; ++p)
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) e[(n * H * W + p) * hid + oc] = relu6(t[(p - p0) * ldt + oc - oc0] - 1);
  });
  // the depthwise as a naive loop: through aotc_conv2d_dw it shares aotc_conv_dw_row with the block, and a
  // broken row kernel gave both the same wrong answer
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c = 0; c < hid; ++c) {
          float acc = 0;
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw) {
              const int64_t ih = oh * stride - 1 + kh, iw = ow * stride - 1 + kw;
              if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += e[(n * H * W + ih * W + iw) * hid + c] * wd[(kh * 3 + kw) * hid + c];
            }
          d[(n * OH * OW + oh * OW + ow) * hid + c] = relu6(acc + 2);
        }
  aotc_conv2d_packed<float, NVP>(sp, d.data(), ds, wp.data(), [&](int64_t n, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
    for (int64_t p = p0; p < p0 + pb; ++p)
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc)
        want[(n * OH * OW + p) * O + oc] = t[(p - p0) * ldt + oc - oc0] + (res ? x[(n * H * W + p) * C + oc] : 0.0f);
  });
  auto row_epi = [&](float bias) {
    return [=](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt, float* dst) {
      for (int64_t p = p0; p < p0 + pb; ++p)
        for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) dst[(p - p0) * ldt + oc] = relu6(t[(p - p0) * ldt + oc - oc0] + bias);
    };
  };
  auto out_epi = [&](int64_t n, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
    for (int64_t p = p0; p < p0 + pb; ++p)
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc)
        got[(n * OH * OW + p) * O + oc] = t[(p - p0) * ldt + oc - oc0] + (res ? x[(n * H * W + p) * C + oc] : 0.0f);
  };
  if (out) {  // the projection into the output from its registers (aotc_conv_out): a per-image bias, the clamp
    std::vector<float> bp(N * O);
    for (size_t i = 0; i < bp.size(); ++i) bp[i] = (float)((i * 5) % 7) - 3.0f;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < OH * OW * O; ++i) {
        const float v = want[n * OH * OW * O + i] + bp[n * O + i % O];
        want[n * OH * OW * O + i] = v < -4.0f ? -4.0f : v > 40.0f ? 40.0f : v;
      }
    // (want holds acc + x: with the bias added after, exact on integers in either order)
    const aotc_conv_out<float> po{got.data(), {bp.data(), O, -4.0f, 40.0f}, OH * OW, O, res ? x.data() : NULL};
    std::vector<float> be(N * hid, -1.0f), bd(hid, 2.0f);
    const aotc_conv_clamp<float> fe{be.data(), hid, 0.0f, 6.0f}, fd{bd.data(), 0, 0.0f, 6.0f};
    if (fin)
      aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), fe, fd, po);
    else
      aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), row_epi(-1), row_epi(2), po);
  } else if (fin) {  // the register epilogues: a per-image bias for the expand, one shared by the images for the depthwise
    std::vector<float> be(N * hid, -1.0f), bd(hid, 2.0f);
    const aotc_conv_clamp<float> fe{be.data(), hid, 0.0f, 6.0f}, fd{bd.data(), 0, 0.0f, 6.0f};
    aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), fe, fd, out_epi);
  } else {
    aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), row_epi(-1), row_epi(2), out_epi);
  }
  int fails = 0;
  for (size_t i = 0; i < got.size(); ++i) fails += got[i] != want[i];
  if (fails) printf("block N=%ld C=%ld %ldx%ld hid=%ld O=%ld stride %ld threads %d fin %d: %d wrong\n", (long)N, (long)C,
                    (long)H, (long)W, (long)hid, (long)O, (long)stride, threads, (int)fin, fails);
  return fails;
}

// The block's output on one thread and on two, bitwise: a split by strips of rows computes each pixel as
// one thread does (the same strips of the 1x1 convs need not: each pixel's sums run in the same order
// whatever its strip). Fractional data (a change of order shows), register epilogues.
template <int NVE, int NVP, int CE = 0, int CH = 0>
static int aotc_block_threads(int64_t C, int64_t H, int64_t hid, int64_t O, int64_t stride) {
  constexpr int L = AOTC_VBYTES / 4, NRE = NVE * L, NRP = NVP * L;
  const int64_t OH = (H - 1) / stride + 1;
  const aotc_conv_shape se{1, C, H, H, hid, 1, 1, H, H, 1, 1, 0, 0, 1, 1, 1};
  const aotc_conv_shape sd{1, hid, H, H, hid, 3, 3, OH, OH, stride, stride, 1, 1, 1, 1, hid};
  const aotc_conv_shape sp{1, hid, OH, OH, O, 1, 1, OH, OH, 1, 1, 0, 0, 1, 1, 1};
  std::vector<float> x(H * H * C), we((hid + NRE - 1) / NRE * NRE * C), wd(9 * hid), wp((O + NRP - 1) / NRP * NRP * hid);
  std::vector<float> be(hid), bd(hid);
  uint32_t r = 12345;
  for (auto* v : {&x, &we, &wd, &wp, &be, &bd})
    for (float& f : *v) f = (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  const aotc_conv_strides xs{0, H * H * C, 1, H * C, C};
  const aotc_conv_clamp<float> fe{be.data(), 0, 0.0f, 6.0f}, fd{bd.data(), 0, 0.0f, 6.0f};
  std::vector<float> y[3];
  aotc_pool& pool = aotc_the_pool();
  int64_t caller_chunks = 0, chunks = 0;
  for (int t = 0; t < 3; ++t) {
    // third: two threads, the worker late for every piece it claims, so that the caller takes the rest of
    // its strip piece by piece (each expanding the rows it shares with the piece above again)
    aotc_pool_set_threads(t == 2 ? -2 : t + 1);
    pool.test_worker_delay_ns = t == 2 ? 3000000 : 0;
    const aotc_pool_stats before = pool.stats;
    y[t].assign(OH * OH * O, 0.0f);
    float* yp = y[t].data();
    aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), fe, fd,
      [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* tile, int64_t ldt) {
        for (int64_t p = p0; p < p0 + pb; ++p)
          for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) yp[p * O + oc] = tile[(p - p0) * ldt + oc - oc0];
      });
    chunks = pool.stats.chunks - before.chunks;
    caller_chunks = chunks - (pool.stats.worker_chunks - before.worker_chunks);
  }
  pool.test_worker_delay_ns = 0;
  aotc_pool_set_threads(0);
  int fails = 0;
  for (int t = 1; t < 3; ++t)
    if (memcmp(y[0].data(), y[t].data(), y[0].size() * sizeof(float)) != 0) {
      printf("block C=%ld %ldx%ld hid=%ld O=%ld stride %ld: 1 and 2 threads%s differ\n", (long)C, (long)H, (long)H, (long)hid,
             (long)O, (long)stride, t == 2 ? " (a late worker)" : "");
      ++fails;
    }
  if (2 * caller_chunks <= chunks) {  // the late worker's pieces were not taken: the case above was not run
    printf("block C=%ld %ldx%ld hid=%ld: the caller ran %ld of %ld pieces beside a late worker\n", (long)C, (long)H, (long)H,
           (long)hid, (long)caller_chunks, (long)chunks);
    ++fails;
  }
  return fails;
}

int main() {
  int fails = 0;
  // MobileNetV2's first blocks, split by strips of rows
  fails += aotc_block_threads<2, 1, 32, 32>(32, 112, 32, 16, 1);
  fails += aotc_block_threads<2, 2, 16, 96>(16, 112, 96, 24, 2);
  fails += aotc_block_threads<2, 2, 24, 144>(24, 56, 144, 24, 1);
  fails += aotc_block_threads<2, 2>(24, 56, 144, 32, 2);
  {  // the fast clamp lets a NaN through, as aotc_conv_vfin does, and clamps the rest
    typedef aotc_mm_vec<float>::type V;
    const V lo = aotc_vset1(0.0f), hi = aotc_vset1(6.0f);
    const float b[AOTC_VBYTES / 4] = {1.0f};
    V r = aotc_block_vclamp<float>(aotc_vset1(NAN), (const float*)NULL, lo, hi);
    fails += !(r[0] != r[0]) + !(r[1] != r[1]);
    r = aotc_block_vclamp<float>(aotc_vset1(5.5f), b, lo, hi);
    fails += r[0] != 6.0f || r[1] != 5.5f;
    r = aotc_block_vclamp<float>(aotc_vset1(-2.0f), b, lo, hi);
    fails += r[0] != 0.0f || r[1] != 0.0f;
    if (fails) printf("aotc_block_vclamp: %d wrong\n", fails);
  }
  for (int t = 0; t < 4; ++t) {
    const int threads = 1 + t % 2;
    const bool fin = t >= 2;
    fails += aotc_block_check<2, 2>(1, 16, 19, 21, 96, 16, 1, threads, fin);  // residual
    fails += aotc_block_check<2, 1>(1, 16, 19, 21, 96, 24, 2, threads, fin);  // stride 2, one-vector panel
    fails += aotc_block_check<1, 2>(2, 5, 7, 9, 30, 37, 1, threads, fin);  // odd channels, two images
    fails += aotc_block_check<2, 2>(2, 24, 6, 5, 144, 24, 2, threads, fin);  // odd sizes, stride 2
    fails += aotc_block_check<1, 1>(1, 3, 1, 1, 7, 3, 1, threads, fin);  // one pixel
    fails += aotc_block_check<2, 2>(1, 8, 40, 3, 20, 8, 1, threads, fin);  // tall: several strips
    fails += aotc_block_check<1, 2>(1, 8, 5, 61, 24, 8, 2, threads, fin);  // rows wider than a 1x1 call
    fails += aotc_block_check<2, 1>(3, 7, 7, 7, 40, 9, 1, threads, fin);  // 7x7: one step a strip
    fails += aotc_block_check<2, 2>(1, 16, 7, 7, 160, 16, 1, threads, fin);  // 7x7 on two threads: hidden slices
    fails += aotc_block_check<1, 2>(1, 8, 13, 11, 70, 19, 2, threads, fin);  // uneven slices (AVX2), odd channels
    // the same with the channel counts at compile time (the 1x1 convs' row micro-kernel)
    fails += aotc_block_check<2, 2, 16, 96>(1, 16, 19, 21, 96, 16, 1, threads, fin);
    fails += aotc_block_check<2, 1, 16, 96>(1, 16, 19, 21, 96, 24, 2, threads, fin);
    fails += aotc_block_check<1, 2, 5, 30>(2, 5, 7, 9, 30, 37, 1, threads, fin);
    fails += aotc_block_check<2, 2, 24, 144>(2, 24, 6, 5, 144, 24, 2, threads, fin);
    fails += aotc_block_check<1, 1, 3, 7>(1, 3, 1, 1, 7, 3, 1, threads, fin);
    fails += aotc_block_check<2, 2, 8, 20>(1, 8, 40, 3, 20, 8, 1, threads, fin);
    fails += aotc_block_check<1, 2, 8, 24>(1, 8, 5, 61, 24, 8, 2, threads, fin);
    fails += aotc_block_check<2, 1, 7, 40>(3, 7, 7, 7, 40, 9, 1, threads, fin);
    fails += aotc_block_check<2, 2, 16, 160>(1, 16, 7, 7, 160, 16, 1, threads, fin);
    fails += aotc_block_check<1, 2, 8, 70>(1, 8, 13, 11, 70, 19, 2, threads, fin);
    // the projection written from its registers (aotc_conv_out): with a residual, strided, a last panel of
    // fewer vectors (24 = 16 + 8), 7x7 (hidden slices on two threads: a tile), O not whole vectors (a tile),
    // a piece shorter than a strip (one pixel: a tile)
    fails += aotc_block_check<2, 2, 16, 96>(1, 16, 19, 21, 96, 16, 1, threads, fin, true);
    fails += aotc_block_check<2, 2, 16, 96>(2, 16, 19, 21, 96, 24, 2, threads, fin, true);
    fails += aotc_block_check<2, 2, 16, 160>(1, 16, 7, 7, 160, 16, 1, threads, fin, true);
    fails += aotc_block_check<2, 2>(2, 24, 6, 5, 144, 20, 2, threads, fin, true);
    fails += aotc_block_check<1, 1>(1, 3, 1, 1, 7, 8, 1, threads, fin, true);
    fails += aotc_block_check<2, 2, 24, 144>(1, 24, 56, 9, 144, 24, 1, threads, fin, true);
  }
  return fails != 0;
}
#endif

#endif  // AOTC_CONV_DW_H
