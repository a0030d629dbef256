// The C ABI between generated CPU libraries and the aotc runtime. One header, shared by both sides:
// codegen includes it into every generated .cpp; runtime/cpu.py declares the same functions to cffi.
#ifndef AOTC_ABI_H
#define AOTC_ABI_H

#include <stddef.h>
#include <stdint.h>

#define AOTC_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

// The ABI version the library was generated for; the runtime refuses a mismatch before running.
int32_t aotc_abi_version(void);

// Run the whole model once.
//   syms:    values of the dynamic dimensions, in manifest "symbols" order (may be NULL if none)
//   inputs:  one pointer per manifest input, contiguous, manifest dtype
//   outputs: one pointer per manifest output, contiguous, allocated by the caller from manifest shapes
//   weights: one pointer per manifest weight tensor, in manifest order (read-only, 64-byte aligned)
//   arena:   scratch of manifest "arena_bytes" bytes, 64-byte aligned (may be NULL when that is 0)
// Returns 0 on success; otherwise a non-zero code and a message in err (NUL-terminated, errlen bytes).
int32_t aotc_run(const int64_t* syms, const void* const* inputs, void* const* outputs,
                 const void* const* weights, void* arena, char* err, size_t errlen);

// Threads for later aotc_run calls: n > 0 at most n (fewer while they do not get a core), 0 the default
// (every core), n < 0 exactly -n.
void aotc_set_num_threads(int32_t n);

// Optional (older libraries lack it; the runtime then reports none): the thread pool's counters since the
// library loaded, for benchmarks and tests. Writes up to n of them into out and returns how many there are
// (their order: struct aotc_pool_stats in aotc_pool_loop.h, names in runtime/cpu.py's POOL_STATS).
int32_t aotc_pool_stats_get(int64_t* out, int32_t n);

#ifdef __cplusplus
}
#endif

// Size arithmetic used by generated code (sizes are never negative).
static inline int64_t aotc_max(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t aotc_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t aotc_ceildiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif  // AOTC_ABI_H
