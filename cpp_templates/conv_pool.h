// A packed conv (conv.h) with a max or min pool fused after it: a ResNet stem's conv -> bias -> ReLU ->
// 3x3/2 max-pool without the conv's output ever stored whole (at 4x16x224x224 that is 12.8 MB written and
// read back, more time than the conv's arithmetic).
//
//   aotc_conv2d_packed_pool<T, NV, STEP, MAX, MONO>(s, x, xs, wp, pool, pre, epi)
//     pre(oc, v) -> v'         what runs between the conv and the pool on each conv output (bias, activation)
//     epi(n, ph, pw0, pwb, tile, ldt)  one pooled row: Red(n, oc, ph, pw) = tile[(pw - pw0) * ldt + oc]
//   The pool takes the max (MAX) or min of pre's values over the window's positions inside the conv's output
//   (padding never wins: -inf / +inf), NaN if any of them is NaN, as the unfused Reduce kernel does.
// One task per (image, band of pooled rows): the conv rows the band's windows cover are computed by the
// row kernel into the task's buffer (a row shared by two bands is computed twice, the band stays in L2),
// pre applied to each element, then pooled. Where the row kernel does not apply (a narrow image, dilated columns, no
// compile-time STEP) the conv runs whole into a scratch buffer first: the same result, without the saving.
// Epilogues run inside OpenMP regions and must not throw.
#ifndef AOTC_CONV_POOL_H
#define AOTC_CONV_POOL_H

#include "conv.h"

struct aotc_conv_pool {
  int64_t KH, KW;  // window
  int64_t sh, sw;  // stride
  int64_t ph, pw;  // padding
  int64_t OH, OW;  // pooled output
};

#ifndef AOTC_CONV_POOL_BAND_BYTES
#define AOTC_CONV_POOL_BAND_BYTES 196608  // conv rows one pool task keeps (in L2)
#endif

// The pool runs separably, as two 1-D passes (a max or min of maxes or mins: the same value; a 3x3/2 window
// reads 3 + 1.5 x 3 vectors per output instead of 9): each conv row, while in L1, into a row of
// horizontally pooled columns, then each pooled row from the KH such rows its window covers. Both take
// channels [0, C) a vector at a time (ldb a multiple of the vector: the lanes past C are read and written,
// never handed on). NANS: the input may hold a NaN (in its first C lanes), which then wins; without, a plain
// max / min (one instruction a value, where the NaN rule costs three).
template <class T, bool MAX, bool NANS, class V = typename aotc_mm_vec<T>::type>
static inline V aotc_pool_step(V acc, const T* at, V& sum) {
  V a;
  memcpy(&a, at, sizeof(a));
  if (NANS) return ((MAX ? a > acc : a < acc) | (a != a)) ? a : acc;  // a NaN, once in, stays
  sum += a;  // NaN where a value is: see aotc_pool_hrow
  return (MAX ? acc > a : acc < a) ? acc : a;
}

// Conv row r[ow * ldb + c] into h[pw * ldb + c]: the max / min over the window's columns inside the row.
// Without NANS, also whether the values read may hold a NaN: their sum is NaN where one is (or where
// infinities of both signs meet: a false alarm only sends the band down the NaN rule). An add beside each
// load and compare, where a pass of its own over the row cost a third as much as the pool; a NaN in a
// column no window reads changes nothing.
template <class T, bool MAX, bool NANS>
static bool aotc_pool_hrow(const aotc_conv_shape& s, const aotc_conv_pool& pl, const T* r, int64_t ldb, int64_t C,
                           T* h) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  const V init = aotc_vset1(MAX ? -(T)INFINITY : (T)INFINITY);
  V sum = V{};
  for (int64_t pw = 0; pw < pl.OW; ++pw) {
    const int64_t w0 = pw * pl.sw - pl.pw;
    const int64_t lo = w0 < 0 ? -w0 : 0, n = aotc_mm_min(pl.KW, s.OW - w0) - lo;  // the columns inside
    const T* at = r + (w0 + lo) * ldb;
    for (int64_t c0 = 0; c0 < C; c0 += L) {
      V acc = init;
      if (n == 3 && !NANS) {  // a 3-wide window inside the row (the stem's 3x3 pool), unrolled
        // One add a window on the running sum, the other two beside it: three in a row (one per step)
        // made the sum's latency, 12 cycles a window, the pool's limit -- a third of the CNN's stem.
        V a0, a1, a2;
        memcpy(&a0, at + c0, sizeof(V));
        memcpy(&a1, at + ldb + c0, sizeof(V));
        memcpy(&a2, at + 2 * ldb + c0, sizeof(V));
        sum += (a0 + a1) + a2;
        acc = MAX ? (a0 > a1 ? a0 : a1) : (a0 < a1 ? a0 : a1);
        acc = MAX ? (acc > a2 ? acc : a2) : (acc < a2 ? acc : a2);
      } else if (n == 3) {
        acc = aotc_pool_step<T, MAX, NANS>(aotc_pool_step<T, MAX, NANS>(aotc_pool_step<T, MAX, NANS>(acc, at + c0, sum), at + ldb + c0, sum),
                                           at + 2 * ldb + c0, sum);
      } else {
        for (int64_t j = 0; j < n; ++j) acc = aotc_pool_step<T, MAX, NANS>(acc, at + j * ldb + c0, sum);
      }
      memcpy(h + pw * ldb + c0, &acc, sizeof(V));
    }
  }
  bool any = false;
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) any |= sum[l] != sum[l];
  return any;
}

// Pooled row ph from the horizontally pooled rows hb[((oh - oh_lo) * OW + pw) * ldb + c] (pooled columns,
// conv rows from oh_lo) into out[pw * ldb + c]: the max / min over the window's rows inside the conv's output.
template <class T, bool MAX, bool NANS>
static void aotc_pool_vrow(const aotc_conv_shape& s, const aotc_conv_pool& pl, const T* hb, int64_t oh_lo, int64_t ldb,
                           int64_t C, int64_t ph, T* out) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  const V init = aotc_vset1(MAX ? -(T)INFINITY : (T)INFINITY);
  const int64_t h0 = ph * pl.sh - pl.ph, lo = h0 < 0 ? -h0 : 0, n = aotc_mm_min(pl.KH, s.OH - h0) - lo;
  const int64_t ldr = pl.OW * ldb;  // between pooled-column rows
  const T* at = hb + (h0 + lo - oh_lo) * ldr;
  V sum = V{};  // unused (hrow tested the values)
  for (int64_t pw = 0; pw < pl.OW; ++pw)
    for (int64_t c0 = 0; c0 < C; c0 += L) {
      const T* a = at + pw * ldb + c0;
      V acc = init;
      if (n == 3)
        acc = aotc_pool_step<T, MAX, NANS>(aotc_pool_step<T, MAX, NANS>(aotc_pool_step<T, MAX, NANS>(acc, a, sum), a + ldr, sum),
                                           a + 2 * ldr, sum);
      else
        for (int64_t j = 0; j < n; ++j) acc = aotc_pool_step<T, MAX, NANS>(acc, a + j * ldr, sum);
      memcpy(out + pw * ldb + c0, &acc, sizeof(V));
    }
}

// Conv row r (OW pixels of ldb values, channels [0, C)) through pre in place.
template <class T, class Pre>
static void aotc_pool_pre_row(T* r, int64_t OW, int64_t ldb, int64_t C, Pre& pre) {
  for (int64_t p = 0; p < OW; ++p) {
    T* v = r + p * ldb;
#pragma omp simd
    for (int64_t oc = 0; oc < C; ++oc) v[oc] = pre(oc, v[oc]);
  }
}

// MONO: pre is non-decreasing in the conv's value (bias, ReLU, clamps: codegen checks, cpp_pool.py's
// monotone), so max(pre(v)) = pre(max(v)) and min alike: the pool runs on the conv's own values and pre on
// the pooled ones, a quarter of them for a 3x3/2 pool (NaN in, NaN out either way).
template <class T, int NV, int STEP, bool MAX, bool MONO = false, class SX, class Pre, class Epi>
void aotc_conv2d_packed_pool(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const T* wp, aotc_conv_pool pl,
                             Pre pre, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L, MR = aotc_conv_mr<NV>::value;
  if (s.N <= 0 || s.O <= 0 || pl.OH <= 0 || pl.OW <= 0) return;
  // Input not dense channels-last T (the NCHW graph input of a stem): each task converts the input rows
  // it reads into its own buffer (in cache when the conv reads them, no pass of its own), the horizontal
  // padding as columns of zeros: the conv then runs as sc, every output's window inside its row.
  const bool convert = xs.s1 != 1 || !std::is_same<SX, T>::value;
  const int64_t pad = convert && s.pw > 0 ? s.pw : 0;
  const aotc_conv_shape sc = aotc_conv_wider(s, pad);
  const aotc_conv_strides xds = convert ? aotc_conv_dense(sc) : xs;
  const int64_t lo = aotc_conv_first(-sc.pw, sc.sw, 0, sc.OW), hi = aotc_conv_end(sc.KW - 1 - sc.pw, sc.sw, sc.W, sc.OW);
  const bool rows = STEP > 0 && STEP == s.sw * s.C && xds.s3 == s.C && s.dw == 1 && hi - lo >= MR;
  const int64_t Cp = aotc_roundup(s.O, NR), K = s.KH * s.KW * s.C, img = s.OH * s.OW * Cp;
  const int64_t row = s.OW * Cp, hrow = pl.OW * Cp;  // a conv row, a row of pooled columns
  const bool nested = aotc_conv_nested();
  // pooled row ph of image n from the pooled-column rows hb (conv rows from oh_lo) into out, then to epi
  auto finish = [&](int64_t n, int64_t ph, const T* hb, int64_t oh_lo, bool nans, T* out) {
    if (nans)
      aotc_pool_vrow<T, MAX, true>(s, pl, hb, oh_lo, Cp, s.O, ph, out);
    else
      aotc_pool_vrow<T, MAX, false>(s, pl, hb, oh_lo, Cp, s.O, ph, out);
    if (MONO)
      for (int64_t pw = 0; pw < pl.OW; ++pw) {
        T* v = out + pw * Cp;
#pragma omp simd
        for (int64_t oc = 0; oc < s.O; ++oc) v[oc] = pre(oc, v[oc]);
      }
    epi(n, ph, (int64_t)0, pl.OW, (const T*)out, Cp);
  };
  // conv row r of ldb-strided pixels: pre unless MONO, then its pooled columns into h; true where it may
  // hold a NaN (the padding lanes too: a NaN there only sends the band down the NaN-checking path)
  auto columns = [&](T* r, T* h) {
    if (!MONO) aotc_pool_pre_row<T>(r, s.OW, Cp, s.O, pre);
    if (!aotc_pool_hrow<T, MAX, false>(s, pl, r, Cp, s.O, h)) return false;
    aotc_pool_hrow<T, MAX, true>(s, pl, r, Cp, s.O, h);
    return true;
  };
  if (!rows) {
    const T* xd = convert ? aotc_conv_nhwc<T>(s, x, xs, pad) : (const T*)(const void*)x;
    T* full = static_cast<T*>(aligned_alloc(64, (size_t)aotc_roundup(s.N * img + (s.OH + 1) * hrow, 16) * sizeof(T)));
    if (full == NULL) throw std::bad_alloc();
    aotc_conv2d_packed<T, NV, STEP>(sc, xd, xds, wp, [&](int64_t n, int64_t p0, int64_t pb, int64_t o0, int64_t ob, const T* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
        for (int64_t oc = o0; oc < o0 + ob; ++oc) full[n * img + p * Cp + oc] = t[(p - p0) * ldt + oc - o0];
    });
    T* const hb = full + s.N * img;  // serial: the pool is a small part of this slow path
    T* const out = hb + s.OH * hrow;
    for (int64_t n = 0; n < s.N; ++n) {
      bool nans = false;
      for (int64_t oh = 0; oh < s.OH; ++oh) nans |= columns(full + n * img + oh * row, hb + oh * hrow);
      for (int64_t ph = 0; ph < pl.OH; ++ph) finish(n, ph, hb, 0, nans, out);
    }
    free(full);
    return;
  }
  int64_t B = ((int64_t)(AOTC_CONV_POOL_BAND_BYTES / sizeof(T)) / hrow - pl.KH) / pl.sh + 1;  // pooled rows a task
  if (B < 1) B = 1;
  const double flops = 2.0 * (double)s.N * (double)(s.OH * s.OW) * (double)s.O * (double)(K > 0 ? K : 1);
  const int64_t want = aotc_mm_min(aotc_pool_threads(), (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD)) * 4;
  while (B > 1 && s.N * ((pl.OH + B - 1) / B) < want) B = (B + 1) / 2;
  const int64_t bands = (pl.OH + B - 1) / B, tasks = s.N * bands;
  const int64_t band_rows = (B - 1) * pl.sh + pl.KH;
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  // per thread: the band's pooled-column rows, one conv row, one pooled row, the converted input
  const int64_t align = 64 / (int64_t)sizeof(T), band_elems = aotc_roundup(band_rows * hrow + row + hrow, align);
  const int64_t per = band_elems + (convert ? aotc_roundup(sc.H * sc.W * sc.C, align) : 0);
  const aotc_conv_bufs<T> bufs(per, nthreads, s.C, nested);
  T* const ws_all = bufs.ws;
  const T* const zero = bufs.zero;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    T* const hb = ws_all + (int64_t)slot * per;
    T* const r = hb + band_rows * hrow;
    T* const out = r + row;
    const int64_t n = task / bands, ph0 = task % bands * B, ph1 = aotc_mm_min(pl.OH, ph0 + B);
    const int64_t oh_lo = aotc_mm_min(s.OH, ph0 * pl.sh - pl.ph > 0 ? ph0 * pl.sh - pl.ph : 0);
    const int64_t oh_hi = aotc_mm_min(s.OH, (ph1 - 1) * pl.sh - pl.ph + pl.KH);
    T* const xc = hb + band_elems;
    if (convert) {  // the input rows of conv rows [oh_lo, oh_hi), into an image-sized buffer at their place
      const int64_t ih0 = oh_lo * s.sh - s.ph, ih1 = (oh_hi - 1) * s.sh - s.ph + (s.KH - 1) * s.dh + 1;
      aotc_conv_nhwc_rows<T>(s, x, xs, n, ih0 > 0 ? ih0 : 0, aotc_mm_min(ih1, s.H), xc, pad);
    }
    const T* xn = convert ? (const T*)xc : (const T*)(const void*)x + xs.off + n * xs.s0;
    // Row by row: each conv row computed into r, then (in L1) pre and the NaN test, and its pooled columns.
    bool nans = false;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      for (int64_t js = 0; js < Cp; js += NR) {
        const T* bp = wp + js / NR * K * NR;
        aotc_conv_row<T, NV, STEP>(sc, xn, xds.s2, bp, oh, lo, hi, r + js, Cp);
        if (lo > 0 || hi < s.OW) aotc_conv_edges<T, NV>(sc, xn, xds.s2, bp, oh, 1, lo, hi, zero, r + js, row, Cp);
      }
      nans |= columns(r, hb + (oh - oh_lo) * hrow);
    }
    for (int64_t ph = ph0; ph < ph1; ++ph) finish(n, ph, hb, oh_lo, nans, out);
  });
}

#ifdef AOTC_SELFTEST_CONV_POOL
#include <stdio.h>
// conv -> relu(v + bias) -> max-pool (and min-pool) against a naive loop, row kernel and fallback paths.
template <int NV, int STEP, bool MAX, bool MONO = false>
static int aotc_conv_pool_check(aotc_conv_shape s, aotc_conv_pool pl, bool nchw) {
  constexpr int NR = NV * AOTC_VBYTES / 4;
  const int64_t taps = s.KH * s.KW, K = taps * s.C, panels = (s.O + NR - 1) / NR;
  std::vector<float> x(s.N * s.C * s.H * s.W), w(s.O * K), bias(s.O), wp(panels * K * NR, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = (float)((i * 3) % 7) - 3.0f;
  for (int64_t o = 0; o < s.O; ++o) bias[o] = (float)(o % 3) - 1.0f;
  for (int64_t o = 0; o < s.O; ++o)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t t = 0; t < taps; ++t) wp[(o / NR * K + t * s.C + c) * NR + o % NR] = w[(o * s.C + c) * taps + t];
  aotc_conv_strides xs = nchw ? aotc_conv_strides{0, s.C * s.H * s.W, s.H * s.W, s.W, 1} : aotc_conv_dense(s);
  std::vector<float> xl(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t ww = 0; ww < s.W; ++ww) xl[n * xs.s0 + c * xs.s1 + h * xs.s2 + ww * xs.s3] = x[((n * s.C + c) * s.H + h) * s.W + ww];
  std::vector<float> y(s.N * s.O * pl.OH * pl.OW, 7.5f);
  aotc_conv2d_packed_pool<float, NV, STEP, MAX, MONO>(
      s, xl.data(), xs, wp.data(), pl, [&](int64_t oc, float v) { return v + bias[oc] > 0 ? v + bias[oc] : 0.0f; },
      [&](int64_t n, int64_t ph, int64_t pw0, int64_t pwb, const float* t, int64_t ldt) {
        for (int64_t pw = pw0; pw < pw0 + pwb; ++pw)
          for (int64_t oc = 0; oc < s.O; ++oc) y[((n * s.O + oc) * pl.OH + ph) * pl.OW + pw] = t[(pw - pw0) * ldt + oc];
      });
  int fails = 0;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t ph = 0; ph < pl.OH; ++ph)
        for (int64_t pw = 0; pw < pl.OW; ++pw) {
          float ref = MAX ? -INFINITY : INFINITY;
          for (int64_t r0 = 0; r0 < pl.KH; ++r0)
            for (int64_t r1 = 0; r1 < pl.KW; ++r1) {
              const int64_t oh = ph * pl.sh - pl.ph + r0, ow = pw * pl.sw - pl.pw + r1;
              if (oh < 0 || oh >= s.OH || ow < 0 || ow >= s.OW) continue;
              float v = bias[o];
              for (int64_t c = 0; c < s.C; ++c)
                for (int64_t kh = 0; kh < s.KH; ++kh)
                  for (int64_t kw = 0; kw < s.KW; ++kw) {
                    const int64_t ih = oh * s.sh - s.ph + kh * s.dh, iw = ow * s.sw - s.pw + kw * s.dw;
                    if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                    v += x[((n * s.C + c) * s.H + ih) * s.W + iw] * w[((o * s.C + c) * s.KH + kh) * s.KW + kw];
                  }
              v = v > 0 ? v : 0.0f;
              ref = MAX ? (v > ref ? v : ref) : (v < ref ? v : ref);
            }
          fails += y[((n * s.O + o) * pl.OH + ph) * pl.OW + pw] != ref;
        }
  if (fails) printf("conv_pool: %d of %zu wrong for %ldx%ldx%ldx%ld -> %ld\n", fails, y.size(), (long)s.N, (long)s.C, (long)s.H, (long)s.W, (long)s.O);
  return fails;
}

int main() {
  int fails = 0;
  for (int nchw = 0; nchw < 2; ++nchw) {
    // a stem: 3x3 conv, 3x3/2 pool padded 1, odd pooled size
    fails += aotc_conv_pool_check<1, 3, true>({2, 3, 41, 53, 16, 3, 3, 41, 53, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 21, 27}, nchw);
    // 7x7/2 conv (ResNet's), channels past one panel and not a multiple of a vector, 2x2/2 min-pool unpadded
    fails += aotc_conv_pool_check<2, 6, false>({1, 3, 40, 70, 37, 7, 7, 20, 35, 2, 2, 3, 3, 1, 1, 1}, {2, 2, 2, 2, 0, 0, 10, 17}, nchw);
    // too narrow for the row kernel: the whole-conv fallback
    fails += aotc_conv_pool_check<1, 5, true>({1, 5, 9, 8, 11, 3, 3, 9, 8, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 5, 4}, nchw);
    // no compile-time STEP; 3x3/1 pool
    fails += aotc_conv_pool_check<1, 0, true>({1, 4, 12, 30, 8, 3, 3, 12, 30, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 1, 1, 1, 1, 12, 30}, nchw);
    // pre (bias, ReLU: non-decreasing) after the pool
    fails += aotc_conv_pool_check<1, 3, true, true>({2, 3, 41, 53, 16, 3, 3, 41, 53, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 21, 27}, nchw);
    fails += aotc_conv_pool_check<2, 6, false, true>({1, 3, 40, 70, 37, 7, 7, 20, 35, 2, 2, 3, 3, 1, 1, 1}, {2, 2, 2, 2, 0, 0, 10, 17}, nchw);
    fails += aotc_conv_pool_check<1, 5, true, true>({1, 5, 9, 8, 11, 3, 3, 9, 8, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 5, 4}, nchw);
  }
  return fails != 0;
}
#endif

#endif  // AOTC_CONV_POOL_H
