// Depthwise conv over channels-last input (conv.h's third entry point, aotc_conv2d_dw) and the pieces of it
// that conv_dw.h's fused blocks share: the row kernel aotc_conv_dw_row (the register epilogue they apply,
// aotc_conv_clamp, is conv_kernels.h's).
// What it is not: a header to include on its own terms -- conv.h includes it (after its own kernels, before
// its self-test, which checks aotc_conv2d_dw too), and it includes conv.h, so that either compiles alone.
// Epilogues run inside OpenMP regions and must not throw.
#ifndef AOTC_CONV_DEPTHWISE_H
#define AOTC_CONV_DEPTHWISE_H

#include "conv.h"

#ifndef AOTC_CONV_DW_CB
#define AOTC_CONV_DW_CB 256  // channels per depthwise task at most (a multiple of every vector width)
#endif
// Output pixels per register block of the depthwise kernel. AVX-512: 8, at stride 1 the 3 x 8 multiply-adds
// of a kernel row on 8 independent accumulators (4 left the FMAs waiting on their 4-cycle latency: the
// 112x112 block 4% faster); AVX2's 16 registers hold 4 (8 measured 1-3% slower).
#ifndef AOTC_CONV_DW_OB
#if AOTC_VBYTES == 64
#define AOTC_CONV_DW_OB 8
#else
#define AOTC_CONV_DW_OB 4
#endif
#endif
#ifndef AOTC_CONV_DW_ELEMS_PER_THREAD
#define AOTC_CONV_DW_ELEMS_PER_THREAD 65536.0  // output elements x taps (~20 us of one core) per extra thread
#endif

#ifndef AOTC_CONV_DW_OB2
#define AOTC_CONV_DW_OB2 8  // output pixels per register block of the stride-2 3x3 kernel
#endif

// aotc_conv_dw_row's 3x3 kernel at stride 2 (dilation 1): MobileNetV2's downsampling depthwise convs.
// Output j of a block of OB reads input pixels 2j, 2j + 1, 2j + 2 of the block's window: the 2 OB + 1
// pixels are each loaded once per kernel row and feed the one or two outputs that hold them, 2 OB + 4
// loads per 3 OB multiply-adds, where the general loop loads every tap (one load per multiply-add) and
// its border pixels took a checked loop one pixel at a time. Blocks with a tap outside the row read zeros
// there; the last block overlaps the one before when the row has OB pixels (equal values stored twice).
// The products are summed in the general loop's order (kh, then kw). Channels [c0, c0 + cb) with cb a
// multiple of the vector width: aotc_conv_dw_row runs the rest through its one-pixel loop.
template <class T, int OB>
static void aotc_conv_dw3s2_row(const aotc_conv_shape& s, const T* const* rows, int64_t sxw, const T* w, int64_t c0,
                                int64_t cb, T* tile, int64_t ldt, const aotc_conv_clamp<T>* fin) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  const int64_t C = s.C, W = s.W;
  const T* w0 = w + c0;
  // nb (<= OB) outputs from ow; EDGE: some of their taps lie outside the row
  auto block = [&](auto edge, int64_t ow, int64_t nb) {
    constexpr bool EDGE = decltype(edge)::value;
    const int64_t iw0 = ow * 2 - s.pw;
    T* out = tile + ow * ldt;
    for (int64_t c = 0; c < cb; c += L) {
      V acc[OB];
#pragma GCC unroll 16
      for (int j = 0; j < OB; ++j) acc[j] = V{};
      for (int64_t kh = 0; kh < 3; ++kh) {
        if (rows[kh] == NULL) continue;
        const T* xk = rows[kh] + c0 + c;
        V wv[3];
#pragma GCC unroll 3
        for (int kw = 0; kw < 3; ++kw) memcpy(&wv[kw], w0 + (kh * 3 + kw) * C + c, sizeof(V));
#pragma GCC unroll 40
        for (int i = 0; i < 2 * OB + 1; ++i) {
          V xv = V{};
          if (!EDGE || (iw0 + i >= 0 && iw0 + i < W)) memcpy(&xv, xk + (iw0 + i) * sxw, sizeof(V));
          if (i % 2 == 1) {
            acc[i / 2] = aotc_vfma(xv, wv[1], acc[i / 2]);
            continue;
          }
          if (i / 2 < OB) acc[i / 2] = aotc_vfma(xv, wv[0], acc[i / 2]);
          if (i / 2 >= 1) acc[i / 2 - 1] = aotc_vfma(xv, wv[2], acc[i / 2 - 1]);
        }
      }
#pragma GCC unroll 16
      for (int j = 0; j < OB; ++j) {
        if (EDGE && j >= nb) break;
        const V v = fin != NULL ? aotc_conv_vfin<T>(acc[j], *fin, fin->bias, c0 + c) : acc[j];
        memcpy(out + j * ldt + c, &v, sizeof(V));
      }
    }
  };
  for (int64_t ow = 0; ow < s.OW; ow += OB) {
    int64_t o = ow, nb = aotc_mm_min(OB, s.OW - ow);
    if (nb < OB && s.OW >= OB) o = s.OW - OB, nb = OB;
    if (nb == OB && o * 2 - s.pw >= 0 && o * 2 - s.pw + 2 * OB < W)
      block(std::false_type(), o, nb);
    else
      block(std::true_type(), o, nb);
  }
}

// One output row of a depthwise conv, channels [c0, c0 + cb), into tile[ow * ldt + (c - c0)]. ``rows[kh]``
// is the input row ih = oh * sh - ph + kh * dh (its pixel 0, channel 0; pixel stride ``sxw``), NULL when
// ih is outside the image: the rows need not be evenly spaced (conv_dw.h feeds a ring of computed rows).
// ``w`` is the weight [kh][kw][C]. ``fin`` (NULL: none) is applied to each output, its bias already image
// n's. KWC is the kernel width when known at compile time (3), else 0. The
// interior pixels (every kw tap inside the row) run in blocks of OB outputs, each weight vector loaded
// once per block; at stride 1 with KWC known the OB + KW - 1 input pixels of a block are loaded once
// for all kw taps. The edge pixels and the channels past the last full vector take a checked loop.
template <class T, int KWC>
static void aotc_conv_dw_row(const aotc_conv_shape& s, const T* const* rows, int64_t sxw, const T* w, int64_t c0,
                             int64_t cb, T* tile, int64_t ldt, const aotc_conv_clamp<T>* fin = NULL) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), OB = AOTC_CONV_DW_OB;
  const int64_t KW = KWC ? KWC : s.KW, KH = s.KH, C = s.C, cv = cb / L * L;
  const T* w0 = w + c0;
  // interior: iw = ow * sw - pw + kw * dw in [0, W) for kw = 0 and kw = KW - 1
  int64_t lo = aotc_conv_first(-s.pw, s.sw, 0, s.OW), hi = aotc_conv_end((KW - 1) * s.dw - s.pw, s.sw, s.W, s.OW);
  if (hi < lo) hi = lo;
  auto checked = [&](int64_t ow, int64_t cfrom) {  // one pixel, channels [cfrom, cb), every tap checked
    T* out = tile + ow * ldt;
    const int64_t kw0 = aotc_conv_first(ow * s.sw - s.pw, s.dw, 0, KW), kw1 = aotc_conv_end(ow * s.sw - s.pw, s.dw, s.W, KW);
    const int64_t at = (ow * s.sw - s.pw) * sxw + c0;
    int64_t c = cfrom;
    for (; c + L <= cv; c += L) {
      V acc = V{};
      for (int64_t kh = 0; kh < KH; ++kh) {
        if (rows[kh] == NULL) continue;
        for (int64_t kw = kw0; kw < kw1; ++kw) {
          V xv, wv;
          memcpy(&xv, rows[kh] + at + kw * s.dw * sxw + c, sizeof(V));
          memcpy(&wv, w0 + (kh * KW + kw) * C + c, sizeof(V));
          acc = aotc_vfma(xv, wv, acc);
        }
      }
      if (fin != NULL) acc = aotc_conv_vfin<T>(acc, *fin, fin->bias, c0 + c);
      memcpy(out + c, &acc, sizeof(V));
    }
    for (; c < cb; ++c) {
      T acc = T(0);
      for (int64_t kh = 0; kh < KH; ++kh) {
        if (rows[kh] == NULL) continue;
        for (int64_t kw = kw0; kw < kw1; ++kw)
          acc = std::fma(rows[kh][at + kw * s.dw * sxw + c], w0[(kh * KW + kw) * C + c], acc);
      }
      out[c] = fin != NULL ? aotc_conv_fin<T>(acc, *fin, fin->bias, c0 + c) : acc;
    }
  };
  if constexpr (KWC == 3) {
    if (s.KH == 3 && s.sw == 2 && s.dw == 1) {
      aotc_conv_dw3s2_row<T, AOTC_CONV_DW_OB2>(s, rows, sxw, w, c0, cv, tile, ldt, fin);
      if (cv < cb)
        for (int64_t ow = 0; ow < s.OW; ++ow) checked(ow, cv);
      return;
    }
  }
  const int64_t step = s.sw * sxw, tap = s.dw * sxw;
  const bool slide = KWC != 0 && s.sw == 1 && s.dw == 1;  // neighbouring outputs share KW - 1 input pixels
  constexpr int KS = KWC ? KWC : 1;
  // OB outputs from ow, every tap inside the row
  auto interior = [&](int64_t ow) {
    const int64_t at = (ow * s.sw - s.pw) * sxw + c0;
    T* out = tile + ow * ldt;
    for (int64_t c = 0; c < cv; c += L) {
      V acc[OB];
#pragma GCC unroll 8
      for (int j = 0; j < OB; ++j) acc[j] = V{};
      for (int64_t kh = 0; kh < KH; ++kh) {
        if (rows[kh] == NULL) continue;
        const T* xk = rows[kh] + at + c;
        const T* wk = w0 + kh * KW * C + c;
        if (slide) {
          V xv[OB + KS - 1], wv[KS];
#pragma GCC unroll 8
          for (int kw = 0; kw < KS; ++kw) memcpy(&wv[kw], wk + kw * C, sizeof(V));
#pragma GCC unroll 16
          for (int j = 0; j < OB + KS - 1; ++j) memcpy(&xv[j], xk + j * sxw, sizeof(V));
#pragma GCC unroll 8
          for (int kw = 0; kw < KS; ++kw)
#pragma GCC unroll 8
            for (int j = 0; j < OB; ++j) acc[j] = aotc_vfma(xv[j + kw], wv[kw], acc[j]);
          continue;
        }
#pragma GCC unroll 8
        for (int64_t kw = 0; kw < KW; ++kw) {
          V wv;
          memcpy(&wv, wk + kw * C, sizeof(V));
#pragma GCC unroll 8
          for (int j = 0; j < OB; ++j) {
            V xv;
            memcpy(&xv, xk + j * step + kw * tap, sizeof(V));
            acc[j] = aotc_vfma(xv, wv, acc[j]);
          }
        }
      }
      if (fin != NULL)
#pragma GCC unroll 8
        for (int j = 0; j < OB; ++j) acc[j] = aotc_conv_vfin<T>(acc[j], *fin, fin->bias, c0 + c);
#pragma GCC unroll 8
      for (int j = 0; j < OB; ++j) memcpy(out + j * ldt + c, &acc[j], sizeof(V));
    }
    if (cv < cb)
      for (int j = 0; j < OB; ++j) checked(ow + j, cv);
  };
  if (slide) {
    // Stride 1: the border pixels and a short row's tail run as blocks too, the input pixels outside the
    // row read as zeros (per pixel, a one-pixel checked loop was most of a 7x7 or 14x14 row).
    for (int64_t ow = 0; ow < s.OW; ow += OB) {
      if (ow >= lo && ow + OB <= hi) {
        interior(ow);
        continue;
      }
      const int64_t nb = aotc_mm_min(OB, s.OW - ow), iw0 = ow - s.pw;
      T* out = tile + ow * ldt;
      for (int64_t c = 0; c < cv; c += L) {
        V acc[OB];
#pragma GCC unroll 8
        for (int j = 0; j < OB; ++j) acc[j] = V{};
        for (int64_t kh = 0; kh < KH; ++kh) {
          if (rows[kh] == NULL) continue;
          const T* wk = w0 + kh * KW * C + c;
          V xv[OB + KS - 1], wv[KS];
#pragma GCC unroll 8
          for (int kw = 0; kw < KS; ++kw) memcpy(&wv[kw], wk + kw * C, sizeof(V));
#pragma GCC unroll 16
          for (int j = 0; j < OB + KS - 1; ++j) {
            xv[j] = V{};
            if (iw0 + j >= 0 && iw0 + j < s.W) memcpy(&xv[j], rows[kh] + (iw0 + j) * sxw + c0 + c, sizeof(V));
          }
#pragma GCC unroll 8
          for (int kw = 0; kw < KS; ++kw)
#pragma GCC unroll 8
            for (int j = 0; j < OB; ++j) acc[j] = aotc_vfma(xv[j + kw], wv[kw], acc[j]);
        }
        for (int j = 0; j < nb; ++j) {
          const V v = fin != NULL ? aotc_conv_vfin<T>(acc[j], *fin, fin->bias, c0 + c) : acc[j];
          memcpy(out + j * ldt + c, &v, sizeof(V));
        }
      }
      if (cv < cb)
        for (int j = 0; j < nb; ++j) checked(ow + j, cv);
    }
    return;
  }
  for (int64_t ow = 0; ow < lo; ++ow) checked(ow, 0);
  int64_t ow = lo;
  for (; ow + OB <= hi; ow += OB) interior(ow);
  for (; ow < s.OW; ++ow) checked(ow, 0);
}

// aotc_conv_dw_row's 3x3 kernel at stride 1 (dilation 1) for two output rows at once, out of the four input
// rows they read (rows[0..3], NULL outside the image): row 0 from rows 0-2, row 1 from rows 1-3. Each input
// pixel is loaded once per input row and fed to every output it holds a tap of (up to three per output
// row), where one row at a time loads each input row for three output rows and keeps OB + 2 pixels in
// registers. In MobileNetV2's blocks, whose rows come from L2 (written by the expand conv just before), the
// depthwise took a sixth of the block at 30-53 GFLOP/s one row at a time (AVX2): 20-40% faster in pairs.
// The products are summed in aotc_conv_dw_row's order (kh, then kw), pixels outside the row read as zeros
// as its stride-1 blocks do: the same values, bit for bit. Channels [c0, c0 + cv), cv a multiple of the
// vector width.
template <class T, int OB>
static void aotc_conv_dw3s1_row2(const aotc_conv_shape& s, const T* const* rows, int64_t sxw, const T* w, int64_t c0,
                                 int64_t cv, T* tile0, T* tile1, int64_t ldt, const aotc_conv_clamp<T>* fin) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  const int64_t C = s.C, W = s.W;
  const T* w0 = w + c0;
  // nb (<= OB) outputs from ow, all OB computed; EDGE: some of their taps lie outside the row
  auto block = [&](auto edge, int64_t ow, int64_t nb) __attribute__((always_inline)) {
    constexpr bool EDGE = decltype(edge)::value;
    const int64_t iw0 = ow - s.pw;
    for (int64_t c = 0; c < cv; c += L) {
      V a0[OB], a1[OB];
#pragma GCC unroll 16
      for (int j = 0; j < OB; ++j) a0[j] = a1[j] = V{};
      // input row R: taps kh = R of output row 0 (u) and kh = R - 1 of output row 1 (v)
      auto row = [&](auto rc) __attribute__((always_inline)) {
        constexpr int R = decltype(rc)::value;
        if (rows[R] == NULL) return;
        const T* xk = rows[R] + c0 + c;
        V u[3], v[3];
#pragma GCC unroll 3
        for (int kw = 0; kw < 3; ++kw) {
          if constexpr (R <= 2) memcpy(&u[kw], w0 + (R * 3 + kw) * C + c, sizeof(V));
          if constexpr (R >= 1) memcpy(&v[kw], w0 + ((R - 1) * 3 + kw) * C + c, sizeof(V));
        }
#pragma GCC unroll 18
        for (int i = 0; i < OB + 2; ++i) {  // pixel iw0 + i: tap kw of output i - kw
          V xv = V{};
          if (!EDGE || (iw0 + i >= 0 && iw0 + i < W)) memcpy(&xv, xk + (iw0 + i) * sxw, sizeof(V));
#pragma GCC unroll 3
          for (int kw = 0; kw < 3; ++kw) {
            if (i - kw < 0 || i - kw >= OB) continue;
            if constexpr (R <= 2) a0[i - kw] = aotc_vfma(xv, u[kw], a0[i - kw]);
            if constexpr (R >= 1) a1[i - kw] = aotc_vfma(xv, v[kw], a1[i - kw]);
          }
        }
      };
      row(std::integral_constant<int, 0>());
      row(std::integral_constant<int, 1>());
      row(std::integral_constant<int, 2>());
      row(std::integral_constant<int, 3>());
#pragma GCC unroll 16
      for (int j = 0; j < OB; ++j) {
        if (EDGE && j >= nb) break;
        V r0 = a0[j], r1 = a1[j];
        if (fin != NULL) {
          r0 = aotc_conv_vfin<T>(r0, *fin, fin->bias, c0 + c);
          r1 = aotc_conv_vfin<T>(r1, *fin, fin->bias, c0 + c);
        }
        memcpy(tile0 + (ow + j) * ldt + c, &r0, sizeof(V));
        memcpy(tile1 + (ow + j) * ldt + c, &r1, sizeof(V));
      }
    }
  };
  for (int64_t ow = 0; ow < s.OW; ow += OB) {
    const int64_t nb = aotc_mm_min((int64_t)OB, s.OW - ow), iw0 = ow - s.pw;
    if (nb == OB && iw0 >= 0 && iw0 + OB + 2 <= W)
      block(std::false_type(), ow, nb);
    else
      block(std::true_type(), ow, nb);
  }
}

// Output rows oh and oh + 1 of a depthwise conv of dilation 1 as aotc_conv_dw_row writes them (into tile0 and
// tile1), rows[i] the input row oh * sh - ph + i (i < KH + sh; NULL outside the image). A 3x3 at stride 1
// goes through aotc_conv_dw3s1_row2, the rest (and the channels past the last full vector) a row at a time.
template <class T>
static void aotc_conv_dw_row2(const aotc_conv_shape& s, const T* const* rows, int64_t sxw, const T* w, int64_t c0,
                              int64_t cb, T* tile0, T* tile1, int64_t ldt, const aotc_conv_clamp<T>* fin = NULL) {
  constexpr int L = (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T));
  const int64_t cv = cb / L * L;
  const bool pair = s.KH == 3 && s.KW == 3 && s.sh == 1 && s.sw == 1 && s.dh == 1 && s.dw == 1;
  if (pair && cv > 0) aotc_conv_dw3s1_row2<T, AOTC_CONV_DW_OB>(s, rows, sxw, w, c0, cv, tile0, tile1, ldt, fin);
  const int64_t from = pair ? cv : 0;
  if (from == cb) return;
  T* const tiles[2] = {tile0, tile1};
  for (int64_t j = 0; j < 2; ++j) {
    if (s.KW == 3)
      aotc_conv_dw_row<T, 3>(s, rows + j * s.sh, sxw, w, c0 + from, cb - from, tiles[j] + from, ldt, fin);
    else
      aotc_conv_dw_row<T, 0>(s, rows + j * s.sh, sxw, w, c0 + from, cb - from, tiles[j] + from, ldt, fin);
  }
}

// The input rows of output row ``oh`` for aotc_conv_dw_row: rows[kh] = xn + ih * sxh, NULL outside [0, H).
template <class T>
static inline void aotc_conv_dw_rows(const aotc_conv_shape& s, const T* xn, int64_t sxh, int64_t oh, const T** rows) {
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
    rows[kh] = ih >= 0 && ih < s.H ? xn + ih * sxh : NULL;
  }
}

// Depthwise over channels-last x (channel stride 1), weight w[(kh * KW + kw) * C + c]: one task per (image,
// output row, channel block). Its work is memory more than arithmetic (9 multiply-adds per element read),
// so the thread count follows output elements x taps, not flops.
template <class T, class Epi>
void aotc_conv2d_dw(const aotc_conv_shape& s, const T* x, aotc_conv_strides xs, const T* w, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  if (s.N <= 0 || s.O <= 0 || s.OH <= 0 || s.OW <= 0) return;
  const int64_t C = s.C;
  const int64_t CB = aotc_mm_min(aotc_roundup(C, L), AOTC_CONV_DW_CB), cblocks = (C + CB - 1) / CB;
  const int64_t tasks = s.N * s.OH * cblocks;
  const double work = (double)s.N * (double)s.OH * (double)s.OW * (double)C * (double)(s.KH * s.KW);
  const int64_t by_work = (int64_t)(work / AOTC_CONV_DW_ELEMS_PER_THREAD);
  const bool nested = aotc_pool_inside || omp_in_parallel();
  const int nthreads = nested ? 1 : (int)aotc_mm_min(aotc_mm_min(aotc_pool_threads(), tasks), by_work > 1 ? by_work : 1);
  // a tile per thread, then its KH row pointers
  const int64_t per = aotc_roundup(s.OW * CB + s.KH * (int64_t)(sizeof(void*) / sizeof(T) + 1), 64 / (int64_t)sizeof(T));
  // the library's kept workspace (matmul.h) unless nested in a caller's parallel loop: no per-call allocation
  const aotc_mm_scratch<T> scratch((size_t)(per * nthreads), nested);
  T* ws_all = scratch.p;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    T* tile = ws_all + (int64_t)slot * per;
    const T** rows = reinterpret_cast<const T**>(tile + aotc_roundup(s.OW * CB, 64 / (int64_t)sizeof(T)));
    const int64_t n = task / (s.OH * cblocks), oh = task / cblocks % s.OH, c0 = task % cblocks * CB;
    const int64_t cb = aotc_mm_min(C - c0, CB);
    aotc_conv_dw_rows<T>(s, x + xs.off + n * xs.s0, xs.s2, oh, rows);
    if (s.KW == 3)
      aotc_conv_dw_row<T, 3>(s, rows, xs.s3, w, c0, cb, tile, CB);
    else
      aotc_conv_dw_row<T, 0>(s, rows, xs.s3, w, c0, cb, tile, CB);
    epi(n, oh * s.OW, s.OW, c0, cb, (const T*)tile, CB);
  });
}

// The same over 16-bit float input and weight (a bf16 model): the input copied to dense channels-last T once
// (the packed convs' scratch, conv.h), the weight widened, then the kernel above.
template <class T, class SX, class SW, class Epi>
void aotc_conv2d_dw(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const SW* w, Epi epi) {
  static_assert(!std::is_same<SX, T>::value || !std::is_same<SW, T>::value, "the kernel above takes these");
  if (s.N <= 0 || s.O <= 0 || s.OH <= 0 || s.OW <= 0) return;
  const std::vector<T> wt = aotc_conv_widened<T>(w, s.KH * s.KW * s.C);
  aotc_conv2d_dw<T>(s, aotc_conv_nhwc<T>(s, x, xs), aotc_conv_dense(s), wt.data(), epi);
}

#endif  // AOTC_CONV_DEPTHWISE_H
