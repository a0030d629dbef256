// 2-D convolution, NCHW input and OIHW weight (any strides), with stride, padding, dilation and groups,
// and a fused epilogue:  epi(n, oc0, ocb, p0, pb, tile, ldt)  with Acc(n, oc, p) =
// tile[(oc - oc0) * ldt + (p - p0)], where p = oh * OW + ow is the flattened output position.
//
// Two paths:
//   - one input channel per group (depthwise, and plain convs over a single channel): a direct loop per
//     (image, output channel) plane, vectorised along the output row;
//   - everything else: the weight is packed once per call into [O][C/G * KH * KW] (converted to T), and
//     per image the input is unfolded (im2col) into [G][C/G * KH * KW][OH * OW] -- skipped for 1x1,
//     stride-1, unpadded convs over rows-contiguous inputs, which are a plain matmul already -- and
//     multiplied with aotc_matmul (batch = groups).
// The epilogue runs inside OpenMP regions and must not throw.
#ifndef AOTC_CONV_H
#define AOTC_CONV_H

#include <stdint.h>
#include <stdlib.h>

#include <new>
#include <vector>

#include "matmul.h"

#ifndef AOTC_CONV_MIN_PAR_WORK
#define AOTC_CONV_MIN_PAR_WORK 32768  // multiply-adds below which the direct path stays on one thread
#endif

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

template <class T, class SX, class SW, class Epi>
static void aotc_conv2d_direct(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const SW* w,
                               aotc_conv_strides ws, Epi epi) {
  const int64_t opg = s.O / s.G, P = s.OH * s.OW;
  const int64_t planes = s.N * s.O;
  const bool par = planes > 1 && planes * P * s.KH * s.KW >= AOTC_CONV_MIN_PAR_WORK;
  const int nthreads = par ? aotc_pool_threads() : 1;
  T* ws_all = static_cast<T*>(aligned_alloc(64, (size_t)aotc_roundup(P > 0 ? P : 1, 16) * sizeof(T) * nthreads));
  if (ws_all == NULL) throw std::bad_alloc();
  aotc_pool_run(planes, nthreads, [&](int64_t t, int slot) {
    T* out = ws_all + (int64_t)slot * aotc_roundup(P > 0 ? P : 1, 16);
    const int64_t n = t / s.O, oc = t % s.O, c = oc / opg;  // one input channel per group
    for (int64_t p = 0; p < P; ++p) out[p] = T(0);
    const int64_t xbase = xs.off + n * xs.s0 + c * xs.s1;
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const int64_t dh = kh * s.dh - s.ph;  // ih = oh * sh + dh
      const int64_t oh0 = aotc_conv_first(dh, s.sh, 0, s.OH), oh1 = aotc_conv_end(dh, s.sh, s.H, s.OH);
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const T wv = (T)aotc_elem<SW>::load(w, ws.off + oc * ws.s0 + kh * ws.s2 + kw * ws.s3);
        const int64_t dw = kw * s.dw - s.pw;
        const int64_t ow0 = aotc_conv_first(dw, s.sw, 0, s.OW), ow1 = aotc_conv_end(dw, s.sw, s.W, s.OW);
        for (int64_t oh = oh0; oh < oh1; ++oh) {
          const int64_t xrow = xbase + (oh * s.sh + dh) * xs.s2 + dw * xs.s3;
          T* orow = out + oh * s.OW;
#pragma omp simd
          for (int64_t ow = ow0; ow < ow1; ++ow)
            orow[ow] += (T)aotc_elem<SX>::load(x, xrow + ow * s.sw * xs.s3) * wv;
        }
      }
    }
    epi(n, oc, (int64_t)1, (int64_t)0, P, (const T*)out, P);
  });
  free(ws_all);
}

template <class T, class SX, class SW, class Epi>
void aotc_conv2d(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const SW* w,
                 aotc_conv_strides ws, Epi epi) {
  if (s.N <= 0 || s.O <= 0 || s.OH <= 0 || s.OW <= 0) return;
  const int64_t cpg = s.C / s.G, opg = s.O / s.G, P = s.OH * s.OW;
  if (cpg == 1) {
    aotc_conv2d_direct<T>(s, x, xs, w, ws, epi);
    return;
  }
  const int64_t kg = cpg * s.KH * s.KW;
  std::vector<T> wp((size_t)(s.O * kg));
  for (int64_t o = 0; o < s.O; ++o)
    for (int64_t c = 0; c < cpg; ++c)
      for (int64_t kh = 0; kh < s.KH; ++kh)
        for (int64_t kw = 0; kw < s.KW; ++kw)
          wp[(size_t)(((o * cpg + c) * s.KH + kh) * s.KW + kw)] =
              (T)aotc_elem<SW>::load(w, ws.off + o * ws.s0 + c * ws.s1 + kh * ws.s2 + kw * ws.s3);
  const T* wpp = wp.data();
  auto offw = [=](int64_t g) { return g * opg * kg; };
  const bool pointwise = s.KH == 1 && s.KW == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0 &&
                         xs.s3 == 1 && xs.s2 == s.W && s.OH == s.H && s.OW == s.W;
  std::vector<T> col(pointwise ? 0 : (size_t)(s.G * kg * P));
  T* colp = col.data();
  for (int64_t n = 0; n < s.N; ++n) {
    auto tile_epi = [&](int64_t g, int64_t m0, int64_t mb, int64_t p0, int64_t pb, const T* tile, int64_t ldt) {
      epi(n, g * opg + m0, mb, p0, pb, tile, ldt);
    };
    if (pointwise) {  // x[n] viewed as [G][cpg][P] is the B operand as it stands
      const int64_t xo = xs.off + n * xs.s0, sxc = xs.s1;
      aotc_matmul<T>(s.G, opg, P, kg, wpp, offw, kg, 1, x, [=](int64_t g) { return xo + g * cpg * sxc; }, sxc,
                     1, tile_epi);
      continue;
    }
    const int64_t rows = s.G * kg;
    const bool par = rows * P >= AOTC_CONV_MIN_PAR_WORK;
    aotc_pool_run(rows, par ? aotc_pool_threads() : 1, [&](int64_t r, int) {  // r = (c, kh, kw), all groups
      const int64_t c = r / (s.KH * s.KW), kh = r / s.KW % s.KH, kw = r % s.KW;
      const int64_t dh = kh * s.dh - s.ph, dw = kw * s.dw - s.pw;
      const int64_t oh0 = aotc_conv_first(dh, s.sh, 0, s.OH), oh1 = aotc_conv_end(dh, s.sh, s.H, s.OH);
      const int64_t ow0 = aotc_conv_first(dw, s.sw, 0, s.OW), ow1 = aotc_conv_end(dw, s.sw, s.W, s.OW);
      T* dst = colp + r * P;
      const int64_t xbase = xs.off + n * xs.s0 + c * xs.s1;
      for (int64_t oh = 0; oh < s.OH; ++oh) {
        T* drow = dst + oh * s.OW;
        if (oh < oh0 || oh >= oh1) {
          for (int64_t ow = 0; ow < s.OW; ++ow) drow[ow] = T(0);
          continue;
        }
        const int64_t xrow = xbase + (oh * s.sh + dh) * xs.s2 + dw * xs.s3;
        for (int64_t ow = 0; ow < ow0; ++ow) drow[ow] = T(0);
#pragma omp simd
        for (int64_t ow = ow0; ow < ow1; ++ow) drow[ow] = (T)aotc_elem<SX>::load(x, xrow + ow * s.sw * xs.s3);
        for (int64_t ow = ow1 > ow0 ? ow1 : ow0; ow < s.OW; ++ow) drow[ow] = T(0);
      }
    });
    aotc_matmul<T>(s.G, opg, P, kg, wpp, offw, kg, 1, (const T*)colp, [=](int64_t g) { return g * kg * P; }, P,
                   1, tile_epi);
  }
}

#ifdef AOTC_SELFTEST_CONV
// Checks both paths against a naive loop on small integer data (exact in fp32).
static int aotc_conv_check(aotc_conv_shape s) {
  const int64_t cpg = s.C / s.G, opg = s.O / s.G;
  std::vector<float> x(s.N * s.C * s.H * s.W), w(s.O * cpg * s.KH * s.KW), y(s.N * s.O * s.OH * s.OW, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = (float)((i * 3) % 7) - 3.0f;
  aotc_conv_strides xs{0, s.C * s.H * s.W, s.H * s.W, s.W, 1}, ws{0, cpg * s.KH * s.KW, s.KH * s.KW, s.KW, 1};
  aotc_conv2d<float>(s, x.data(), xs, w.data(), ws,
                     [&](int64_t n, int64_t oc0, int64_t ocb, int64_t p0, int64_t pb, const float* t, int64_t ldt) {
                       for (int64_t oc = oc0; oc < oc0 + ocb; ++oc)
                         for (int64_t p = p0; p < p0 + pb; ++p)
                           y[(n * s.O + oc) * s.OH * s.OW + p] = t[(oc - oc0) * ldt + (p - p0)];
                     });
  int fails = 0;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t oh = 0; oh < s.OH; ++oh)
        for (int64_t ow = 0; ow < s.OW; ++ow) {
          float ref = 0;
          const int64_t g = o / opg;
          for (int64_t c = 0; c < cpg; ++c)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.sh - s.ph + kh * s.dh, iw = ow * s.sw - s.pw + kw * s.dw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                ref += x[((n * s.C + g * cpg + c) * s.H + ih) * s.W + iw] * w[((o * cpg + c) * s.KH + kh) * s.KW + kw];
              }
          fails += y[((n * s.O + o) * s.OH + oh) * s.OW + ow] != ref;
        }
  return fails;
}

int main() {
  int fails = 0;
  fails += aotc_conv_check({2, 6, 9, 11, 4, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 2});  // grouped, strided, padded
  fails += aotc_conv_check({2, 4, 7, 7, 8, 3, 3, 3, 3, 1, 1, 0, 0, 2, 2, 4});   // depthwise x2, dilated
  fails += aotc_conv_check({1, 8, 5, 5, 3, 1, 1, 5, 5, 1, 1, 0, 0, 1, 1, 1});   // 1x1
  return fails != 0;
}
#endif

#endif  // AOTC_CONV_H
