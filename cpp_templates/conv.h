// 2-D convolution with stride, padding, dilation and groups, and a fused epilogue. Three entry points:
//
//   aotc_conv2d<T>         any layout (input strides n, c, h, w; weight strides o, i, kh, kw); the weight is
//                          converted per call. Epilogue  epi(n, oc0, ocb, p0, pb, tile, ldt)  with
//                          Acc(n, oc, p) = tile[(oc - oc0) * ldt + (p - p0)], p = oh * OW + ow.
//                          One input channel per group: a direct loop per (image, output channel) plane;
//                          otherwise im2col per image and aotc_matmul (batch = groups).
//   aotc_conv2d_packed<T, NV>  groups == 1 with the weight packed at build time (aot/codegen/cpp_pack.py)
//                          into panels [ceil(O / NR)][KH * KW * C][NR], k = (kh * KW + kw) * C + c, NR = NV
//                          vectors. An implicit GEMM (M = output pixels, N = output channels): over
//                          channels-last input (channel stride 1) the micro-kernel reads the input in
//                          place through one pointer per (pixel, tap) -- an indirection buffer, XNNPACK's
//                          scheme; padding taps point at a row of zeros, and a 1x1 conv is a plain matmul;
//                          no im2col at all. Other input layouts (the NCHW graph input of a stem conv) are
//                          copied to NHWC once per call first.
//   aotc_conv2d_dw<T>      depthwise over channels-last input, weight [kh][kw][C]: a direct loop vectorised
//                          along the channels (conv_depthwise.h, included below).
//   The last two hand the epilogue channels-last tiles:  epi(n, p0, pb, oc0, ocb, tile, ldt)  with
//   Acc(n, oc, p) = tile[(p - p0) * ldt + (oc - oc0)].
// Epilogues run inside OpenMP regions and must not throw.
// What it is not: the packed conv's inner kernels (its micro-kernels, row kernels and border pixels) --
// those are conv_kernels.h's, with aotc_conv_shape and aotc_conv_strides; this file blocks the output into
// tasks, copies the input to channels-last where it must, and runs the kernels and the epilogue.
#ifndef AOTC_CONV_H
#define AOTC_CONV_H

#include <stdint.h>
#include <stdlib.h>

#include <cmath>
#include <new>
#include <type_traits>
#include <vector>

#include "matmul.h"
#include "conv_kernels.h"  // aotc_conv_shape, aotc_conv_strides and the channels-last kernels

#ifndef AOTC_CONV_MIN_PAR_WORK
#define AOTC_CONV_MIN_PAR_WORK 32768  // multiply-adds below which the direct path stays on one thread
#endif

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

// ---- channels-last: the packed conv (its kernels: conv_kernels.h) -------------------------------------

#ifndef AOTC_CONV_MB
#define AOTC_CONV_MB 96  // output pixels per task at most (a multiple of every MR)
#endif

// Scratch that the calling thread keeps from call to call (the NHWC copy of a stem conv's input): a fresh
// allocation of megabytes each call is a fresh mapping, its page faults and the kernel zeroing it every time.
static inline void* aotc_conv_scratch(size_t bytes) {
  struct held {
    void* p = nullptr;
    size_t n = 0;
    ~held() { free(p); }
  };
  static thread_local held h;
  if (h.n < bytes) {
    free(h.p);
    h.n = 0;
    h.p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (h.p == NULL) throw std::bad_alloc();
    h.n = bytes;
  }
  return h.p;
}

// The strides of a dense channels-last input of shape s.
static inline aotc_conv_strides aotc_conv_dense(const aotc_conv_shape& s) {
  return aotc_conv_strides{0, s.C * s.H * s.W, 1, s.W * s.C, s.C};
}

// The shape of conv s over its input widened by ``pad`` columns of zeros each side (channels-last copies of a
// stem's NCHW input carry the horizontal padding: every output pixel's window then lies inside the row,
// and the row kernel computes whole rows, without the per-tap border path).
static inline aotc_conv_shape aotc_conv_wider(const aotc_conv_shape& s, int64_t pad) {
  aotc_conv_shape w = s;
  w.W += 2 * pad;
  w.pw -= pad;
  return w;
}

#if AOTC_VBYTES == 64
// permutex2var indices interleaving three 16-float planes a, b, c into out[3 i + ch]: for output vector k,
// ab[k] takes a's and b's lanes into place (a c lane: anything), tc[k] then c's.
struct aotc_rgb_index {
  alignas(64) int32_t ab[3][16];
  alignas(64) int32_t tc[3][16];
};
static constexpr aotc_rgb_index aotc_rgb_make() {
  aotc_rgb_index r{};
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 16; ++j) {
      const int g = 16 * k + j, i = g / 3, ch = g % 3;
      r.ab[k][j] = ch == 0 ? i : ch == 1 ? 16 + i : 0;
      r.tc[k][j] = ch == 2 ? 16 + i : j;
    }
  return r;
}
static constexpr aotc_rgb_index aotc_rgb_idx = aotc_rgb_make();
#endif

// Rows [h0, h1) of image n of x (any layout and element type) into img, one image of dense channels-last
// T with ``pad`` pixels of zeros each side of a row (row h at img + h * (W + 2 pad) * C, pixel w at
// (pad + w) * C within it). Three channels (an RGB stem) with a compile-time count: the pixel's channels
// are written together instead of one strided pass per channel; fp32 planes of unit stride on AVX-512 16
// pixels at a time through two permutes per vector (the scalar loop was a tenth of the stem conv).
template <class T, class SX>
static void aotc_conv_nhwc_rows(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, int64_t n, int64_t h0,
                                int64_t h1, T* img, int64_t pad = 0) {
  const int64_t ld = (s.W + 2 * pad) * s.C;
  for (int64_t h = h0; h < h1; ++h) {
    T* row = img + h * ld;
    for (int64_t i = 0; i < pad * s.C; ++i) row[i] = row[ld - 1 - i] = T(0);
    row += pad * s.C;
    const int64_t at = xs.off + n * xs.s0 + h * xs.s2;
    if (s.C == 3) {
      int64_t w = 0;
#if AOTC_VBYTES == 64
      if constexpr (std::is_same<T, float>::value && std::is_same<SX, float>::value) {
        if (xs.s3 == 1) {
          const float* p = (const float*)(const void*)x + at;
          for (; w + 16 <= s.W; w += 16) {
            const __m512 a = _mm512_loadu_ps(p + w), b = _mm512_loadu_ps(p + xs.s1 + w), c = _mm512_loadu_ps(p + 2 * xs.s1 + w);
#pragma GCC unroll 3
            for (int k = 0; k < 3; ++k) {
              const __m512 t = _mm512_permutex2var_ps(a, _mm512_load_si512(aotc_rgb_idx.ab[k]), b);
              _mm512_storeu_ps(row + w * 3 + 16 * k, _mm512_permutex2var_ps(t, _mm512_load_si512(aotc_rgb_idx.tc[k]), c));
            }
          }
        }
      }
#endif
      for (; w < s.W; ++w)
#pragma GCC unroll 3
        for (int c = 0; c < 3; ++c) row[w * 3 + c] = (T)aotc_elem<SX>::load(x, at + c * xs.s1 + w * xs.s3);
      continue;
    }
    if (xs.s1 == 1) {  // channels-last already (a bf16 model's activations): a pixel's channels in a row
      for (int64_t w = 0; w < s.W; ++w)
#pragma omp simd
        for (int64_t c = 0; c < s.C; ++c) row[w * s.C + c] = (T)aotc_elem<SX>::load(x, at + w * xs.s3 + c);
      continue;
    }
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t w = 0; w < s.W; ++w) row[w * s.C + c] = (T)aotc_elem<SX>::load(x, at + c * xs.s1 + w * xs.s3);
  }
}

// x (any layout and element type) copied to dense channels-last T in the calling thread's scratch, ``pad``
// pixels of zeros each side of a row (the input of aotc_conv_wider(s, pad)).
template <class T, class SX>
static const T* aotc_conv_nhwc(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, int64_t pad = 0) {
  const int64_t chw = s.C * s.H * (s.W + 2 * pad);
  T* xt = static_cast<T*>(aotc_conv_scratch((size_t)aotc_roundup(s.N * chw, 16) * sizeof(T)));
  aotc_parallel_for(s.N * s.H, s.N * chw, [&](int64_t lo, int64_t hi) {
    for (int64_t nh = lo; nh < hi;) {  // the rows of one image at a time
      const int64_t n = nh / s.H, h1 = aotc_mm_min(hi - n * s.H, s.H);
      aotc_conv_nhwc_rows<T>(s, x, xs, n, nh % s.H, h1, xt + n * chw, pad);
      nh = n * s.H + h1;
    }
  });
  return xt;
}

// The n elements of p widened to T (a bf16 model's depthwise weight, [kh][kw][C]: conv_depthwise.h, conv_dw.h).
template <class T, class S>
static std::vector<T> aotc_conv_widened(const S* p, int64_t n) {
  std::vector<T> out((size_t)(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) out[(size_t)i] = (T)aotc_elem<S>::load(p, i);
  return out;
}

// The buffers of a packed conv's parallel loop: ``per`` elements for each of ``nthreads`` threads (the
// library's kept workspace, matmul.h, so a call allocates nothing -- or its own when nested in a caller's
// parallel loop) and a row of ``zeros`` zeros that taps outside the image read. Freed on scope exit, also
// when an epilogue's exception comes back through aotc_pool_run.
template <class T>
struct aotc_conv_bufs {
  aotc_mm_scratch<T> scratch;
  T* ws;
  T* zero;
  aotc_conv_bufs(int64_t per, int nthreads, int64_t zeros, bool nested)
      : scratch((size_t)(per * nthreads), nested), ws(scratch.p),
        zero(static_cast<T*>(calloc((size_t)(zeros > 0 ? zeros : 1), sizeof(T)))) {
    if (zero == NULL) throw std::bad_alloc();  // scratch frees itself
  }
  aotc_conv_bufs(const aotc_conv_bufs&) = delete;
  aotc_conv_bufs& operator=(const aotc_conv_bufs&) = delete;
  ~aotc_conv_bufs() { free(zero); }
};

// True where a parallel loop started now would run nested (inside a pool chunk or an OpenMP region).
static inline bool aotc_conv_nested() { return aotc_pool_inside || omp_in_parallel(); }

#ifndef AOTC_CONV_ROW_PIXELS
#define AOTC_CONV_ROW_PIXELS 96  // output pixels per task of the row kernel at most, whole rows (one at least)
#endif

// An output written from a kernel's registers (aotc_conv_out::at; conv_dw.h's blocks write their projection so):
// ``bias`` (at the first channel; NULL: none) and then row i of ``res`` (res + i * ldres; NULL: none) added to
// the accumulators before the clamp, in the order and rounding of aotc_conv_out's pass over a tile.
template <class T>
struct aotc_block_out {
  const T* bias;
  const T* res;
  int64_t ldres;
  // the same output from row i, column j on (a strip's, or a pass's share of a strip's vectors)
  aotc_block_out at(int64_t i, int64_t j) const {
    return {bias != NULL ? bias + j : NULL, res != NULL ? res + i * ldres + j : NULL, ldres};
  }
};

// An epilogue that writes the conv's output dense channels-last, out[(n * P + p) * O + oc] (P pixels an image,
// p = oh * OW + ow), as fin's clamp of the accumulators plus the bias (a folded batch-norm and ReLU/ReLU6:
// codegen's cpp_conv.py), with ``res`` (NULL: none; the output's layout, and it may be the output itself)
// added before the clamp: a ResNet block's skip connection. aotc_conv_packed_rows (no res) and Winograd's
// output transform write it straight from the registers (no tile, no pass over one: on MobileNetV2's stem
// that pass was a third of the conv); the other paths call it on their tiles.
template <class T>
struct aotc_conv_out {
  T* out;
  aotc_conv_clamp<T> fin;
  int64_t P, O;
  const T* res = NULL;
  // the bias and residual of image n's pixel p, channel 0 on, for a kernel writing from its registers
  aotc_block_out<T> at(int64_t n, int64_t p) const {
    return {fin.bias != NULL ? fin.bias + n * fin.bias_n : NULL, res != NULL ? res + (n * P + p) * O : NULL, O};
  }
  // A tile's pass (where the kernels do not write from their registers): vectors, then the channels past the
  // last whole one; no clamp where it cannot change a value (aotc_conv_clamp::bounded). As one simd loop over the channels with the clamp and the null checks inside, it
  // stayed scalar: MobileNetV2's blocks whose tiles it took (24 channels at AVX-512, hidden slices on 2
  // threads) ran 6-32% slower than through a lambda.
  void operator()(int64_t n, int64_t p0, int64_t pb, int64_t o0, int64_t ob, const T* tile, int64_t ldt) const {
    typedef typename aotc_mm_vec<T>::type V;
    constexpr int L = (int)(sizeof(V) / sizeof(T));
    const aotc_conv_clamp<T> clamp{NULL, 0, fin.lo, fin.hi};
    const bool clamps = fin.bounded();
    const int64_t ov = ob / L * L;
    for (int64_t p = p0; p < p0 + pb; ++p) {
      T* o = out + (n * P + p) * O + o0;
      const aotc_block_out<T> at_p = at(n, p).at(0, o0);
      const T *bias = at_p.bias, *r = at_p.res;
      const T* t = tile + (p - p0) * ldt;
      int64_t c = 0;
      for (; c < ov; c += L) {
        V v, u;
        memcpy(&v, t + c, sizeof(V));
        if (bias != NULL) {
          memcpy(&u, bias + c, sizeof(V));
          v += u;
        }
        if (r != NULL) {
          memcpy(&u, r + c, sizeof(V));
          v += u;
        }
        if (clamps) v = aotc_conv_vfin<T>(v, clamp, (const T*)NULL, 0);
        memcpy(o + c, &v, sizeof(V));
      }
      for (; c < ob; ++c) {
        T v = bias != NULL ? t[c] + bias[c] : t[c];
        if (r != NULL) v = v + r[c];
        o[c] = clamps ? aotc_conv_fin(v, clamp, (const T*)NULL, c) : v;
      }
    }
  }
};
template <class T, class Epi>
struct aotc_conv_is_out : std::is_same<typename std::decay<Epi>::type, aotc_conv_out<T>> {};

// aotc_conv2d_packed over dense channels-last input whose rows hold at least MR interior pixels (window
// inside horizontally, [lo, hi)): one task per (image, band of output rows, channel block), aotc_conv_row
// per row and panel. With an aotc_conv_out epilogue and O whole panels, a task takes all O channels and
// writes its rows of the output in place.
template <class T, int NV, int STEP, class Epi>
static void aotc_conv_packed_rows(const aotc_conv_shape& s, const T* x, aotc_conv_strides xs, const T* wp, Epi epi,
                                  int64_t lo, int64_t hi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L;
  const int64_t K = s.KH * s.KW * s.C;
  const double flops = 2.0 * (double)s.N * (double)(s.OH * s.OW) * (double)s.O * (double)(K > 0 ? K : 1);
  const int64_t want = aotc_mm_min(aotc_pool_threads(), (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD)) * 4;
  bool direct = false;  // the row kernels' stores take no residual: a res goes through tiles
  if constexpr (aotc_conv_is_out<T, Epi>::value) direct = s.O % NR == 0 && epi.res == NULL;
  int64_t R = s.OW < AOTC_CONV_ROW_PIXELS ? AOTC_CONV_ROW_PIXELS / s.OW : 1;
  int64_t NB = direct ? s.O : aotc_mm_min(aotc_roundup(s.O, NR), AOTC_MM_NB);
  auto ntasks = [&]() { return s.N * ((s.OH + R - 1) / R) * ((s.O + NB - 1) / NB); };
  while (R > 1 && ntasks() < want) R = (R + 1) / 2;
  while (!direct && NB > NR && ntasks() < want) NB = aotc_roundup(NB / 2, NR);
  const int64_t bands = (s.OH + R - 1) / R, oblocks = (s.O + NB - 1) / NB, tasks = ntasks();
  const bool nested = aotc_conv_nested();
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  const int64_t per = aotc_roundup(direct ? 1 : R * s.OW * NB, 64 / (int64_t)sizeof(T));
  const aotc_conv_bufs<T> bufs(per, nthreads, s.C, nested);
  T* const ws_all = bufs.ws;
  const T* const zero = bufs.zero;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    const int64_t n = task / (bands * oblocks), oh0 = task / oblocks % bands * R, oi = task % oblocks;
    const int64_t rb = aotc_mm_min(s.OH - oh0, R), o0 = oi * NB, ob = aotc_mm_min(s.O - o0, NB);
    const int64_t nbp = aotc_roundup(ob, NR);
    const T* xn = x + xs.off + n * xs.s0;
    // the task's rows into c (pixel pitch nbp), through fin's clamp with FIN
    auto rows = [&](auto fin_on, T* c, const aotc_conv_clamp<T>* fin, const T* bias) {
      constexpr bool FIN = decltype(fin_on)::value;
      for (int64_t js = 0; js < nbp; js += NR) {
        const T* bp = wp + ((o0 + js) / NR) * K * NR;
        const T* bj = bias != NULL ? bias + o0 + js : NULL;
        for (int64_t oh = oh0; oh < oh0 + rb; ++oh)
          aotc_conv_row<T, NV, STEP, FIN>(s, xn, xs.s2, bp, oh, lo, hi, c + (oh - oh0) * s.OW * nbp + js, nbp, fin, bj);
        aotc_conv_edges<T, NV, FIN>(s, xn, xs.s2, bp, oh0, rb, lo, hi, zero, c + js, s.OW * nbp, nbp, fin, bj);
      }
    };
    if constexpr (aotc_conv_is_out<T, Epi>::value) {
      if (direct) {  // nbp == O: the output's own layout
        const T* bias = epi.fin.bias != NULL ? epi.fin.bias + n * epi.fin.bias_n : NULL;
        rows(std::true_type(), epi.out + (n * epi.P + oh0 * s.OW) * s.O, &epi.fin, bias);
        return;
      }
    }
    T* tile = ws_all + (int64_t)slot * per;
    rows(std::false_type(), tile, (const aotc_conv_clamp<T>*)NULL, (const T*)NULL);
    epi(n, oh0 * s.OW, rb * s.OW, o0, ob, (const T*)tile, nbp);
  });
}

// STEP: stride * C of the conv when the caller knows it at compile time (codegen passes it), 0 otherwise;
// with it, dense channels-last input (pixel stride C, no horizontal dilation) takes the row kernel
// (conv_kernels.h's aotc_conv_row, through aotc_conv_packed_rows).
template <class T, int NV, int STEP = 0, class SX, class Epi>
void aotc_conv2d_packed(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const T* wp, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T));
  constexpr int NR = NV * L, MR = aotc_conv_mr<NV>::value;
  constexpr int MR2 = MR / 2 > 0 ? MR / 2 : 1, MR4 = MR / 4 > 0 ? MR / 4 : 1;
  static_assert(AOTC_CONV_MB % MR == 0, "AOTC_CONV_MB must be a multiple of MR");
  if (s.N <= 0 || s.O <= 0 || s.OH <= 0 || s.OW <= 0) return;
  if (xs.s1 != 1 || !std::is_same<SX, T>::value) {
    // Not channels-last (the NCHW graph input of a stem conv): one copy to NHWC with the horizontal
    // padding in it, then read it in place.
    const int64_t pad = s.pw > 0 ? s.pw : 0;
    const aotc_conv_shape sw = aotc_conv_wider(s, pad);
    aotc_conv2d_packed<T, NV, STEP>(sw, aotc_conv_nhwc<T>(s, x, xs, pad), aotc_conv_dense(sw), wp, epi);
    return;
  }
  const int64_t P = s.OH * s.OW, taps = s.KH * s.KW;
  const bool rows = taps == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0 && s.H == s.OH && s.W == s.OW &&
                    xs.s2 == s.W * xs.s3;
  if constexpr (NV == 2) {
    // A 1x1 conv over dense rows of pixels is a matmul, [P][C] x the packed weight (the conv's panels,
    // [ceil(O / NR)][C][NR], are the matmul's): its driver slices K and prefetches the next panel, where the
    // strips below read each panel cold (MobileNetV2's last conv, 49 x 320 -> 1280 with its 1.6 MB of
    // weights, 16% faster at AVX-512 and 6% at AVX2, one thread; the same sums, k in order).
    if (rows) {
      aotc_matmul_packed<T, 2>(s.N, P, s.O, s.C, (const T*)(const void*)x, [&](int64_t n) { return xs.off + n * xs.s0; },
                               xs.s3, 1, wp, epi);
      return;
    }
  }
  const double flops = 2.0 * (double)s.N * (double)P * (double)s.O * (double)(taps * s.C > 0 ? taps * s.C : 1);
  const int64_t most = aotc_pool_threads();
  const int64_t want = aotc_mm_min(most, (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD)) * 4;
  // Blocks: MB pixels x NB channels, narrowed until there are a few tasks per thread the work pays for.
  // Each pixel block streams its channel block's weights once, and each channel block reads its pixels'
  // inputs once: narrow the side whose re-reads cost less. Pixels first where the image outweighs the
  // weights (a weight panel is then re-read from cache); channels first where the weights outweigh the
  // image (a deep conv over a 7x7 image: MobileNetV2's last 1x1 conv, 1.6 MB of weights, was streamed three
  // times by three pixel blocks of 24, before 1x1 convs with two-vector panels ran as a matmul, above).
  int64_t MB = aotc_mm_min(aotc_roundup(P, MR), AOTC_CONV_MB), NB = aotc_mm_min(aotc_roundup(s.O, NR), AOTC_MM_NB);
  auto ntasks = [&]() { return s.N * ((P + MB - 1) / MB) * ((s.O + NB - 1) / NB); };
  if (s.O > s.N * P)
    while (NB > NR && ntasks() < want) NB = aotc_roundup(NB / 2, NR);
  while (MB > 2 * MR && ntasks() < want) MB = aotc_roundup(MB / 2, MR);
  while (NB > NR && ntasks() < want) NB = aotc_roundup(NB / 2, NR);
  if constexpr (STEP > 0) {
    if (!rows && STEP == s.sw * s.C && xs.s3 == s.C && s.dw == 1) {
      const int64_t lo = aotc_conv_first(-s.pw, s.sw, 0, s.OW), hi = aotc_conv_end(s.KW - 1 - s.pw, s.sw, s.W, s.OW);
      if (hi - lo >= MR) {
        aotc_conv_packed_rows<T, NV, STEP>(s, (const T*)(const void*)x, xs, wp, epi, lo, hi);
        return;
      }
    }
  }
  // Row taps: with dense pixels (pixel stride C) and no horizontal dilation, the KW taps of one kernel row
  // over an output pixel whose window lies inside the image horizontally are KW * C consecutive inputs --
  // k = (kh * KW + kw) * C + c of the packed panel is kh * (KW * C) + (kw * C + c) -- so such a strip of
  // MR pixels runs KH taps of KW * C channels: a third of the pointers and k loops of a 3x3 conv, and a
  // stem conv's 3 channels become 9. Strips touching the left or right border keep one tap per (kh, kw).
  const bool rowtaps = s.KW > 1 && s.dw == 1 && xs.s3 == s.C;
  const int64_t pblocks = (P + MB - 1) / MB, oblocks = (s.O + NB - 1) / NB, tasks = ntasks();
  const bool nested = aotc_conv_nested();
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  // per thread: the tile, then the indirection pointers
  const int64_t a_elems = aotc_roundup(MB * taps * (int64_t)sizeof(void*), 64) / (int64_t)sizeof(T);
  const int64_t per = aotc_roundup(MB * NB + a_elems, 64 / (int64_t)sizeof(T));
  const aotc_conv_bufs<T> bufs(per, nthreads, s.C * s.KW, nested);
  T* const ws_all = bufs.ws;
  const T* const zero = bufs.zero;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    T* tile = ws_all + (int64_t)slot * per;
    T* abuf = tile + MB * NB;
    const int64_t n = task / (pblocks * oblocks), pi = task / oblocks % pblocks, oi = task % oblocks;
    const int64_t p0 = pi * MB, pb = aotc_mm_min(P - p0, MB), o0 = oi * NB, ob = aotc_mm_min(s.O - o0, NB);
    const int64_t strips = (pb + MR - 1) / MR, nbp = aotc_roundup(ob, NR);
    const int64_t xn = xs.off + n * xs.s0;
    // A for this block: per strip and tap, MR pointers to the input pixel's channels (or to zeros)
    const T** ind = reinterpret_cast<const T**>(abuf);
    bool wide[AOTC_CONV_MB];  // per strip: row taps (KH taps of KW * C) or one tap per (kh, kw)
    if (rows) {  // 1x1, stride 1, unpadded over rows of pixels: pixel p is row p of a [P][C] matrix
      for (int64_t i = 0; i < strips * MR; ++i) ind[i] = i < pb ? (const T*)(const void*)(x + xn + (p0 + i) * xs.s3) : zero;
      for (int64_t si = 0; si < strips; ++si) wide[si] = false;
    } else {
      int64_t oh = p0 / s.OW, ow = p0 % s.OW;  // of pixel p0 + i, stepped along
      for (int64_t si = 0; si < strips; ++si) {
        const T** sind = ind + si * taps * MR;
        bool inside = rowtaps;
        for (int64_t r = 0, h = oh, w = ow; r < MR && inside; ++r) {
          const int64_t iw = w * s.sw - s.pw;
          inside = si * MR + r >= pb || (iw >= 0 && iw + s.KW <= s.W);
          if (++w == s.OW) w = 0, ++h;
        }
        wide[si] = inside;
        if (inside && ow + MR <= s.OW && si * MR + MR <= pb) {  // in one output row: pointers step by sw * C
          const int64_t step = s.sw * xs.s3;
          for (int64_t kh = 0; kh < s.KH; ++kh) {
            const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
            const T** row = sind + kh * MR;
            if (ih < 0 || ih >= s.H) {
              for (int r = 0; r < MR; ++r) row[r] = zero;
              continue;
            }
            const T* first = (const T*)(const void*)(x + xn + ih * xs.s2 + (ow * s.sw - s.pw) * xs.s3);
            for (int r = 0; r < MR; ++r) row[r] = first + r * step;
          }
          ow += MR;
          if (ow == s.OW) ow = 0, ++oh;
          continue;
        }
        for (int64_t r = 0; r < MR; ++r) {
          const bool live = si * MR + r < pb;
          for (int64_t kh = 0; kh < s.KH; ++kh) {
            const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
            const bool hin = live && ih >= 0 && ih < s.H;
            const T* xrow = (const T*)(const void*)(x + xn + ih * xs.s2);
            if (inside) {
              sind[kh * MR + r] = hin ? xrow + (ow * s.sw - s.pw) * xs.s3 : zero;
              continue;
            }
            for (int64_t kw = 0; kw < s.KW; ++kw) {
              const int64_t iw = ow * s.sw - s.pw + kw * s.dw;
              sind[(kh * s.KW + kw) * MR + r] = hin && iw >= 0 && iw < s.W ? xrow + iw * xs.s3 : zero;
            }
          }
          if (++ow == s.OW) ow = 0, ++oh;
        }
      }
    }
    for (int64_t js = 0; js < nbp; js += NR) {
      const T* bp = wp + ((o0 + js) / NR) * taps * s.C * NR;
      if (rows) {
        // 1x1: pixel p's pointer is ind[p], so strips may start anywhere: aotc_conv_row_strips' strips of MR,
        // a short last one as MR / 2 or MR / 4 or overlapping the one before, not rows of zeros (a 7x7
        // image's 49 pixels took 60 rows); fewer than MR pixels take the smallest strip that holds them.
        auto strip = [&](auto m, int64_t p) {
          aotc_conv_micro<T, decltype(m)::value, NV>(1, s.C, ind + p, bp, tile + p * nbp + js, nbp);
        };
        if (pb >= MR)
          aotc_conv_row_strips<MR, MR2, MR4>(0, pb, strip);
        else if (pb <= MR4)
          strip(std::integral_constant<int, MR4>(), 0);
        else if (pb <= MR2)
          strip(std::integral_constant<int, MR2>(), 0);
        else
          strip(std::integral_constant<int, MR>(), 0);
        continue;
      }
      for (int64_t si = 0; si < strips; ++si) {
        T* c = tile + si * MR * nbp + js;
        if (wide[si])
          aotc_conv_micro<T, MR, NV>(s.KH, s.KW * s.C, ind + si * taps * MR, bp, c, nbp);
        else
          aotc_conv_micro<T, MR, NV>(taps, s.C, ind + si * taps * MR, bp, c, nbp);
      }
    }
    epi(n, p0, pb, o0, ob, (const T*)tile, nbp);
  });
}

#include "conv_depthwise.h"  // aotc_conv2d_dw, aotc_conv_dw_row, aotc_conv_clamp

#ifdef AOTC_SELFTEST_CONV
// Checks both paths against a naive loop on small integer data (exact in fp32).
// Outputs of y ([N][O][OH][OW]) that differ from a naive conv of x ([N][C][H][W]) and w ([O][C/G][KH][KW]).
static int aotc_conv_naive_fails(const aotc_conv_shape& s, const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& y) {
  const int64_t cpg = s.C / s.G, opg = s.O / s.G;
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

static int aotc_conv_check(aotc_conv_shape s) {
  const int64_t cpg = s.C / s.G;
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
  return aotc_conv_naive_fails(s, x, w, y);
}

// The channels-last kernels against the same naive loop: x stored NHWC, the weight packed as cpp_pack.py
// packs it (groups == 1) or stored [kh][kw][C] (depthwise).
template <int NV, int STEP = 0>
static int aotc_conv_check_nhwc(aotc_conv_shape s, bool nchw_input) {
  constexpr int NR = NV * AOTC_VBYTES / 4;
  const int64_t cpg = s.C / s.G, P = s.OH * s.OW, taps = s.KH * s.KW;
  std::vector<float> x(s.N * s.C * s.H * s.W), w(s.O * cpg * taps), y(s.N * s.O * P, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = (float)((i * 3) % 7) - 3.0f;
  // x[n][c][h][w] (logical) lives at n*CHW + (h*W + w)*C + c, or row-major NCHW
  aotc_conv_strides xs = nchw_input ? aotc_conv_strides{0, s.C * s.H * s.W, s.H * s.W, s.W, 1}
                                    : aotc_conv_strides{0, s.C * s.H * s.W, 1, s.W * s.C, s.C};
  std::vector<float> xl(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t ww = 0; ww < s.W; ++ww)
          xl[n * xs.s0 + c * xs.s1 + h * xs.s2 + ww * xs.s3] = x[((n * s.C + c) * s.H + h) * s.W + ww];
  auto epi = [&](int64_t n, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
    for (int64_t p = p0; p < p0 + pb; ++p)
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) y[(n * s.O + oc) * P + p] = t[(p - p0) * ldt + (oc - oc0)];
  };
  if (s.G == 1) {
    const int64_t K = taps * s.C, panels = (s.O + NR - 1) / NR;
    std::vector<float> wp(panels * K * NR, 0.0f);
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t t = 0; t < taps; ++t) wp[(o / NR * K + t * s.C + c) * NR + o % NR] = w[(o * s.C + c) * taps + t];
    aotc_conv2d_packed<float, NV, STEP>(s, xl.data(), xs, wp.data(), epi);
  } else {
    std::vector<float> wd(w.size());
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t t = 0; t < taps; ++t) wd[t * s.C + c] = w[c * taps + t];
    aotc_conv2d_dw<float>(s, xl.data(), xs, wd.data(), epi);
  }
  return aotc_conv_naive_fails(s, x, w, y);
}

// aotc_conv_out (bias per image, clamp [0, 6]) against the same conv through a lambda epilogue that clamps
// each value; the output channels-last. Integer data: equal results, whichever path (in place or tiles).
template <int NV, int STEP = 0>
static int aotc_conv_check_out(aotc_conv_shape s, bool nchw_input, bool residual = false) {
  constexpr int NR = NV * AOTC_VBYTES / 4;
  const int64_t P = s.OH * s.OW, K = s.KH * s.KW * s.C, panels = (s.O + NR - 1) / NR;
  std::vector<float> x(s.N * s.C * s.H * s.W), wp(panels * K * NR, 0.0f), bias(s.N * s.O);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (size_t i = 0; i < wp.size(); ++i) wp[i] = (float)((i * 3) % 7) - 3.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = (float)((i * 5) % 9) - 4.0f;
  const aotc_conv_strides xs = nchw_input ? aotc_conv_strides{0, s.C * s.H * s.W, s.H * s.W, s.W, 1}
                                          : aotc_conv_strides{0, s.C * s.H * s.W, 1, s.W * s.C, s.C};
  std::vector<float> want(s.N * P * s.O, -1.0f), got(want), res(want.size());
  for (size_t i = 0; i < res.size(); ++i) res[i] = residual ? (float)((i * 11) % 7) - 3.0f : 0.0f;
  const aotc_conv_clamp<float> fin{bias.data(), s.O, 0.0f, 6.0f};
  aotc_conv2d_packed<float, NV, STEP>(s, x.data(), xs, wp.data(),
                                      [&](int64_t n, int64_t p0, int64_t pb, int64_t o0, int64_t ob, const float* t, int64_t ldt) {
                                        for (int64_t p = p0; p < p0 + pb; ++p)
                                          for (int64_t oc = o0; oc < o0 + ob; ++oc) {
                                            const float v = t[(p - p0) * ldt + oc - o0] + bias[n * s.O + oc] +
                                                            res[(n * P + p) * s.O + oc];
                                            want[(n * P + p) * s.O + oc] = v < 0 ? 0 : (v > 6 ? 6 : v);
                                          }
                                      });
  aotc_conv2d_packed<float, NV, STEP>(s, x.data(), xs, wp.data(),
                                      aotc_conv_out<float>{got.data(), fin, P, s.O, residual ? res.data() : NULL});
  int fails = 0;
  for (size_t i = 0; i < want.size(); ++i) fails += got[i] != want[i];
  return fails;
}

// aotc_conv_dw_row2 (two output rows at once) against aotc_conv_dw_row a row at a time, bit for bit, on
// fractional data (a change in the order of the products shows): input rows outside the image (NULL) at
// either end, rows shorter than a block, odd channels (the one-pixel loop), padding 0-2, with and without a
// register epilogue.
static int aotc_conv_check_dw_row2(int64_t W, int64_t C, int64_t pw, int64_t sh, bool fin_on) {
  const int64_t OW = (W + 2 * pw - 3) / sh + 1, n_in = 3 + sh;
  const aotc_conv_shape s{1, C, 8, W, C, 3, 3, 8, OW, sh, sh, 1, pw, 1, 1, C};
  std::vector<float> x(n_in * W * C), w(9 * C), bias(C);
  uint32_t r = 777;
  for (auto* v : {&x, &w, &bias})
    for (float& f : *v) f = (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
  const aotc_conv_clamp<float> fin{bias.data(), 0, -0.25f, 0.25f};
  int fails = 0;
  for (int nulls = 0; nulls < 3; ++nulls) {  // none, the first, the last input row outside the image
    const float* rows[6];
    for (int64_t i = 0; i < n_in; ++i) rows[i] = x.data() + i * W * C;
    if (nulls == 1) rows[0] = NULL;
    if (nulls == 2) rows[n_in - 1] = NULL;
    const int64_t ldt = C + 3;
    std::vector<float> want(2 * OW * ldt, -9.0f), got(want);
    for (int64_t j = 0; j < 2; ++j)
      aotc_conv_dw_row<float, 3>(s, rows + j * sh, C, w.data(), 0, C, want.data() + j * OW * ldt, ldt, fin_on ? &fin : NULL);
    aotc_conv_dw_row2<float>(s, rows, C, w.data(), 0, C, got.data(), got.data() + OW * ldt, ldt, fin_on ? &fin : NULL);
    if (memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) {
      printf("aotc_conv_dw_row2 W=%ld C=%ld pw=%ld stride %ld fin %d nulls %d: differs\n", (long)W, (long)C, (long)pw,
             (long)sh, (int)fin_on, nulls);
      ++fails;
    }
  }
  return fails;
}

int main() {
  int fails = 0;
  fails += aotc_conv_check({2, 6, 9, 11, 4, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 2});  // grouped, strided, padded
  fails += aotc_conv_check({2, 4, 7, 7, 8, 3, 3, 3, 3, 1, 1, 0, 0, 2, 2, 4});   // depthwise x2, dilated
  fails += aotc_conv_check({1, 8, 5, 5, 3, 1, 1, 5, 5, 1, 1, 0, 0, 1, 1, 1});   // 1x1
  // the output written from the registers (aotc_conv_out): a MobileNetV2-like stem over NCHW input, a
  // ResNet-like 3x3 (its sliding kernel), more rows than a band; channels off the panels and a 1x1 take tiles
  fails += aotc_conv_check_out<2, 6>({2, 3, 13, 30, 32, 3, 3, 7, 15, 2, 2, 1, 1, 1, 1, 1}, true);
  fails += aotc_conv_check_out<1, 16>({2, 16, 9, 40, 32, 3, 3, 9, 40, 1, 1, 1, 1, 1, 1, 1}, false);
  fails += aotc_conv_check_out<2, 24>({1, 24, 6, 31, 64, 3, 3, 3, 16, 2, 2, 1, 1, 1, 1, 1}, false);
  fails += aotc_conv_check_out<2, 6>({2, 3, 13, 30, 20, 3, 3, 7, 15, 2, 2, 1, 1, 1, 1, 1}, true);
  fails += aotc_conv_check_out<2>({1, 8, 5, 5, 40, 1, 1, 5, 5, 1, 1, 0, 0, 1, 1, 1}, false);
  fails += aotc_conv_check_out<2, 24>({1, 24, 6, 31, 64, 3, 3, 3, 16, 2, 2, 1, 1, 1, 1, 1}, false, true);  // + a residual
  for (int nchw = 0; nchw < 2; ++nchw) {
    fails += aotc_conv_check_nhwc<1>({2, 6, 9, 11, 20, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1}, nchw);  // strided, padded
    fails += aotc_conv_check_nhwc<2>({2, 5, 9, 11, 40, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<2>({1, 8, 5, 5, 3, 1, 1, 5, 5, 1, 1, 0, 0, 1, 1, 1}, nchw);    // 1x1
    fails += aotc_conv_check_nhwc<2>({1, 24, 7, 7, 40, 1, 1, 7, 7, 1, 1, 0, 0, 1, 1, 1}, nchw);  // 1x1, 49 pixels
    fails += aotc_conv_check_nhwc<2>({1, 80, 7, 7, 700, 1, 1, 7, 7, 1, 1, 0, 0, 1, 1, 1}, nchw);  // ... channels split first
    fails += aotc_conv_check_nhwc<2>({2, 24, 5, 6, 40, 1, 1, 5, 6, 1, 1, 0, 0, 1, 1, 1}, nchw);  // ... 30 (a half strip)
    fails += aotc_conv_check_nhwc<1>({2, 5, 1, 11, 9, 1, 1, 1, 11, 1, 1, 0, 0, 1, 1, 1}, nchw);   // ... 11
    fails += aotc_conv_check_nhwc<1>({1, 7, 12, 10, 9, 3, 3, 4, 3, 3, 3, 2, 1, 2, 2, 1}, nchw);  // dilated
    // row taps (strips inside the image horizontally) next to per-tap strips at the borders
    fails += aotc_conv_check_nhwc<1>({2, 3, 13, 11, 16, 3, 3, 13, 11, 1, 1, 1, 1, 1, 1, 1}, nchw);  // a stem
    fails += aotc_conv_check_nhwc<1>({1, 3, 23, 21, 13, 7, 7, 12, 11, 2, 2, 3, 3, 1, 1, 1}, nchw);  // 7x7/2
    fails += aotc_conv_check_nhwc<2>({1, 4, 6, 4, 20, 5, 5, 6, 4, 1, 1, 2, 2, 1, 1, 1}, nchw);     // no inside
    fails += aotc_conv_check_nhwc<2>({2, 17, 9, 30, 24, 3, 5, 7, 26, 1, 1, 0, 0, 1, 1, 1}, nchw);  // unpadded
    fails += aotc_conv_check_nhwc<1>({2, 3, 5, 40, 16, 3, 3, 5, 40, 1, 1, 1, 1, 1, 1, 1}, nchw);    // whole-row strips
    fails += aotc_conv_check_nhwc<1>({1, 5, 7, 70, 11, 3, 3, 4, 35, 2, 2, 1, 1, 1, 1, 1}, nchw);    // ... strided
    // the row kernel (STEP = sw * C): strips of MR, MR / 2, MR / 4 and overlapping tails, border pixels one by one
    fails += aotc_conv_check_nhwc<1, 3>({2, 3, 7, 60, 16, 3, 3, 7, 60, 1, 1, 1, 1, 1, 1, 1}, nchw);    // a stem
    fails += aotc_conv_check_nhwc<1, 10>({1, 5, 9, 70, 11, 3, 3, 5, 35, 2, 2, 1, 1, 1, 1, 1}, nchw);   // stride 2
    fails += aotc_conv_check_nhwc<1, 6>({1, 3, 23, 61, 13, 7, 7, 12, 31, 2, 2, 3, 3, 1, 1, 1}, nchw);  // 7x7/2
    fails += aotc_conv_check_nhwc<2, 17>({2, 17, 9, 30, 40, 3, 5, 7, 26, 1, 1, 0, 0, 1, 1, 1}, nchw);  // unpadded
    fails += aotc_conv_check_nhwc<1, 7>({1, 7, 12, 40, 9, 3, 3, 12, 40, 1, 1, 2, 1, 2, 1, 1}, nchw);   // dilated rows
    fails += aotc_conv_check_nhwc<2, 32>({2, 16, 10, 60, 32, 1, 1, 5, 30, 2, 2, 0, 0, 1, 1, 1}, nchw); // 1x1/2
    fails += aotc_conv_check_nhwc<1, 4>({1, 4, 5, 40, 16, 3, 3, 9, 40, 1, 1, 3, 1, 1, 1, 1}, nchw);    // rows of zeros
    fails += aotc_conv_check_nhwc<2, 12>({2, 6, 9, 11, 20, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1}, nchw);    // too narrow
    fails += aotc_conv_check_nhwc<2, 9>({1, 9, 6, 29, 70, 3, 3, 6, 29, 1, 1, 1, 1, 1, 1, 1}, nchw);    // 3 panels
    // the sliding 3-wide row kernel (panels of one or two vectors, stride 1, STEP = C): padded and not,
    // fewer outputs than a vector, kernel rows clipped at the top and bottom, two panels
    fails += aotc_conv_check_nhwc<1, 16>({1, 16, 6, 50, 13, 3, 3, 6, 50, 1, 1, 1, 1, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<1, 5>({2, 5, 7, 45, 16, 3, 3, 5, 43, 1, 1, 0, 0, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<2, 16>({1, 16, 6, 50, 29, 3, 3, 6, 50, 1, 1, 1, 1, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<2, 3>({2, 3, 7, 45, 70, 3, 3, 5, 43, 1, 1, 0, 0, 1, 1, 1}, nchw);
    // 4-vector panels (AVX2's 32 channels): passes of fewer vectors where the accumulators would spill
    fails += aotc_conv_check_nhwc<4, 9>({1, 9, 6, 29, 70, 3, 3, 6, 29, 1, 1, 1, 1, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<4>({2, 6, 9, 11, 40, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1}, nchw);
    // border pixels batched across the rows of a task (enough of them to fill half a block)
    fails += aotc_conv_check_nhwc<2, 10>({2, 10, 14, 28, 40, 3, 3, 14, 28, 1, 1, 1, 1, 1, 1, 1}, nchw);
    fails += aotc_conv_check_nhwc<1, 6>({1, 6, 10, 30, 20, 5, 5, 10, 30, 1, 1, 2, 2, 1, 1, 1}, nchw);
  }
  fails += aotc_conv_check_nhwc<1>({2, 37, 9, 11, 37, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 37}, false);  // depthwise
  fails += aotc_conv_check_nhwc<1>({1, 24, 7, 7, 24, 3, 3, 7, 7, 1, 1, 1, 1, 1, 1, 24}, false);
  fails += aotc_conv_check_nhwc<1>({1, 5, 7, 7, 5, 5, 5, 3, 3, 2, 2, 2, 2, 1, 1, 5}, false);
  fails += aotc_conv_check_nhwc<1>({1, 32, 9, 5, 32, 3, 3, 7, 3, 1, 1, 0, 0, 1, 1, 32}, false);  // rows < a block
  fails += aotc_conv_check_nhwc<1>({2, 48, 6, 20, 48, 3, 3, 6, 20, 1, 1, 2, 2, 2, 2, 48}, false);  // dilated
  // 3x3 at stride 2 (conv_depthwise.h's aotc_conv_dw3s2_row): a row shorter than a block, odd channels;
  // an odd width (the last tap outside the row) and a last block overlapping; interior blocks; unpadded;
  // stride 2 across only; padding 2; dilated rows
  fails += aotc_conv_check_nhwc<1>({1, 37, 14, 14, 37, 3, 3, 7, 7, 2, 2, 1, 1, 1, 1, 37}, false);
  fails += aotc_conv_check_nhwc<1>({2, 48, 15, 33, 48, 3, 3, 8, 17, 2, 2, 1, 1, 1, 1, 48}, false);
  fails += aotc_conv_check_nhwc<1>({1, 64, 9, 80, 64, 3, 3, 5, 40, 2, 2, 1, 1, 1, 1, 64}, false);
  fails += aotc_conv_check_nhwc<1>({1, 16, 9, 21, 16, 3, 3, 4, 10, 2, 2, 0, 0, 1, 1, 16}, false);
  fails += aotc_conv_check_nhwc<1>({1, 20, 6, 18, 20, 3, 3, 6, 9, 1, 2, 1, 1, 1, 1, 20}, false);
  fails += aotc_conv_check_nhwc<1>({1, 8, 7, 9, 8, 3, 3, 5, 6, 2, 2, 2, 2, 1, 1, 8}, false);
  fails += aotc_conv_check_nhwc<1>({1, 16, 11, 20, 16, 3, 3, 5, 10, 2, 2, 1, 1, 2, 1, 16}, false);
  for (int64_t W : {1, 2, 7, 14, 19, 56})
    for (int64_t C : {16, 37, 64})
      for (int64_t pw = 0; pw < 3; ++pw)
        for (int64_t sh = 1; sh < 3; ++sh)
          if (W + 2 * pw >= 3) fails += aotc_conv_check_dw_row2(W, C, pw, sh, W % 2 == 0);
  return fails != 0;
}
#endif

#endif  // AOTC_CONV_H
