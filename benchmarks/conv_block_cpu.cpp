// A/B of cpp_templates/conv_dw.h: MobileNetV2's inverted-residual blocks (batch 1) as the three kernels
// they replace (aotc_conv2d_packed, aotc_conv2d_dw, aotc_conv2d_packed, full-size intermediate tensors)
// against aotc_conv_block, interleaved in one process; min over repetitions of the calling thread's CPU
// time (and of wall time); [...] = the three kernels' own times. Bias + ReLU6 epilogues, fp32.
//
//   g++ -std=c++17 -fopenmp -O3 -march=native -Icpp_templates benchmarks/conv_block_cpu.cpp -o /tmp/bb
//   /tmp/bb [threads=1] [reps=30]        (-march=x86-64-v3: the AVX2 code)
//   env: WHICH=1|2|3 one shape only; ONLY_BLOCK=1 time nothing else (for perf record); LAMBDA=1 the
//        block's first two epilogues as lambdas over rows instead of aotc_conv_clamp in registers.
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
int main(int argc, char** argv) {
  aotc_pool_set_threads(argc > 1 ? atoi(argv[1]) : 1);
  int reps = argc > 2 ? atoi(argv[2]) : 30;
  const char* which = getenv("WHICH");
  if (which && atoi(which) == 1) { run<2, 1, 32, 32>(32, 112, 32, 16, 1, reps); return 0; }
  if (which && atoi(which) == 2) { run<2, 2, 16, 96>(16, 112, 96, 24, 2, reps); return 0; }
  if (which && atoi(which) == 3) { run<2, 2, 24, 144>(24, 56, 144, 24, 1, reps); return 0; }
  run<2, 1, 32, 32>(32, 112, 32, 16, 1, reps);
  run<2, 2, 16, 96>(16, 112, 96, 24, 2, reps);
  run<2, 2, 24, 144>(24, 56, 144, 24, 1, reps);
  run<2, 2, 24, 144>(24, 56, 144, 32, 2, reps);
  run<2, 2, 32, 192>(32, 28, 192, 32, 1, reps);
  run<2, 2, 32, 192>(32, 28, 192, 64, 2, reps);
  run<2, 2, 64, 384>(64, 14, 384, 64, 1, reps);
  run<2, 2, 64, 384>(64, 14, 384, 96, 1, reps);
  run<2, 2, 96, 576>(96, 14, 576, 96, 1, reps);
  run<2, 2, 96, 576>(96, 14, 576, 160, 2, reps);
  run<2, 2, 160, 960>(160, 7, 960, 160, 1, reps);
  run<2, 2, 160, 960>(160, 7, 960, 320, 1, reps);
}
