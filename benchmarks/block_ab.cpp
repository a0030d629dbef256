// MobileNetV2's 17 inverted-residual blocks (cpp_templates/conv_dw.h's aotc_conv_block) run in sequence as in
// the model, for benchmarks/cpu_block_ab.py: each block reads the one before's output, its weights its own
// (14 MB in all, streaming from L3 or memory as in a call of the model), register epilogues for the expand
// and the depthwise (bias, ReLU6), the projection's bias and residual through conv.h's aotc_conv_out as codegen
// writes them (-DAOTC_AB_OUT=0: through a lambda over a tile, as codegen writes other epilogues).
//
//   block_ab THREADS REPS  ->  one line per block: "index C H hid O stride median_ms", then "total ms"
//
// Built by cpu_block_ab.py with the package's flags for a CPU level, against one set of templates.
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <vector>

#include "conv_dw.h"

namespace {

struct Block {
  int64_t C, H, hid, O, stride;
};

// torchvision's MobileNetV2 at 224x224: (expand 6 except the first) x (channels, repeats, stride)
const Block kBlocks[] = {{32, 112, 32, 16, 1},  {16, 112, 96, 24, 2},  {24, 56, 144, 24, 1},  {24, 56, 144, 32, 2},
                         {32, 28, 192, 32, 1},  {32, 28, 192, 32, 1},  {32, 28, 192, 64, 2},  {64, 14, 384, 64, 1},
                         {64, 14, 384, 64, 1},  {64, 14, 384, 64, 1},  {64, 14, 384, 96, 1},  {96, 14, 576, 96, 1},
                         {96, 14, 576, 96, 1},  {96, 14, 576, 160, 2}, {160, 7, 960, 160, 1}, {160, 7, 960, 160, 1},
                         {160, 7, 960, 320, 1}};
constexpr int kN = sizeof(kBlocks) / sizeof(kBlocks[0]);
constexpr int L = AOTC_VBYTES / 4, NR = 2 * L;  // two-vector panels, as cpp_pack.py packs these convs

struct Weights {
  std::vector<float> we, wd, wp, be, bd, bp;
};

float rnd() { return (float)rand() / (float)RAND_MAX - 0.5f; }

// CE, CH: the 1x1 convs' input channels at compile time, as codegen passes them
template <int CE, int CH>
void run_block(const Block& b, const Weights& w, const float* x, float* y) {
  const int64_t OH = (b.H - 1) / b.stride + 1, O = b.O;
  const bool res = b.stride == 1 && b.C == b.O;
  const aotc_conv_shape se{1, b.C, b.H, b.H, b.hid, 1, 1, b.H, b.H, 1, 1, 0, 0, 1, 1, 1};
  const aotc_conv_shape sd{1, b.hid, b.H, b.H, b.hid, 3, 3, OH, OH, b.stride, b.stride, 1, 1, 1, 1, b.hid};
  const aotc_conv_shape sp{1, b.hid, OH, OH, b.O, 1, 1, OH, OH, 1, 1, 0, 0, 1, 1, 1};
  const aotc_conv_strides xs{0, b.H * b.H * b.C, 1, b.H * b.C, b.C};
  const aotc_conv_clamp<float> fe{w.be.data(), 0, 0.0f, 6.0f}, fd{w.bd.data(), 0, 0.0f, 6.0f};
  const float* bp = w.bp.data();
  auto epi_p = [&](int64_t, int64_t p0, int64_t pb, int64_t oc0, int64_t ocb, const float* t, int64_t ldt) {
    for (int64_t p = p0; p < p0 + pb; ++p) {
      const float* row = t + (p - p0) * ldt;
#pragma omp simd
      for (int64_t oc = oc0; oc < oc0 + ocb; ++oc) y[p * O + oc] = row[oc - oc0] + bp[oc] + (res ? x[p * b.C + oc] : 0.0f);
    }
  };
#ifndef AOTC_AB_OUT
#define AOTC_AB_OUT 1
#endif
#if AOTC_AB_OUT  // the projection written from its registers, as codegen's aotc_conv_out epilogue asks
  (void)epi_p;
  const aotc_conv_out<float> out{y, {bp, 0, -INFINITY, INFINITY}, OH * OH, O, res ? x : NULL};
  aotc_conv_block<float, 2, 2, CE, CH>(se, x, xs, w.we.data(), sd, w.wd.data(), sp, w.wp.data(), fe, fd, out);
#else
  aotc_conv_block<float, 2, 2, CE, CH>(se, x, xs, w.we.data(), sd, w.wd.data(), sp, w.wp.data(), fe, fd, epi_p);
#endif
}

void run(int i, const Weights& w, const float* x, float* y) {
  const Block& b = kBlocks[i];
#define AOTC_AB_CASE(ce, ch) \
  if (b.C == ce && b.hid == ch) return run_block<ce, ch>(b, w, x, y);
  AOTC_AB_CASE(32, 32) AOTC_AB_CASE(16, 96) AOTC_AB_CASE(24, 144) AOTC_AB_CASE(32, 192) AOTC_AB_CASE(64, 384)
  AOTC_AB_CASE(96, 576) AOTC_AB_CASE(160, 960)
#undef AOTC_AB_CASE
  abort();
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 100;
  aotc_pool_set_threads(-threads);
  std::vector<Weights> w(kN);
  for (int i = 0; i < kN; ++i) {
    const Block& b = kBlocks[i];
    w[i].we.resize((b.hid + NR - 1) / NR * NR * b.C);
    w[i].wp.resize((b.O + NR - 1) / NR * NR * b.hid);
    w[i].wd.resize(9 * b.hid);
    w[i].be.resize(b.hid);
    w[i].bd.resize(b.hid);
    w[i].bp.resize(b.O);
    for (auto* v : {&w[i].we, &w[i].wp, &w[i].wd, &w[i].be, &w[i].bd, &w[i].bp})
      for (float& f : *v) f = 0.2f * rnd();
  }
  std::vector<float> a(112 * 112 * 32), c(a.size());
  for (float& f : a) f = rnd();
  std::vector<std::vector<double>> ms(kN);
  for (int r = 0; r < reps; ++r) {
    const float* x = a.data();
    float* y = c.data();
    for (int i = 0; i < kN; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run(i, w[i], x, y);
      ms[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
      x = y;
      y = y == c.data() ? a.data() : c.data();
    }
  }
  double total = 0;
  for (int i = 0; i < kN; ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const double m = ms[i][ms[i].size() / 2];
    total += m;
    const Block& b = kBlocks[i];
    printf("%d %ld %ld %ld %ld %ld %.5f\n", i, (long)b.C, (long)b.H, (long)b.hid, (long)b.O, (long)b.stride, m);
  }
  printf("total %.5f\n", total);
  return 0;
}
