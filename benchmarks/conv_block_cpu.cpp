// A/B of cpp_templates/conv_dw.h: MobileNetV2's inverted-residual blocks (batch 1) as the three kernels
// they replace (aotc_conv2d_packed, aotc_conv2d_dw, aotc_conv2d_packed, full-size intermediate tensors)
// against aotc_conv_block, interleaved in one process, and the stem conv before them; min over repetitions
// of the calling thread's CPU time (and of wall time); [...] = the three kernels' own times. Bias + ReLU6
// epilogues, fp32.
//
//   g++ -std=c++17 -fopenmp -O3 -march=native -Icpp_templates benchmarks/conv_block_cpu.cpp -o /tmp/bb
//   /tmp/bb [threads=1] [reps=30]        (-march=x86-64-v3: the AVX2 code)
//   env: WHICH=0 the stem conv only, WHICH=1..12 one block shape only (every block of the network is one of
//        them); ONLY_BLOCK=1 time nothing else (for perf record); LAMBDA=1 the block's first two epilogues
//        as lambdas over rows instead of aotc_conv_clamp in registers.
#include "conv_dw.h"
#include <stdio.h>
#include <time.h>
#include <algorithm>
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static double wall() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
template <int NVE, int NVP, int CE = 0, int CH = 0>
static void run(int64_t C, int64_t H, int64_t hid, int64_t O, int64_t stride, int reps) {
  constexpr int L = AOTC_VBYTES / 4, NRE = NVE * L, NRP = NVP * L;
  const int64_t N = 1, W = H, OH = (H - 1) / stride + 1, OW = OH;
  const aotc_conv_shape se{N, C, H, W, hid, 1, 1, H, W, 1, 1, 0, 0, 1, 1, 1};
  const aotc_conv_shape sd{N, hid, H, W, hid, 3, 3, OH, OW, stride, stride, 1, 1, 1, 1, hid};
  const aotc_conv_shape sp{N, hid, OH, OW, O, 1, 1, OH, OW, 1, 1, 0, 0, 1, 1, 1};
  std::vector<float> x(N * H * W * C), we((hid + NRE - 1) / NRE * NRE * C, 0.01f), wd(9 * hid, 0.1f);
  std::vector<float> wp((O + NRP - 1) / NRP * NRP * hid, 0.01f), bias(4096, 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)(i % 7) * 0.1f;
  std::vector<float> e(N * H * W * hid), d(N * OH * OW * hid), y(N * OH * OW * O), y2(y.size());
  const aotc_conv_strides xs{0, H * W * C, 1, W * C, C}, es{0, H * W * hid, 1, W * hid, hid};
  const aotc_conv_strides ds{0, OH * OW * hid, 1, OW * hid, hid};
  const float* b = bias.data();
  float *ep = e.data(), *dp = d.data(), *yp = y.data(), *y2p = y2.data();
  double k1 = 1e9, k2 = 1e9, k3 = 1e9, tt;
  auto three = [&]() {
    tt = now();
    aotc_conv2d_packed<float, NVE>(se, x.data(), xs, we.data(), [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
        for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) ep[p * hid + oc] = std::min(std::max(t[(p - p0) * ldt + oc - oc0] + b[oc], 0.0f), 6.0f);
    });
    k1 = std::min(k1, now() - tt); tt = now();
    aotc_conv2d_dw<float>(sd, e.data(), es, wd.data(), [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
        for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) dp[p * hid + oc] = std::min(std::max(t[(p - p0) * ldt + oc - oc0] + b[oc], 0.0f), 6.0f);
    });
    k2 = std::min(k2, now() - tt); tt = now();
    aotc_conv2d_packed<float, NVP>(sp, d.data(), ds, wp.data(), [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
        for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) yp[p * O + oc] = t[(p - p0) * ldt + oc - oc0] + b[oc];
    });
    k3 = std::min(k3, now() - tt);
  };
  auto row = [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt, float* dst) {
    for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) dst[(p - p0) * ldt + oc] = std::min(std::max(t[(p - p0) * ldt + oc - oc0] + b[oc], 0.0f), 6.0f);
  };
  auto block = [&]() {
    static const bool lam = getenv("LAMBDA") != nullptr;
    const aotc_conv_clamp<float> fe{b, 0, 0.0f, 6.0f};
    if (!lam) aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), fe, fe,
      [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
        for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
          for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) y2p[p * O + oc] = t[(p - p0) * ldt + oc - oc0] + b[oc];
      }); else
    aotc_conv_block<float, NVE, NVP, CE, CH>(se, x.data(), xs, we.data(), sd, wd.data(), sp, wp.data(), row, row,
      [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
        for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
          for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) y2p[p * O + oc] = t[(p - p0) * ldt + oc - oc0] + b[oc];
      });
  };
  double ta = 1e9, tb = 1e9, wa = 1e9, wb = 1e9;
  static const bool only_block = getenv("ONLY_BLOCK") != nullptr;
  for (int r = 0; r < reps; ++r) {
    if (only_block) { block(); continue; }
    double t0 = now(), w0 = wall(); three(); ta = std::min(ta, now() - t0); wa = std::min(wa, wall() - w0);
    t0 = now(); w0 = wall(); block(); tb = std::min(tb, now() - t0); wb = std::min(wb, wall() - w0);
  }
  double err = 0;
  for (size_t i = 0; i < y.size(); ++i) err = std::max(err, (double)std::abs(y[i] - y2[i]));
  printf("[%6.1f %6.1f %6.1f] ", k1 * 1e6, k2 * 1e6, k3 * 1e6);
  printf("C=%3ld %3ldx%-3ld hid=%3ld O=%3ld s%ld: three %7.1f us  block %7.1f us  (wall %7.1f / %7.1f)  err %.1e\n", (long)C, (long)H, (long)H, (long)hid,
         (long)O, (long)stride, ta * 1e6, tb * 1e6, wa * 1e6, wb * 1e6, err);
}
// MobileNetV2's stem: 3x3/2 conv of the NCHW 3x224x224 input, 32 channels (the packed implicit GEMM over an
// NHWC copy of the input, as codegen calls it: NR 32, STEP = stride x C), bias + ReLU6 into NHWC. Checked
// against a naive loop.
static void stem(int reps) {
  constexpr int NR = 32, NV = NR * 4 / AOTC_VBYTES;
  const int64_t C = 3, H = 224, O = 32, OH = 112, K = 9 * C;
  const aotc_conv_shape s{1, C, H, H, O, 3, 3, OH, OH, 2, 2, 1, 1, 1, 1, 1};
  std::vector<float> x(C * H * H), w(O * K), wp(K * NR), bias(O), y(OH * OH * O);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)(i % 13) * 0.1f - 0.6f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = (float)(i % 7) * 0.05f - 0.15f;  // [o][c][kh][kw]
  for (int64_t o = 0; o < O; ++o) bias[o] = 0.01f * (float)o;
  for (int64_t o = 0; o < O; ++o)  // packed: [t * C + c][o]
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < 9; ++t) wp[(t * C + c) * NR + o] = w[(o * C + c) * 9 + t];
  const aotc_conv_strides xs{0, C * H * H, H * H, H, 1};
  float* yp = y.data();
  const float* b = bias.data();
  double tb = 1e9, wb = 1e9;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now(), w0 = wall();
    aotc_conv2d_packed<float, NV, 2 * 3>(s, x.data(), xs, wp.data(), [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
      for (int64_t p = p0; p < p0 + pb; ++p)
#pragma omp simd
        for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) yp[p * O + oc] = std::min(std::max(t[(p - p0) * ldt + oc - oc0] + b[oc], 0.0f), 6.0f);
    });
    tb = std::min(tb, now() - t0), wb = std::min(wb, wall() - w0);
  }
  double err = 0;
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OH; ++ow)
      for (int64_t o = 0; o < O; ++o) {
        double acc = bias[o];
        for (int64_t c = 0; c < C; ++c)
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw) {
              const int64_t ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
              if (ih >= 0 && ih < H && iw >= 0 && iw < H) acc += (double)x[(c * H + ih) * H + iw] * w[(o * C + c) * 9 + kh * 3 + kw];
            }
        err = std::max(err, std::abs(std::min(std::max(acc, 0.0), 6.0) - (double)y[(oh * OH + ow) * O + o]));
      }
  printf("stem 3x3/2 C=3 224x224 -> 32 (NCHW in): %7.1f us  (wall %7.1f)  err %.1e\n", tb * 1e6, wb * 1e6, err);
}

int main(int argc, char** argv) {
  aotc_pool_set_threads(argc > 1 ? atoi(argv[1]) : 1);
  const int reps = argc > 2 ? atoi(argv[2]) : 30;
  // WHICH=0: the stem; 1-12: the block shapes below in order (each of MobileNetV2's 17 blocks has one of them)
  const char* which = getenv("WHICH");
  const int only = which != nullptr ? atoi(which) : -1;
  void (*const blocks[])(int) = {
      [](int n) { run<2, 1, 32, 32>(32, 112, 32, 16, 1, n); },
      [](int n) { run<2, 2, 16, 96>(16, 112, 96, 24, 2, n); },
      [](int n) { run<2, 2, 24, 144>(24, 56, 144, 24, 1, n); },
      [](int n) { run<2, 2, 24, 144>(24, 56, 144, 32, 2, n); },
      [](int n) { run<2, 2, 32, 192>(32, 28, 192, 32, 1, n); },
      [](int n) { run<2, 2, 32, 192>(32, 28, 192, 64, 2, n); },
      [](int n) { run<2, 2, 64, 384>(64, 14, 384, 64, 1, n); },
      [](int n) { run<2, 2, 64, 384>(64, 14, 384, 96, 1, n); },
      [](int n) { run<2, 2, 96, 576>(96, 14, 576, 96, 1, n); },
      [](int n) { run<2, 2, 96, 576>(96, 14, 576, 160, 2, n); },
      [](int n) { run<2, 2, 160, 960>(160, 7, 960, 160, 1, n); },
      [](int n) { run<2, 2, 160, 960>(160, 7, 960, 320, 1, n); },
  };
  if (only <= 0) stem(reps);
  for (int i = 0; i < (int)(sizeof(blocks) / sizeof(blocks[0])); ++i)
    if (only < 0 || only == i + 1) blocks[i](reps);
  return 0;
}
