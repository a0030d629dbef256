// Winograd convolution F(M x M, 3 x 3) for dense 3x3 convs at stride 1, dilation 1, one group, over
// channels-last fp32 input, with the packed conv's epilogue contract (conv.h):
//
//   aotc_conv2d_wino<T, M, NV, CIN>(s, x, xs, wp, epi)   epi(n, p0, pb, oc0, ocb, tile, ldt) with
//                          Acc(n, oc, p) = tile[(p - p0) * ldt + (oc - oc0)], p = oh * OW + ow.
//
// M = 4 (6 x 6 input tiles, 36 positions: 4x fewer multiplies than the direct conv) or 2 (4 x 4 tiles, 16
// positions, 2.25x). The weight is transformed at build time (aot/codegen/cpp_pack.py): U = G g G^T per
// (output, input channel), packed like the direct conv's weight into panels [ceil(O / NR)][A * A * C][NR]
// with k = pos * C + c (pos = row * A + column of the A x A transformed tile), NR = NV vectors. CIN = C.
// One task is (image, band of output rows, block of output channels), on the pool the other kernels use;
// its tiles go in groups: a group's input tiles are transformed into V[pos][tile][CP] (CP: C rounded up
// to a vector; the channels are the vector lanes), one small GEMM per position multiplies them into
// Mt[pos][tile][NB] (a register-blocked micro-kernel whose broadcasts sit at compile-time offsets of one
// pointer), and the output transform writes the group's pixels into the band's tile, which the epilogue
// reads once at the end -- or, with conv.h's aotc_conv_out (a clamp into dense channels-last, all O channels
// in the task), straight into the output through the clamp. Groups keep V and Mt near L1 (AOTC_WINO_BYTES) but hold enough tiles to amortise
// reading U; bands keep their output tile in L2 (AOTC_WINO_BAND_BYTES).
// Points 0, +-1, +-2 and infinity (Lavin & Gray). fp32 errors: about 1e-6 of an output's sum of |products|
// for F(4x4) (some 10x the direct conv's), 1e-7 for F(2x2) (the self-test below; tests/test_cpp_conv.py
// checks whole models against eager torch).
// Input in another layout or dtype is copied to channels-last first, as aotc_conv2d_packed does.
#ifndef AOTC_CONV_WINO_H
#define AOTC_CONV_WINO_H

#include "conv.h"

#ifndef AOTC_WINO_BYTES
#define AOTC_WINO_BYTES (64 * 1024)  // transformed input and products of one group of tiles at most
#endif
#ifndef AOTC_WINO_BAND_BYTES
#define AOTC_WINO_BAND_BYTES (256 * 1024)  // the output tile of one task (a band of rows) at most
#endif

static inline int64_t aotc_wino_max(int64_t a, int64_t b) { return a > b ? a : b; }

// The 1-D transforms of F(M, 3): input B^T d (A values in, A out) and output A^T m (A in, M out).
template <int M>
struct aotc_wino_tf;

// k * a + c with one rounding: explicit, as the packages build with -ffp-contract=off.
template <class V>
static inline V aotc_wino_fma(V a, float k, V c) {
  return aotc_vfma(a, V{} + k, c);
}

template <>
struct aotc_wino_tf<4> {
  static constexpr int A = 6;
  template <class V>
  static inline void in(const V* d, V* t, int sd, int st) {
    const V d0 = d[0], d1 = d[sd], d2 = d[2 * sd], d3 = d[3 * sd], d4 = d[4 * sd], d5 = d[5 * sd];
    const V a = aotc_wino_fma(d2, -4.0f, d4), b = aotc_wino_fma(d1, -4.0f, d3), c = d4 - d2, e = d3 - d1;
    t[0] = aotc_wino_fma(d0, 4.0f, aotc_wino_fma(d2, -5.0f, d4));
    t[st] = a + b;
    t[2 * st] = a - b;
    t[3 * st] = aotc_wino_fma(e, 2.0f, c);
    t[4 * st] = aotc_wino_fma(e, -2.0f, c);
    t[5 * st] = aotc_wino_fma(d1, 4.0f, aotc_wino_fma(d3, -5.0f, d5));
  }
  template <class V>
  static inline void out(const V* m, V* o, int sm, int so) {
    const V s1 = m[sm] + m[2 * sm], d1 = m[sm] - m[2 * sm], s2 = m[3 * sm] + m[4 * sm], d2 = m[3 * sm] - m[4 * sm];
    o[0] = m[0] + s1 + s2;
    o[so] = aotc_wino_fma(d2, 2.0f, d1);
    o[2 * so] = aotc_wino_fma(s2, 4.0f, s1);
    o[3 * so] = aotc_wino_fma(d2, 8.0f, d1 + m[5 * sm]);
  }
};

template <>
struct aotc_wino_tf<2> {
  static constexpr int A = 4;
  template <class V>
  static inline void in(const V* d, V* t, int sd, int st) {
    const V d0 = d[0], d1 = d[sd], d2 = d[2 * sd], d3 = d[3 * sd];
    t[0] = d0 - d2;
    t[st] = d1 + d2;
    t[2 * st] = d2 - d1;
    t[3 * st] = d1 - d3;
  }
  template <class V>
  static inline void out(const V* m, V* o, int sm, int so) {
    o[0] = m[0] + m[sm] + m[2 * sm];
    o[so] = m[sm] - m[2 * sm] - m[3 * sm];
  }
};

// R x (NV of the panel's NVP vectors) block of one position's GEMM: c[i][:] += sum over k < C of
// a[i * CP + k] * b[k * NR + :]. Rows CP apart and C known at compile time: every broadcast is one load at
// a fixed offset from one pointer.
template <class T, int MR, int NV, int NVP, int CP, int C>
static inline void aotc_wino_micro_part(const T* a, const T* __restrict b, T* c, int64_t ldc) {
  typedef typename aotc_mm_vec<T>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), NR = NVP * L;
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
#pragma GCC unroll 2
  for (int k = 0; k < C; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) memcpy(&bv[j], b + k * NR + j * L, sizeof(V));
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const V av = aotc_vset1(a[i * CP + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = aotc_vfma(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) aotc_mm_store_row<T, NV>(c + i * ldc, acc[i]);
}

template <class T, int MR, int NV, int CP, int C>
static inline void aotc_wino_micro(const T* a, const T* __restrict b, T* c, int64_t ldc) {
  constexpr int L = (int)(sizeof(typename aotc_mm_vec<T>::type) / sizeof(T)), NH = aotc_conv_split<MR, NV>::value;
  for (int j0 = 0; j0 < NV; j0 += NH) aotc_wino_micro_part<T, MR, NH, NV, CP, C>(a, b + j0 * L, c + j0 * L, ldc);
}

// Channels [c, c + n) of one pixel as a vector, zero past n (n <= L).
template <class T, class V>
static inline V aotc_wino_load(const T* p, int64_t n) {
  V v;
  if (n == (int64_t)(sizeof(V) / sizeof(T))) {
    memcpy(&v, p, sizeof(V));
  } else {
    v = V{};
    memcpy(&v, p, (size_t)n * sizeof(T));
  }
  return v;
}

template <class T, int M, int NV, int CIN, class SX, class Epi>
void aotc_conv2d_wino(const aotc_conv_shape& s, const SX* x, aotc_conv_strides xs, const T* wp, Epi epi) {
  typedef typename aotc_mm_vec<T>::type V;
  typedef aotc_wino_tf<M> TF;
  constexpr int L = (int)(sizeof(V) / sizeof(T)), NR = NV * L, A = TF::A, AA = A * A;
  constexpr int CP = (CIN + L - 1) / L * L, MR = aotc_conv_mr<NV>::value;
  constexpr int MR2 = MR / 2 > 0 ? MR / 2 : 1, MR4 = MR / 4 > 0 ? MR / 4 : 1;
  static_assert(CIN > 0, "the input channels are a compile-time constant");
  if (s.N <= 0 || s.O <= 0 || s.OH <= 0 || s.OW <= 0) return;
  if (s.C != CIN || s.KH != 3 || s.KW != 3 || s.sh != 1 || s.sw != 1 || s.dh != 1 || s.dw != 1 || s.G != 1) abort();
  if (xs.s1 != 1 || xs.s3 != s.C || !std::is_same<SX, T>::value) {  // not dense channels-last: copy it once
    aotc_conv2d_wino<T, M, NV, CIN>(s, aotc_conv_nhwc<T>(s, x, xs), aotc_conv_dense(s), wp, epi);
    return;
  }
  const T* xt = (const T*)(const void*)x;
  const int64_t TW = (s.OW + M - 1) / M, TH = (s.OH + M - 1) / M;
  int64_t NB = aotc_mm_min(aotc_roundup(s.O, NR), 8 * NR);
  // Tile rows per band: as many as keep the band's output tile within AOTC_WINO_BAND_BYTES, then fewer
  // until each thread has a few tasks; then output channel blocks.
  int64_t TR = aotc_wino_max(AOTC_WINO_BAND_BYTES / (M * s.OW * NB * (int64_t)sizeof(T)), 1);
  TR = aotc_mm_min(TR, TH);
  const double flops = 2.0 * (double)s.N * (double)(TH * TW) * AA * (double)s.C * (double)s.O;
  const int64_t want = aotc_mm_min(aotc_pool_threads(), (int64_t)(flops / AOTC_MM_FLOPS_PER_THREAD)) * 3;
  auto ntasks = [&]() { return s.N * ((TH + TR - 1) / TR) * ((s.O + NB - 1) / NB); };
  while (TR > 1 && ntasks() < want) TR = (TR + 1) / 2;
  while (NB > NR && ntasks() < want) NB = aotc_roundup(NB / 2, NR);
  const int64_t bands = (TH + TR - 1) / TR, oblocks = (s.O + NB - 1) / NB, tasks = ntasks();
  // An aotc_conv_out epilogue (conv.h) over all O channels in one block of whole panels: the output
  // transform writes the output through its clamp, with no band tile and no epilogue pass.
  constexpr bool OUT = aotc_conv_is_out<T, Epi>::value;
  const bool direct = OUT && oblocks == 1 && s.O % NR == 0;
  // Tiles per group: V and Mt of a group within AOTC_WINO_BYTES, but at least 2 C NB / (C + NB) -- each
  // group reads the whole U of its channel block once, and with fewer tiles than that those reads outweigh
  // V's and Mt's (128 channels in groups of 3 tiles ran at half the speed of whole bands); a multiple of
  // MR (of MR / 4 when the band has fewer tiles), the band's tiles at most.
  const int64_t tile_bytes = (int64_t)AA * (CP + NB) * (int64_t)sizeof(T);
  int64_t G = aotc_wino_max(AOTC_WINO_BYTES / tile_bytes, 2 * s.C * NB / (s.C + NB));
  G = G >= MR ? aotc_roundup(G, MR) : aotc_roundup(aotc_wino_max(G, 1), MR4);
  G = aotc_mm_min(G, aotc_roundup(TR * TW, MR4));
  const bool nested = aotc_conv_nested();
  const int nthreads = nested ? 1 : aotc_mm_threads(flops, tasks);
  // Position strides of V and Mt: an odd number of cache lines, so that the A * A rows of one tile do not
  // fall into a few cache sets (strides of a multiple of 1 KiB put the 36 in four).
  constexpr int64_t LINE = 64 / (int64_t)sizeof(T);
  auto odd_lines = [&](int64_t e) { e = aotc_roundup(e, LINE); return e / LINE % 2 ? e : e + LINE; };
  const int64_t vps = odd_lines(G * CP), mps = odd_lines(G * NB);
  const int64_t vsz = AA * vps, msz = AA * mps, osz = TR * M * s.OW * NB;
  const int64_t per = aotc_roundup(vsz + msz + osz, LINE);
  const aotc_conv_bufs<T> bufs(per, nthreads, 1, nested);
  T* const ws_all = bufs.ws;
  aotc_pool_run(tasks, nthreads, [&](int64_t task, int slot) {
    // Locals, not the captures: the stores below could alias what a reference points at, and every
    // address would reload its stride through the closure.
    const int64_t vps_ = vps, mps_ = mps, OW = s.OW, H = s.H, W = s.W, sxh = xs.s2;
    const int64_t tw = TW, nb = NB, gs = G, ph = s.ph, pw = s.pw;
    T* const vb = ws_all + (int64_t)slot * per;
    T* const mb = vb + vsz;
    T* const ob = mb + msz;
    const int64_t n = task / (bands * oblocks), band = task / oblocks % bands, oi = task % oblocks;
    const int64_t th0 = band * TR, ntr = aotc_mm_min(TH - th0, TR), nt = ntr * tw;
    const int64_t oh0 = th0 * M, rows = aotc_mm_min(s.OH - oh0, ntr * M);
    const int64_t o0 = oi * nb, obw = aotc_mm_min(s.O - o0, nb), nbp = aotc_roundup(obw, NR);
    const T* xn = xt + xs.off + n * xs.s0;
    T* out = ob;  // pixel (oh0 + r, ow) at out[(r * OW + ow) * nbp + :]
    const aotc_conv_clamp<T>* fin = NULL;
    const T* bias = NULL;
    int64_t rd = 0;  // the residual's offset from the output, with one (each pixel is written once: it may be the output)
    bool res = false;
    if constexpr (OUT) {
      if (direct) {  // nbp == O: the output's own layout
        out = epi.out + (n * epi.P + oh0 * OW) * s.O;
        fin = &epi.fin;
        bias = epi.fin.bias != NULL ? epi.fin.bias + n * epi.fin.bias_n : NULL;
        res = epi.res != NULL;
        rd = res ? (int64_t)(epi.res - epi.out) : 0;
      }
    }
    auto put = [&](T* at, V v, int64_t j) {  // j: the vector's first channel in the block
      if constexpr (OUT) {
        if (fin != NULL)
          return aotc_conv_store<T, 1, true>(at, &v, fin, bias != NULL ? bias + j : NULL, res ? at + rd : NULL);
      }
      memcpy(at, &v, sizeof(V));
    };
    for (int64_t g0 = 0; g0 < nt; g0 += gs) {
      const int64_t ng = aotc_mm_min(gs, nt - g0), ngp = aotc_roundup(ng, MR4);
      // Input transform: tile t = (tr, tw) reads input rows oh0 + tr * M - ph + [0, A), columns tw * M - pw + [0, A).
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t t = g0 + g, ih0 = oh0 + (t / tw) * M - ph, iw0 = (t % tw) * M - pw;
        const bool inside = ih0 >= 0 && ih0 + A <= H && iw0 >= 0 && iw0 + A <= W;
        for (int64_t c = 0; c < CP; c += L) {
          const int64_t nc = aotc_mm_min((int64_t)CIN - c, (int64_t)L);
          V d[AA], u[AA];
          if (inside && nc == L) {
#pragma GCC unroll 8
            for (int i = 0; i < A; ++i)
#pragma GCC unroll 8
              for (int j = 0; j < A; ++j) memcpy(&d[i * A + j], xn + (ih0 + i) * sxh + (iw0 + j) * CIN + c, sizeof(V));
          } else {
            for (int i = 0; i < A; ++i)
              for (int j = 0; j < A; ++j) {
                const int64_t ih = ih0 + i, iw = iw0 + j;
                d[i * A + j] = ih >= 0 && ih < H && iw >= 0 && iw < W
                                   ? aotc_wino_load<T, V>(xn + ih * sxh + iw * CIN + c, nc)
                                   : V{};
              }
          }
#pragma GCC unroll 8
          for (int j = 0; j < A; ++j) TF::in(d + j, u + j, A, A);  // columns: u = B^T d
#pragma GCC unroll 8
          for (int i = 0; i < A; ++i) TF::in(u + i * A, d + i * A, 1, 1);  // rows: d = u B
          T* dst = vb + g * CP + c;
#pragma GCC unroll 36
          for (int p = 0; p < AA; ++p) memcpy(dst + p * vps_, &d[p], sizeof(V));
        }
      }
      for (int64_t g = ng; g < ngp; ++g)  // padded rows the last strip reads: zeros, not stale NaNs
        for (int p = 0; p < AA; ++p) memset(vb + p * vps_ + g * CP, 0, sizeof(T) * CP);
      // One GEMM per position: Mt[p][g][:] = V[p][g][:] x U[p] over this block's panels, in strips of MR
      // tiles (the last ones MR / 2 or MR / 4).
      for (int p = 0; p < AA; ++p) {
        const T* vp = vb + p * vps_;
        T* mp = mb + p * mps_;
        for (int64_t js = 0; js < nbp; js += NR) {
          const T* bp = wp + ((o0 + js) / NR) * AA * CIN * NR + p * CIN * NR;
          int64_t g = 0;
          for (; g + MR <= ngp; g += MR) aotc_wino_micro<T, MR, NV, CP, CIN>(vp + g * CP, bp, mp + g * nb + js, nb);
          for (; g + MR2 <= ngp; g += MR2) aotc_wino_micro<T, MR2, NV, CP, CIN>(vp + g * CP, bp, mp + g * nb + js, nb);
          for (; g < ngp; g += MR4) aotc_wino_micro<T, MR4, NV, CP, CIN>(vp + g * CP, bp, mp + g * nb + js, nb);
        }
      }
      // Output transform into the band's tile: pixel (oh0 + r, ow) at ob[(r * OW + ow) * nbp + :].
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t t = g0 + g, r0 = (t / tw) * M, w0 = (t % tw) * M;
        const int64_t mr = aotc_mm_min((int64_t)M, rows - r0), mc = aotc_mm_min((int64_t)M, OW - w0);
        for (int64_t j = 0; j < nbp; j += L) {
          V m[AA], u[M * A], o[M * M];
          const T* src = mb + g * nb + j;
#pragma GCC unroll 36
          for (int p = 0; p < AA; ++p) memcpy(&m[p], src + p * mps_, sizeof(V));
#pragma GCC unroll 8
          for (int c = 0; c < A; ++c) TF::out(m + c, u + c, A, A);  // columns: u = A^T m (M x A)
#pragma GCC unroll 8
          for (int r = 0; r < M; ++r) TF::out(u + r * A, o + r * M, 1, 1);  // rows: o = u A (M x M)
          T* dst = out + (r0 * OW + w0) * nbp + j;
          if (mr == M && mc == M) {
#pragma GCC unroll 4
            for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
              for (int c = 0; c < M; ++c) put(dst + (r * OW + c) * nbp, o[r * M + c], j);
          } else {
            for (int64_t r = 0; r < mr; ++r)
              for (int64_t c = 0; c < mc; ++c) put(dst + (r * OW + c) * nbp, o[r * M + c], j);
          }
        }
      }
    }
    if (!direct) epi(n, oh0 * s.OW, rows * s.OW, o0, obw, (const T*)ob, nbp);
  });
}

#ifdef AOTC_SELFTEST_CONV_WINO
// g++ -DAOTC_SELFTEST_CONV_WINO -x c++ conv_wino.h: a 3x3 conv through each tile size against a naive loop.
#include <stdio.h>

template <int M, int C>
static int aotc_wino_selftest(int64_t N, int64_t H, int64_t W, int64_t O, int64_t pad) {
  typedef typename aotc_mm_vec<float>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(float)), NR = L, A = M + 2;
  const int64_t OH = H + 2 * pad - 2, OW = W + 2 * pad - 2;
  std::vector<float> x((size_t)(N * H * W * C)), g((size_t)(O * C * 9));
  unsigned st = 12345;
  auto rnd = [&]() { st = st * 1103515245u + 12345u; return (float)((st >> 8) & 0xffff) / 32768.0f - 1.0f; };
  for (auto& v : x) v = rnd();
  for (auto& v : g) v = rnd();
  // U = G g G^T in double, packed [ceil(O / NR)][A * A * C][NR]
  const double G4[6][3] = {{0.25, 0, 0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                           {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
  const double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  const int64_t panels = (O + NR - 1) / NR;
  std::vector<float> wp((size_t)(panels * A * A * C * NR), 0.0f);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) {
          double u = 0;
          for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j)
              u += (M == 4 ? G4[a][i] * G4[b][j] : G2[a][i] * G2[b][j]) * g[(size_t)((o * C + c) * 9 + i * 3 + j)];
          wp[(size_t)(((o / NR) * A * A * C + (a * A + b) * C + c) * NR + o % NR)] = (float)u;
        }
  const aotc_conv_shape s{N, C, H, W, O, 3, 3, OH, OW, 1, 1, pad, pad, 1, 1, 1};
  std::vector<float> y((size_t)(N * OH * OW * O));
  aotc_conv2d_wino<float, M, 1, C>(s, x.data(), aotc_conv_dense(s), wp.data(),
                                   [&](int64_t n, int64_t p0, int64_t pb, int64_t o0, int64_t ob, const float* t, int64_t ldt) {
                                     for (int64_t p = p0; p < p0 + pb; ++p)
                                       for (int64_t o = o0; o < o0 + ob; ++o)
                                         y[(size_t)((n * OH * OW + p) * O + o)] = t[(p - p0) * ldt + (o - o0)];
                                   });
  // The output written through aotc_conv_out (conv.h: a bias per image, a clamp) by the output transform:
  // equal to the clamp of y, where O is whole panels (else through the band's tile).
  std::vector<float> bias((size_t)(N * O)), z(y.size(), -7.0f);
  for (auto& v : bias) v = rnd();
  aotc_conv2d_wino<float, M, 1, C>(s, x.data(), aotc_conv_dense(s), wp.data(),
                                   aotc_conv_out<float>{z.data(), {bias.data(), O, -0.5f, 0.75f}, OH * OW, O});
  int wrong = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float v = y[i] + bias[i / (size_t)(OH * OW * O) * (size_t)O + i % (size_t)O];
    wrong += z[i] != (v < -0.5f ? -0.5f : (v > 0.75f ? 0.75f : v));
  }
  // ... with a residual added before the clamp, in place (the residual is the output buffer itself)
  std::vector<float> r(y.size());
  for (auto& v : r) v = rnd();
  std::vector<float> zr(r);
  aotc_conv2d_wino<float, M, 1, C>(s, x.data(), aotc_conv_dense(s), wp.data(),
                                   aotc_conv_out<float>{zr.data(), {bias.data(), O, -0.5f, 0.75f}, OH * OW, O, zr.data()});
  for (size_t i = 0; i < y.size(); ++i) {
    const float v = (y[i] + bias[i / (size_t)(OH * OW * O) * (size_t)O + i % (size_t)O]) + r[i];
    wrong += zr[i] != (v < -0.5f ? -0.5f : (v > 0.75f ? 0.75f : v));
  }
  if (wrong) printf("aotc_conv_out: %d outputs differ from the clamped tile\n", wrong);
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t o = 0; o < O; ++o) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j) {
                const int64_t ih = oh - pad + i, iw = ow - pad + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const double v = (double)x[(size_t)(((n * H + ih) * W + iw) * C + c)] * g[(size_t)((o * C + c) * 9 + i * 3 + j)];
                ref += v;
                mag += fabs(v);
              }
          const double e = fabs(y[(size_t)(((n * OH + oh) * OW + ow) * O + o)] - ref) / (mag + 1e-30);
          worst = e > worst ? e : worst;
        }
  printf("F(%d,3) C=%d %ldx%ldx%ld O=%ld pad %ld: max error / sum|products| %.3g\n", M, C, (long)N, (long)H, (long)W,
         (long)O, (long)pad, worst);
  return worst < 1e-5 && wrong == 0 ? 0 : 1;
}

int main() {
  int bad = 0;
  bad |= aotc_wino_selftest<4, 5>(2, 9, 11, 7, 1);
  bad |= aotc_wino_selftest<4, 19>(1, 13, 6, 20, 0);
  bad |= aotc_wino_selftest<2, 5>(2, 9, 11, 7, 1);
  bad |= aotc_wino_selftest<2, 16>(1, 30, 17, 3, 0);
  bad |= aotc_wino_selftest<4, 16>(2, 14, 13, 2 * (AOTC_VBYTES / 4), 1);  // whole panels: the output transform writes it
  bad |= aotc_wino_selftest<2, 8>(3, 10, 9, AOTC_VBYTES / 4, 1);
  printf(bad ? "FAIL\n" : "ok\n");
  return bad;
}
#endif

#endif  // AOTC_CONV_WINO_H
