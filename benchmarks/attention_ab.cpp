// The harness of benchmarks/attention_ab.py: cpp_templates/attention.h alone, built as a small library (one
// per variant: the working tree's templates or another revision's), called through ctypes.
//
// q, k and v are read where generated code reads them for the transformers' attention: heads of one fused
// QKV projection [B, L, 3 * H * E] (row stride ``ld``), q at column h * E, k at H * E + h * E, v at
// 2 * H * E + h * E; the output is stored as [B, L, H * E], as the fused store of generated code does.
// ``mask_by``: 0 no mask; 1 a bool mask along the queries only ([B?, 1, L, 1]-like, strides (1, 0), one for
// all batches: what BERT's exported extended mask becomes); 2 a bool key-padding mask [B, 1, 1, S].
#include "aotc_cpu.h"
#include "attention.h"

#define AB_EXPORT extern "C" __attribute__((visibility("default")))

AB_EXPORT int ab_vbytes(void) { return AOTC_ATTN_VBYTES; }

static int64_t ab_clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// ``reps`` calls on exactly ``threads`` threads; per call, secs[2 * r] gets its CPU time on one thread (it
// leaves out the time slices other processes take on a loaded machine), its wall time on more, and
// secs[2 * r + 1] its wall time. (The process's CPU clock is no measure of a 0.2 ms call on two threads: the
// other threads' time is folded into it at scheduler ticks, mostly outside the call.)
// ``ld`` 0: q, k and v are three tensors [B, H, L, E] instead (SDPA called on contiguous heads), one after
// another in ``qkv``.
AB_EXPORT void ab_attn(int64_t B, int64_t H, int64_t L, int64_t S, int64_t E, int64_t ld, int causal, int mask_by,
                       const float* qkv, const bool* mask, float* out, int threads, int reps, double* secs) {
  aotc_pool_set_threads(-threads);
  const int64_t HE = H * E, whole = B * H * L * E;
  auto qo = [=](int64_t b) { return ld ? (b / H) * L * ld + (b % H) * E : b * L * E; };
  auto ko = [=](int64_t b) { return ld ? (b / H) * S * ld + HE + (b % H) * E : whole + b * S * E; };
  auto vo = [=](int64_t b) { return ld ? (b / H) * S * ld + 2 * HE + (b % H) * E : 2 * whole + b * S * E; };
  const int64_t row = ld ? ld : E;
  auto mo = [=](int64_t b) { return mask_by == 2 ? (b / H) * S : (int64_t)0; };
  auto epi = [=](int64_t b, int64_t l0, int64_t lb, const float* tile, int64_t ldt) {
    for (int64_t l = l0; l < l0 + lb; ++l) {
      float* o = out + ((b / H) * L + l) * HE + (b % H) * E;
      const float* t = tile + (l - l0) * ldt;
#pragma omp simd
      for (int64_t d = 0; d < E; ++d) o[d] = t[d];
    }
  };
  const int64_t sml = mask_by == 1 ? 1 : 0, sms = mask_by == 2 ? 1 : 0;
  for (int r = 0; r < reps; ++r) {
    const clockid_t clock = threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    const int64_t c0 = ab_clock_ns(clock), w0 = aotc_now_ns();
    {
      const aotc_pool_call call;
      aotc_attention(B * H, L, S, E, E, 1.0f / std::sqrt((float)E), causal != 0, mask_by ? 1 : 0, qkv, qo, row,
                     (int64_t)1, qkv, ko, row, (int64_t)1, qkv, vo, row, (int64_t)1, mask, mo, sml, sms, epi);
    }
    secs[2 * r] = (double)(ab_clock_ns(clock) - c0) * 1e-9;
    secs[2 * r + 1] = (double)(aotc_now_ns() - w0) * 1e-9;
  }
}
