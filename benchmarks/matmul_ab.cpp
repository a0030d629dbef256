// The harness of benchmarks/cpu_matmul_ab.py: cpp_templates/matmul.h built as a small library (one per
// variant: its own -D settings or another revision's templates), called through ctypes. Weights are packed
// here exactly as aot/codegen/cpp_pack.py packs them; the epilogue adds a bias and, optionally, applies
// GELU (gelu = 1: erf form, BERT's; 2: tanh form, GPT-2's), as the fused Linear epilogues of generated code
// do (the same expression, with the same helpers).
#include "aotc_cpu.h"
#include "matmul.h"

#define AB_EXPORT extern "C" __attribute__((visibility("default")))

AB_EXPORT int ab_nr(void) { return AOTC_MM_NR_F32; }
AB_EXPORT int ab_mr(void) { return aotc_mm_tiles<AOTC_MM_NV>::MR; }
AB_EXPORT int ab_kc(void) { return AOTC_MM_KC; }

// bp = pack(w[K, N]) into [ceil(N / NR)][K][NR], zero past N.
AB_EXPORT void ab_pack(int64_t K, int64_t N, const float* w, float* bp) {
  const int64_t NR = AOTC_MM_NR_F32, P = (N + NR - 1) / NR;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < NR; ++j) {
        const int64_t n = p * NR + j;
        bp[(p * K + k) * NR + j] = n < N ? w[k * N + n] : 0.0f;
      }
}

// This thread's CPU time in ns: on a loaded machine a call's CPU time leaves out the time slices other
// processes took (wall time counts them).
static int64_t ab_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// CPU clocks to sum (ab_clocks_ns): the threads a call runs on. Note: not CLOCK_PROCESS_CPUTIME_ID, which
// counts a thread running on another core only up to its last scheduler tick (4 ms at HZ = 250: a 1 ms
// call on 2 threads read 0.55-1.3x its real time), and which counts the other engines' threads too
// (torch's spinning OpenMP workers, the other variants' pools). A thread's own clock is read exactly.
struct ab_clocks {
  clockid_t id[AOTC_POOL_MAX + 1];
  int n = 0;
  int64_t ns() const {
    int64_t sum = 0;
    for (int i = 0; i < n; ++i) {
      timespec ts;
      if (clock_gettime(id[i], &ts) == 0) sum += (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    return sum;
  }
};

// The calling thread and this library's pool workers (started before: the caller runs a loop first).
static ab_clocks ab_pool_clocks() {
  ab_clocks c;
  c.id[c.n++] = CLOCK_THREAD_CPUTIME_ID;
  aotc_pool& p = aotc_the_pool();
  for (int w = 1; w <= p.started; ++w)
    if (pthread_getcpuclockid(p.workers[w].thread, &c.id[c.n]) == 0) ++c.n;
  return c;
}

// Any threads' CPU time in ns, summed: torch's, named by their thread ids (Python's threading.get_native_id
// and the ones its first call started), for cpu_matmul_ab.py --cpu-time.
AB_EXPORT int64_t ab_tids_ns(const int64_t* tids, int n) {
  ab_clocks c;
  for (int i = 0; i < n && i <= AOTC_POOL_MAX; ++i)  // the kernel's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)
    c.id[c.n++] = (clockid_t)((~(unsigned long)tids[i] << 3) | 6);
  return c.ns();
}

// Reads one float of every cache line of ``buf`` (``bytes`` long) on ``threads`` threads, so that the next
// call finds its operands in neither core's L2 (nor, for a buffer past the L3, there): a hot loop keeps the
// weights in cache, which a model's call, between other layers, does not.
static void ab_evict(const float* buf, int64_t bytes, int threads) {
  const int64_t lines = bytes / 64, chunks = 64;
  aotc_pool_run(chunks, threads, [&](int64_t c, int) {
    float sum = 0;
    for (int64_t i = c * lines / chunks; i < (c + 1) * lines / chunks; ++i) sum += buf[i * 16];
    __asm__ volatile("" : : "x"(sum));
  });
}

// reps calls of c = epi(a[M, K] @ B + bias) on ``threads`` threads exactly; returns the fastest call in s:
// with ``clock`` 0 its wall time, 1 the calling thread's CPU time, 2 its threads' (the caller's and the pool
// workers': what the call took from the machine, spinning included; ab_clocks). With ``cold_bytes`` > 0, ``cold`` is read
// before each call (ab_evict), outside the timed part.
AB_EXPORT double ab_mm(int64_t M, int64_t N, int64_t K, const float* a, const float* bp, const float* bias,
                       float* c, int gelu, int threads, int reps, int clock, const float* cold,
                       int64_t cold_bytes) {
  aotc_pool_set_threads(-threads);
  aotc_pool_run(threads, threads, [](int64_t, int) {});  // the pool's workers exist before ab_pool_clocks
  const ab_clocks clocks = ab_pool_clocks();
  auto now = [&]() { return clock == 0 ? aotc_now_ns() : clock == 1 ? ab_cpu_ns() : clocks.ns(); };
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (cold_bytes > 0) ab_evict(cold, cold_bytes, threads);
    const int64_t t0 = now();
    {
      const aotc_pool_call call;
      aotc_matmul_packed<float>(1, M, N, K, a, [](int64_t) -> int64_t { return 0; }, K, 1, bp,
          [&](int64_t, int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float* tile, int64_t ldt) {
            for (int64_t i = m0; i < m0 + mb; ++i) {
              const float* row = tile + (i - m0) * ldt;
              if (gelu == 1) {
#pragma omp simd
                for (int64_t j = n0; j < n0 + nb; ++j) {
                  const float x = row[j - n0] + bias[j];
                  c[i * N + j] = (x * 0.5f) * (aotc_erf(x * 0.70710677f) + 1.0f);
                }
              } else if (gelu == 2) {
#pragma omp simd
                for (int64_t j = n0; j < n0 + nb; ++j) {
                  const float x = row[j - n0] + bias[j];
                  const float u = (x + x * x * x * 0.044715f) * 0.7978846f;
                  c[i * N + j] = (x * 0.5f) * (aotc_tanh(u) + 1.0f);
                }
              } else {
#pragma omp simd
                for (int64_t j = n0; j < n0 + nb; ++j) c[i * N + j] = row[j - n0] + bias[j];
              }
            }
          });
    }
    const double s = (double)(now() - t0) * 1e-9;
    best = s < best ? s : best;
  }
  return best;
}

// The micro-kernel alone on one thread: ``reps`` times an MR x NR block over kc, the B panel in L1 and
// the A strips taken in turn from ``strips`` of them (1: in L1 too; 24 at kc = 192: 216 KiB, from L2, as
// in a real call). Returns GFLOP/s.
AB_EXPORT double ab_micro(int64_t kc, int64_t reps, int64_t strips) {
  constexpr int MR = aotc_mm_tiles<AOTC_MM_NV>::MR, NV = AOTC_MM_NV, NR = AOTC_MM_NR_F32;
  float* ap = static_cast<float*>(aligned_alloc(64, sizeof(float) * MR * kc * strips + 64));
  float* bp = static_cast<float*>(aligned_alloc(64, sizeof(float) * NR * kc + 64));
  alignas(64) float c[MR * NR];
  for (int64_t i = 0; i < MR * kc * strips; ++i) ap[i] = 1e-3f * (float)(i % 7);
  for (int64_t i = 0; i < NR * kc; ++i) bp[i] = 1e-3f * (float)(i % 5);
  const int64_t t0 = ab_cpu_ns();
  for (int64_t r = 0; r < reps; ++r) {
    aotc_mm_micro<float, MR, MR, NV>(kc, ap + r % strips * MR * kc, bp, c, NR, r > 0);
    __asm__ volatile("" : : "r"(c) : "memory");
  }
  const double s = (double)(ab_cpu_ns() - t0) * 1e-9;
  free(ap);
  free(bp);
  return 2.0 * MR * NR * (double)kc * (double)reps / s * 1e-9;
}

// The machine's FMA rate on one thread: 24 (AVX-512: 32 registers) or 12 (AVX2: 16) independent vector
// FMA chains, enough to cover 2 units x 4 cycles of latency, no loads. Returns GFLOP/s.
AB_EXPORT double ab_peak(int64_t reps) {
  typedef aotc_mm_vec<float>::type V;
  constexpr int L = (int)(sizeof(V) / sizeof(float)), C = AOTC_VBYTES == 64 ? 24 : 12;
  V acc[C], x = aotc_vset1(0.999f), y = aotc_vset1(1e-3f);
  for (int i = 0; i < C; ++i) acc[i] = aotc_vset1((float)i);
  const int64_t t0 = ab_cpu_ns();
  for (int64_t r = 0; r < reps; ++r) {
#pragma GCC unroll 24
    for (int i = 0; i < C; ++i) acc[i] = aotc_vfma(acc[i], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  const double s = (double)(ab_cpu_ns() - t0) * 1e-9;
  float sink = 0;
  for (int i = 0; i < C; ++i) sink += acc[i][0];
  __asm__ volatile("" : : "r"(sink));
  return 2.0 * C * L * (double)reps / s * 1e-9;
}
