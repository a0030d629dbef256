// A packed conv (conv.h) with a max or min pool fused after it: a ResNet stem's conv -> bias -> ReLU ->
// 3x3/2 max-pool without the conv's output ever stored whole (at 4x16x224x224 that is 12.8 MB written and
// read back, more time than the conv's arithmetic).
//
//   aotc_conv2d_packed_pool<T, NV, STEP, MAX>(s, x, xs, wp, pool, pre, epi)
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

// Pooled row ph of one image from the conv rows [oh_lo, ...) in band[((oh - oh_lo) * OW + ow) * ldb + oc]
// into out[pw * ldb + oc], channels [0, C) a vector at a time (ldb a multiple of the vector: the lanes
// past C are read and written, never handed on). NANS: the band may hold a NaN (in its first C lanes),
// which then wins; without, a plain max / min (one instruction a value, where the NaN rule costs three).
template <class T, bool MAX, bool NANS>
static void aotc_pool_row(const aotc_conv_shape& s, const aotc_conv_pool& pl, const T* band, int64_t oh_lo, int64_t ldb,
                          int64_t C, int64_t ph, T* out) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  const V init = aotc_vset1(MAX ? -(T)INFINITY : (T)INFINITY);
  const int64_t h0 = ph * pl.sh - pl.ph;
  // the window's rows and columns inside the conv's output (min / max: a division per pixel cost more
  // than the pooling)
  const int64_t r0lo = h0 < 0 ? -h0 : 0, r0hi = aotc_mm_min(pl.KH, s.OH - h0);
  auto step = [](V acc, const T* at) {
    V a;
    memcpy(&a, at, sizeof(V));
    if (NANS) return ((MAX ? a > acc : a < acc) | (a != a)) ? a : acc;  // a NaN, once in, stays
    return (MAX ? acc > a : acc < a) ? acc : a;
  };
  for (int64_t pw = 0; pw < pl.OW; ++pw) {
    const int64_t w0 = pw * pl.sw - pl.pw;
    const int64_t r1lo = w0 < 0 ? -w0 : 0, r1hi = aotc_mm_min(pl.KW, s.OW - w0);
    for (int64_t c0 = 0; c0 < C; c0 += L) {
      V acc = init;
      for (int64_t r0 = r0lo; r0 < r0hi; ++r0) {
        const T* at = band + ((h0 + r0 - oh_lo) * s.OW + w0 + r1lo) * ldb + c0;  // the row's first column inside
        if (r1hi - r1lo == 3) {  // a 3-wide window inside the row (the stem's 3x3 pool), unrolled
          acc = step(step(step(acc, at), at + ldb), at + 2 * ldb);
          continue;
        }
        for (int64_t r1 = 0; r1 < r1hi - r1lo; ++r1) acc = step(acc, at + r1 * ldb);
      }
      memcpy(out + pw * ldb + c0, &acc, sizeof(V));
    }
  }
}

template <class T, int NV, int STEP, bool MAX, class SX, class Pre, class Epi>
void aotc_conv2d_packed_pool(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const T* wp, aotc_conv_pool pl,
                             Pre pre, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L, MR = aotc_conv_mr<NV>::value;
  if (s.N <= 0 || s.O <= 0 || pl.OH <= 0 || pl.OW <= 0) return;
  // Input not dense channels-last T (the NCHW graph input of a stem): each task converts the input rows
  // it reads into its own buffer (in cache when the conv reads them, no pass of its own).
  const bool convert = xs.s1 != 1 || !std::is_same<SX, T>::value;
  const aotc_conv_strides xds = convert ? aotc_conv_dense(s) : xs;
  const int64_t lo = aotc_conv_first(-s.pw, s.sw, 0, s.OW), hi = aotc_conv_end(s.KW - 1 - s.pw, s.sw, s.W, s.OW);
  const bool rows = STEP > 0 && STEP == s.sw * s.C && xds.s3 == s.C && s.dw == 1 && hi - lo >= MR;
  const int64_t Cp = aotc_roundup(s.O, NR), K = s.KH * s.KW * s.C, img = s.OH * s.OW * Cp;
  const bool nested = aotc_conv_nested();
  if (!rows) {
    const T* xd = convert ? aotc_conv_nhwc<T>(s, x, xs) : (const T*)(const void*)x;
    T* full = static_cast<T*>(aligned_alloc(64, (size_t)aotc_roundup(s.N * img + pl.OW * Cp, 16) * sizeof(T)));
    if (full == NULL) throw std::bad_alloc();
    aotc_conv2d_packed<T, NV, STEP>(s, xd, xds, wp, [&](int64_t n, int64_t p0, int64_t pb, int64_t o0, int64_t ob, const T* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
        for (int64_t oc = o0; oc < o0 + ob; ++oc) full[n * img + p * Cp + oc] = pre(oc, t[(p - p0) * ldt + oc - o0]);
    });
    T* out = full + s.N * img;  // serial: the pool is a small part of this slow path
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t ph = 0; ph < pl.OH; ++ph) {
        aotc_pool_row<T, MAX, true>(s, pl, full + n * img, 0, Cp, s.O, ph, out);
        epi(n, ph, (int64_t)0, pl.OW, (const T*)out, Cp);
      }
    free(full);
    return;
  }
  const int64_t row = s.OW * Cp;
  int64_t B = ((int64_t)(AOTC_CONV_POOL_BAND_BYTES / sizeof(T)) / row - pl.KH) / pl.sh + 1;  // pooled rows a task
  if (B < 1) B = 1;
  const double flops = 2.0 * (double)s.N * (double)(s.OH * s.OW) * (double)s.O * (double)(K > 0 ? K : 1);
  const int64_t want = aotc_mm_min(aotc_pool_threads(), (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD)) * 4;
  while (B > 1 && s.N * ((pl.OH + B - 1) / B) < want) B = (B + 1) / 2;
  const int64_t bands = (pl.OH + B - 1) / B, tasks = s.N * bands;
  const int64_t band_rows = (B - 1) * pl.sh + pl.KH;
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  const int64_t band_elems = aotc_roundup(band_rows * row + pl.OW * Cp, 64 / (int64_t)sizeof(T));
  const int64_t per = band_elems + (convert ? aotc_roundup(s.H * s.W * s.C, 64 / (int64_t)sizeof(T)) : 0);
  const aotc_conv_bufs<T> bufs(per, nthreads, s.C, nested);
  T* const ws_all = bufs.ws;
  const T* const zero = bufs.zero;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    T* band = ws_all + (int64_t)slot * per;
    T* out = band + band_rows * row;
    const int64_t n = task / bands, ph0 = task % bands * B, ph1 = aotc_mm_min(pl.OH, ph0 + B);
    const int64_t oh_lo = aotc_mm_min(s.OH, ph0 * pl.sh - pl.ph > 0 ? ph0 * pl.sh - pl.ph : 0);
    const int64_t oh_hi = aotc_mm_min(s.OH, (ph1 - 1) * pl.sh - pl.ph + pl.KH);
    T* const xc = band + band_elems;
    if (convert) {  // the input rows of conv rows [oh_lo, oh_hi), into an image-sized buffer at their place
      const int64_t ih0 = oh_lo * s.sh - s.ph, ih1 = (oh_hi - 1) * s.sh - s.ph + (s.KH - 1) * s.dh + 1;
      aotc_conv_nhwc_rows<T>(s, x, xs, n, ih0 > 0 ? ih0 : 0, aotc_mm_min(ih1, s.H), xc);
    }
    const T* xn = convert ? (const T*)xc : (const T*)(const void*)x + xs.off + n * xs.s0;
    // Row by row, pre and the NaN test on each conv row just computed (in L1), not in passes over the band.
    int nans = 0;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      T* r = band + (oh - oh_lo) * row;
      for (int64_t js = 0; js < Cp; js += NR) {
        const T* bp = wp + js / NR * K * NR;
        aotc_conv_row<T, NV, STEP>(s, xn, xds.s2, bp, oh, lo, hi, r + js, Cp);
        aotc_conv_edges<T, NV>(s, xn, xds.s2, bp, oh, 1, lo, hi, zero, r + js, row, Cp);
      }
      for (int64_t p = 0; p < s.OW; ++p) {
        T* v = r + p * Cp;
#pragma omp simd
        for (int64_t oc = 0; oc < s.O; ++oc) v[oc] = pre(oc, v[oc]);
      }
      // Any NaN? A loop of its own (in pre's loop the reduction kept GCC from vectorising pre), over the
      // padding lanes too: a NaN there only sends the band down the NaN-checking path.
#pragma omp simd reduction(| : nans)
      for (int64_t i = 0; i < row; ++i) nans |= r[i] != r[i];
    }
    for (int64_t ph = ph0; ph < ph1; ++ph) {
      if (nans)
        aotc_pool_row<T, MAX, true>(s, pl, band, oh_lo, Cp, s.O, ph, out);
      else
        aotc_pool_row<T, MAX, false>(s, pl, band, oh_lo, Cp, s.O, ph, out);
      epi(n, ph, (int64_t)0, pl.OW, (const T*)out, Cp);
    }
  });
}

#ifdef AOTC_SELFTEST_CONV_POOL
#include <stdio.h>
// conv -> relu(v + bias) -> max-pool (and min-pool) against a naive loop, row kernel and fallback paths.
template <int NV, int STEP, bool MAX>
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
  aotc_conv2d_packed_pool<float, NV, STEP, MAX>(
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
  }
  return fails != 0;
}
#endif

#endif  // AOTC_CONV_POOL_H
