// The bf16 matmul of cpp_templates/matmul_bf16.h against the fp32 one, on weights packed as the builder
// packs them (bf16 pairs; fp32 panels), one process, best of 20 calls each: the VDPBF16PS kernel, the
// widening kernel an AVX-512 CPU without AVX512_BF16 runs, and fp32. GFLOP/s.
//
//   g++ -std=c++17 -fopenmp -O3 -march=x86-64-v4 -mprefer-vector-width=512 -Icpp_templates benchmarks/matmul_bf16_cpu.cpp -o /tmp/mmbf16
//   /tmp/mmbf16 M N K THREADS        (GPT-2's 512 3072 768 2; its fc-proj 128 768 3072 2)
// Zen 4, 2 cores (2026-12-05): 512 x 3072 x 768 on 2 threads 426 / 216 / 218 GFLOP/s (VDPBF16PS / widened /
// fp32), 128 x 768 x 3072 438 / 216 / 222, one thread 211 / 107 / 108.
#include "matmul.h"

#include <stdio.h>

#include <algorithm>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s M N K THREADS\n", argv[0]);
    return 2;
  }
  const int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
  aotc_pool_set_threads(-atoi(argv[4]));  // exactly that many threads
  constexpr int NR = 32;
  const int64_t P = (N + NR - 1) / NR, KP = (K + 1) / 2;
  std::vector<aotc_bf16_tag> a(M * K), bp(P * KP * NR * 2);
  std::vector<float> af(M * K), bpf(P * K * NR), c(M * N);
  for (size_t i = 0; i < a.size(); ++i) {
    af[i] = (float)(i % 7) * 0.1f;
    a[i].bits = (uint16_t)(aotc_f32_bits(af[i]) >> 16);
  }
  for (size_t i = 0; i < bp.size(); ++i) bp[i].bits = (uint16_t)(aotc_f32_bits((float)(i % 5) * 0.1f) >> 16);
  for (size_t i = 0; i < bpf.size(); ++i) bpf[i] = (float)(i % 5) * 0.1f;
  auto epi = [&](int64_t, int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float* t, int64_t ldt) {
    for (int64_t m = m0; m < m0 + mb; ++m)
      for (int64_t n = n0; n < n0 + nb; ++n) c[m * N + n] = t[(m - m0) * ldt + n - n0];
  };
  auto zero = [](int64_t) { return (int64_t)0; };
  const char* names[] = {"bf16 VDPBF16PS", "bf16 widened", "fp32"};
  for (int mode = 0; mode < 3; ++mode) {
    aotc_mm_dpbf16 = mode == 1 ? 0 : -1;
    if (mode == 0 && !aotc_mm_have_dpbf16()) {
      printf("%-15s: this CPU has no AVX512_BF16\n", names[mode]);
      continue;
    }
    double best = 1e9;
    for (int r = 0; r < 20; ++r) {
      const double t0 = omp_get_wtime();
      aotc_pool_call call;
      if (mode == 2)
        aotc_matmul_packed<float, 2>(1, M, N, K, af.data(), zero, K, 1, bpf.data(), epi);
      else
        aotc_matmul_packed_bf16<2>(1, M, N, K, a.data(), zero, K, 1, bp.data(), epi);
      best = std::min(best, omp_get_wtime() - t0);
    }
    printf("%-15s: %6.1f GFLOP/s\n", names[mode], 2.0 * (double)M * (double)N * (double)K / best / 1e9);
  }
  return 0;
}
