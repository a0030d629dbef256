// Scalar helpers for generated CPU code: 16-bit float conversions, Python/torch integer semantics,
// NaN-propagating max/min, and the error plumbing aotc_run uses; the parallel loops come from
// aotc_pool.h. Everything is inline and header-only; generated code calls these by name from the op
// table in aot/codegen/cpp.py.
//
// Note: f16/bf16 tensors are stored as raw uint16_t bits. Generated code loads them into float, does
// all math in float, and rounds to nearest-even only when storing or on an explicit CAST, so a fused
// chain rounds once (as Inductor does), not once per op (as eager does).
#ifndef AOTC_CPU_H
#define AOTC_CPU_H

#include <stdint.h>
#include <string.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "aotc_abi.h"

#include "aotc_pool.h"

// Pointwise kernels split their innermost loop into chunks of this many iterations, so that a nest
// with few outer iterations (batch 1) still spreads over the threads.
#ifndef AOTC_CHUNK
#define AOTC_CHUNK 4096
#endif

// The scalar math that generated ``omp simd`` loops call per element. Always inlined: in a big translation
// unit (GPT-2's, 90 kernels) GCC's inliner runs out of its unit budget and leaves a call per element, and a
// loop with a call is not vectorised -- GPT-2's GELU (tanh) epilogues ran scalar at ~19% of the model's time.
#define AOTC_ELEM static inline __attribute__((always_inline))

// ---- 16-bit floats ---------------------------------------------------------------------------------

AOTC_ELEM float aotc_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

AOTC_ELEM uint32_t aotc_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

AOTC_ELEM float aotc_bf16_to_f32(uint16_t h) { return aotc_bits_f32((uint32_t)h << 16); }

AOTC_ELEM uint16_t aotc_f32_to_bf16(float f) {
  uint32_t u = aotc_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                            // round to nearest even
  return (uint16_t)(u >> 16);
}

AOTC_ELEM float aotc_f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return aotc_bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    const float f = (float)man * 5.9604644775390625e-08f;  // subnormal: man * 2^-24, exact
    return sign ? -f : f;
  }
  return aotc_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

AOTC_ELEM uint16_t aotc_f32_to_f16(float f) {
#if defined(__F16C__)
  return (uint16_t)_cvtss_sh(f, 0);  // 0 = round to nearest even
#else
  // Maratyszcza's branch-free conversion (FP16 library): exact round-to-nearest-even.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = aotc_f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = aotc_bits_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = aotc_f32_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007c00u) + (bits & 0x00000fffu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
#endif
}

AOTC_ELEM float aotc_round_bf16(float x) { return aotc_bf16_to_f32(aotc_f32_to_bf16(x)); }
AOTC_ELEM float aotc_round_f16(float x) { return aotc_f16_to_f32(aotc_f32_to_f16(x)); }

// ---- arithmetic with torch / Python semantics ------------------------------------------------------

// torch.maximum / minimum: NaN in either operand gives NaN; of two equal values (zeros of either sign) a,
// as torch does. Note: written as x86's maxps/minps select (b > a ? b : a lets a NaN a through) and then
// a NaN b, because with a constant b (ReLU, ReLU6, a clamp) that second test folds away and GCC
// vectorizes the rest in two instructions (compare, blend), where the form that tests a for NaN took six
// (ReLU6 over 32 channels, AVX2: 2x faster; AVX-512: 1.2x).
template <class T>
AOTC_ELEM T aotc_maximum(T a, T b) {
  const T m = b > a ? b : a;
  return b != b ? b : m;
}
template <class T>
AOTC_ELEM T aotc_minimum(T a, T b) {
  const T m = b < a ? b : a;
  return b != b ? b : m;
}

// Integer floor division and Python remainder. Division by zero gives 0 instead of trapping
// (torch raises; a compiled kernel must not crash the host process).
template <class T>
static inline T aotc_floordiv(T a, T b) {
  static_assert(std::is_integral<T>::value, "integers only");
  if (b == 0) return 0;
  if (std::is_signed<T>::value && b == (T)-1) return (T)(0 - a);
  T q = (T)(a / b);
  if ((T)(a % b) != 0 && ((a < 0) != (b < 0))) q = (T)(q - 1);
  return q;
}

template <class T>
static inline T aotc_pymod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T r = std::fmod(a, b);  // torch.remainder on floats: fmod, then move into the divisor's sign
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  } else {
    if (b == 0 || (std::is_signed<T>::value && b == (T)-1)) return 0;
    T r = (T)(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = (T)(r + b);
    return r;
  }
}

// a * b + c in one rounding where the target has FMA, for the polynomials of the helpers below: half the
// instructions, and no less accurate (they are no eager op's rounding to match: torch's own exp, tanh and
// erf are other approximations). Two roundings elsewhere: fmaf would be a library call the loop cannot
// vectorise.
AOTC_ELEM float aotc_fmaf(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// e^r - 1 - r for |r| <= ln2 / 2: Cephes' degree-6 polynomial (with aotc_expf's reduction, max error ~1.5 ulp).
AOTC_ELEM float aotc_exp_poly(float r) {
  float p = 1.9875691500e-4f;
  p = aotc_fmaf(p, r, 1.3981999507e-3f);
  p = aotc_fmaf(p, r, 8.3334519073e-3f);
  p = aotc_fmaf(p, r, 4.1665795894e-2f);
  p = aotc_fmaf(p, r, 1.6666665459e-1f);
  p = aotc_fmaf(p, r, 5.0000001201e-1f);
  return p * (r * r);
}

// exp that the vectoriser can inline (glibc's expf is a call the loop cannot vectorise without
// -ffast-math). Cody-Waite reduction x = n ln2 + r, Cephes' degree-6 polynomial for e^r (max error
// ~1.5 ulp), and 2^n applied as two exact power-of-two factors so subnormal results stay correct.
// exp(-inf) = 0, exp(+inf) = inf, NaN propagates.
AOTC_ELEM float aotc_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  const float n = std::floor(aotc_fmaf(xc, 1.44269504088896341f, 0.5f));
  float r = aotc_fmaf(n, -0.693359375f, xc);  // ln2 split in two: n * hi is exact
  r = aotc_fmaf(n, 2.12194440e-4f, r);
  const float p = aotc_exp_poly(r) + r + 1.0f;
  const int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
  const float out = p * aotc_bits_f32((uint32_t)(n1 + 127) << 23) * aotc_bits_f32((uint32_t)(n2 + 127) << 23);
  return x != x ? x : out;
}

// tanh the vectoriser can inline: tanh|x| = (e^2|x| - 1) / (e^2|x| + 1), with e^y - 1 taken from
// aotc_expf's reduction as 2^n (p + r) + (2^n - 1) in one FMA, so that it keeps its precision at small y
// (1 - 2 / (e^y + 1) cancels there and needed a second polynomial and a select: 30% more instructions,
// and GPT-2's tanh GELU took ~10% of its 768 -> 3072 linear). |x| is clamped to 10 (tanh rounds to 1
// from 9.01 on), so e^y needs none of aotc_expf's clamps and one power-of-two factor. Max error 2 ulp.
AOTC_ELEM float aotc_tanhf(float x) {
  const float ax = std::fabs(x);
  const float y = 2.0f * (ax < 10.0f ? ax : 10.0f);  // a NaN x takes 10 here and is passed on below
  const float n = std::floor(aotc_fmaf(y, 1.44269504088896341f, 0.5f));
  float r = aotc_fmaf(n, -0.693359375f, y);
  r = aotc_fmaf(n, 2.12194440e-4f, r);
  const float s = aotc_bits_f32((uint32_t)((int32_t)n + 127) << 23);
  const float em1 = aotc_fmaf(s, aotc_exp_poly(r) + r, s - 1.0f);
  const float t = std::copysign(em1 / (em1 + 2.0f), x);  // copysign, no branch: -0 stays -0
  return x != x ? x : t;
}

// erf the vectoriser can inline: Eigen's rational approximation x P(x^2) / Q(x^2) on [-4, 4] (erf is
// +-1 in float beyond), |error| <= 4.1e-7 (a few ulp near +-1). One division and no exp: GELU's erf ran at
// 2.5x the time of this, and BERT's MLP activation is a GELU per element of its widest tensor.
AOTC_ELEM float aotc_erff(float x) {
  const float c = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float z = c * c;
  float p = -2.72614225801306e-10f;
  p = aotc_fmaf(p, z, 2.77068142495902e-08f);
  p = aotc_fmaf(p, z, -2.10102402082508e-06f);
  p = aotc_fmaf(p, z, -5.69250639462346e-05f);
  p = aotc_fmaf(p, z, -7.34990630326855e-04f);
  p = aotc_fmaf(p, z, -2.95459980854025e-03f);
  p = aotc_fmaf(p, z, -1.60960333262415e-02f);
  float q = -1.45660718464996e-05f;
  q = aotc_fmaf(q, z, -2.13374055278905e-04f);
  q = aotc_fmaf(q, z, -1.68282697438203e-03f);
  q = aotc_fmaf(q, z, -7.37332916720468e-03f);
  q = aotc_fmaf(q, z, -1.42647390514189e-02f);
  const float r = c * p / q;
  return x != x ? x : r;
}

AOTC_ELEM float aotc_exp(float x) { return aotc_expf(x); }
AOTC_ELEM float aotc_erf(float x) { return aotc_erff(x); }
static inline double aotc_erf(double x) { return std::erf(x); }
AOTC_ELEM float aotc_tanh(float x) { return aotc_tanhf(x); }
static inline double aotc_tanh(double x) { return std::tanh(x); }
static inline double aotc_exp(double x) { return std::exp(x); }

template <class T>
AOTC_ELEM T aotc_sigmoid(T x) {
  return T(1) / (T(1) + aotc_exp(-x));
}

template <class T>
AOTC_ELEM T aotc_rsqrt(T x) {
  return T(1) / std::sqrt(x);
}

template <class T>
AOTC_ELEM T aotc_relu(T x) {
  return aotc_maximum(x, T(0));
}

// A data-dependent index (gather): out of range sets ``bad`` and reads element 0 instead.
static inline int64_t aotc_checked(int64_t i, int64_t n, int64_t& bad) {
  const bool ok = (uint64_t)i < (uint64_t)n;
  bad |= (int64_t)!ok;
  return ok ? i : 0;
}

// A gathered row [i, i + len) of n elements checked at once: out of range sets ``bad`` and reads from
// element 0 instead (the caller throws; len > n never passes).
static inline int64_t aotc_checked_span(int64_t i, int64_t len, int64_t n, int64_t& bad) {
  const bool ok = i >= 0 && len <= n && i <= n - len;
  bad |= (int64_t)!ok;
  return ok ? i : 0;
}

// ---- the C boundary ---------------------------------------------------------------------------------

static inline void aotc_set_error(char* err, size_t errlen, const char* msg) {
  if (err == NULL || errlen == 0) return;
  snprintf(err, errlen, "%s", msg);
}

#define AOTC_ERR_EXCEPTION 1  // a C++ exception (std::exception::what() in err)
#define AOTC_ERR_UNKNOWN 2    // something that is not a std::exception

#ifdef AOTC_SELFTEST_CPU
int main() {
  int fails = 0;
  fails += aotc_floordiv<int64_t>(-7, 2) != -4;
  fails += aotc_pymod<int64_t>(-7, 3) != 2;
  fails += aotc_pymod<double>(-1.0, 3.0) != 2.0;
  fails += aotc_f32_to_bf16(1.0f) != 0x3f80;
  fails += aotc_f32_to_f16(1.0f) != 0x3c00;
  fails += aotc_f16_to_f32(0x3555) != aotc_round_f16(0.33325195f);
  fails += !std::isnan(aotc_maximum(1.0f, NAN)) + !std::isnan(aotc_maximum(NAN, 1.0f));
  fails += !std::isnan(aotc_minimum(1.0f, NAN)) + !std::isnan(aotc_minimum(NAN, 1.0f));
  fails += !std::signbit(aotc_maximum(-0.0f, 0.0f)) + std::signbit(aotc_minimum(0.0f, -0.0f));  // torch: a on ties
  fails += aotc_maximum(2, 3) != 3 || aotc_minimum(2, 3) != 2 || aotc_maximum(-1.5f, 0.0f) != 0.0f;
  int64_t bad = 0;
  fails += aotc_checked(5, 3, bad) != 0 || bad != 1;
  bad = 0;
  fails += aotc_checked_span(4, 4, 8, bad) != 4 || aotc_checked_span(0, 8, 8, bad) != 0 || bad != 0;
  fails += aotc_checked_span(5, 4, 8, bad) != 0 || bad != 1;
  bad = 0;
  fails += aotc_checked_span(-1, 2, 8, bad) != 0 || bad != 1;
  bad = 0;
  fails += aotc_checked_span(0, 9, 8, bad) != 0 || bad != 1;
  double worst = 0;  // aotc_expf within 2 ulp of the correctly rounded exp, subnormals and limits included
  for (float x = -110.0f; x < 90.0f; x += 0.0013f) {
    const double want = (double)(float)std::exp((double)x), got = aotc_expf(x);
    if (std::isinf(want)) {
      worst = std::isinf(got) ? worst : 1e9;
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(want < 1.2e-38 ? 1.2e-38 : want) - 23);
    worst = std::fabs(got - want) / ulp > worst ? std::fabs(got - want) / ulp : worst;
  }
  fails += worst > 2.0;
  worst = 0;
  for (float x = -12.0f; x < 12.0f; x += 0.00037f) {
    const double want = (double)(float)std::tanh((double)x), got = aotc_tanhf(x);
    const double ulp = std::ldexp(1.0, std::ilogb(std::fabs(want) < 1e-30 ? 1e-30 : std::fabs(want)) - 23);
    worst = std::fabs(got - want) / ulp > worst ? std::fabs(got - want) / ulp : worst;
  }
  fails += worst > 2.5;  // measured: 2.0
  worst = 0;  // erf: within 5e-7 relative (measured: 4.0e-7)
  for (float x = -6.0f; x < 6.0f; x += 0.00031f) {
    const double want = std::erf((double)x), got = aotc_erff(x);
    const double rel = std::fabs(got - want) / (std::fabs(want) > 1e-30 ? std::fabs(want) : 1e-30);
    worst = rel > worst ? rel : worst;
  }
  fails += worst > 5e-7;
  fails += aotc_erff(INFINITY) != 1.0f || aotc_erff(-INFINITY) != -1.0f || !std::isnan(aotc_erff(NAN));
  fails += aotc_tanhf(INFINITY) != 1.0f || aotc_tanhf(-INFINITY) != -1.0f || !std::isnan(aotc_tanhf(NAN));
  fails += !std::signbit(aotc_tanhf(-0.0f)) || aotc_tanhf(1e-30f) != 1e-30f;
  fails += aotc_expf(-INFINITY) != 0.0f || !std::isinf(aotc_expf(INFINITY)) || !std::isnan(aotc_expf(NAN));
  return fails;
}
#endif

#endif  // AOTC_CPU_H
