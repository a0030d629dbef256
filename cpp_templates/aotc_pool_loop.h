// The thread pool generated CPU code runs its parallel loops on: persistent worker threads that claim
// chunks of a loop (each its own share first, then the others'), and the loops (aotc_pool_run,
// aotc_parallel_for). Here too: the pool's one state (struct aotc_pool, the policy's fields included) and
// the settings of the pool and its policy (AOTC_POOL_*: the struct's initialisers use them), and the
// policy's view of one loop (aotc_pool_account), which drops the rest of a call to one thread.
// What it is not: the policy between calls -- whether a call runs with the workers or on the calling
// thread alone, from the calls' measured times, and the backoff after a drop -- nor the thread-count
// setting and the counters' reader: aotc_pool.h, which includes this and is the header to include.
//
// Note (why not OpenMP regions): an OpenMP loop ends at a barrier, so every kernel waits for the slowest
// thread. On an edge server another process often holds a core; the worker that shares that core runs
// only every few milliseconds, and every kernel's barrier then waits for it: examples/mlp.py at 1x256 took
// 16 ms a call on 2 threads with one core busy against 1.4 ms on one thread. Here the caller works too,
// chunks are claimed one at a time (aotc_pool_claim), and a loop is over when its chunks are done,
// not when every thread has arrived: a worker that wakes late finds nothing left and nobody waits for it.
//
// Workers spin for AOTC_POOL_SPIN_NS after a loop (kernels follow each other within microseconds), then
// sleep on a futex; the caller wakes only the ones a loop uses, and not for a loop that was short the last
// time. Nothing is allocated per call. One pool per library (each loaded package has its own), created at
// the first parallel loop, joined at unload. aotc_pool_stats_get (aotc_pool.h) reads the counters
// (CpuExecutor.pool_stats).
#ifndef AOTC_POOL_LOOP_H
#define AOTC_POOL_LOOP_H

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <memory>
#include <type_traits>

#include "aotc_spare_cores.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef AOTC_POOL_MAX
#define AOTC_POOL_MAX 127  // threads, the caller included: at most 127 (7 bits of the job word)
#endif
static_assert(AOTC_POOL_MAX >= 1 && AOTC_POOL_MAX <= 127, "the job word holds a width of 7 bits");
#ifndef AOTC_POOL_SPIN_NS
// How long an idle worker watches for the next loop before it sleeps. Note: 50 us, was 200: a worker spins
// through every serial stretch of a call (kernels too small to split), which cost MobileNetV2 ~30% more
// CPU per call than one thread (14.6 ms against 11.0; 12.3 at 50 us), CPU another process on the server
// wanted; and the spinning burns the worker's CFS share, so it is the one descheduled under contention.
// A loop that finds a worker asleep is started by the caller at once; the worker joins ~10-50 us later.
#define AOTC_POOL_SPIN_NS 50000
#endif
#ifndef AOTC_POOL_WAIT_SPIN_NS
#define AOTC_POOL_WAIT_SPIN_NS 30000  // how long the caller spins for the last chunks before it sleeps
#endif
#ifndef AOTC_POOL_PULL_WINDOW_NS
#define AOTC_POOL_PULL_WINDOW_NS 100000  // the caller's sleeps while it waits for chunks (aotc_pool_wait_pull)
#endif
#ifndef AOTC_POOL_SLACK_NS
#define AOTC_POOL_SLACK_NS 50000  // a wait up to this long (beyond one chunk) is noise, not a stall
#endif
#ifndef AOTC_POOL_WAKE_MIN_NS
// A loop that took less than this on one thread (estimated) the last time the call reached it wakes no
// sleeping worker: a woken worker arrives 10-50 us later, to find little or nothing left, and the wake
// costs the caller a system call. Workers still spinning join any loop.
#define AOTC_POOL_WAKE_MIN_NS 40000
#endif
#ifndef AOTC_POOL_SITES
#define AOTC_POOL_SITES 1024  // loops per call whose length is remembered (by their order in the call)
#endif
#ifndef AOTC_POOL_EXPLORE_MIN
#define AOTC_POOL_EXPLORE_MIN 8  // calls between tries of the other way (workers or one thread), at first
#endif
#ifndef AOTC_POOL_EXPLORE_MAX
#define AOTC_POOL_EXPLORE_MAX 256  // ... and at most, after tries that kept confirming the way chosen
#endif
#ifndef AOTC_POOL_EXPLORE_NS
// ... or fewer while one thread is chosen: a try of the workers comes at least this often (after
// AOTC_POOL_EXPLORE_MIN calls), so that a choice made in a passing slowdown costs tens of ms, not hundreds of
// calls. (Not the other way: a try of one thread every few calls of a slow model with workers, BERT's 10 ms
// against 18.5 alone, would cost ~10% of its time; a passing slowdown takes it off the workers anyway.)
#define AOTC_POOL_EXPLORE_NS 30000000
#endif
#ifndef AOTC_POOL_RECENT
#define AOTC_POOL_RECENT 5  // each way's time is the mean of its last this many calls but the slowest (aotc_pool_typical)
#endif
#ifndef AOTC_POOL_WORKERS_MUST_WIN
#define AOTC_POOL_WORKERS_MUST_WIN 0.97  // calls with workers are chosen when they take under this x one thread's
#endif
#ifndef AOTC_POOL_MEMORY_NS
#define AOTC_POOL_MEMORY_NS 50000000  // the policy's gains and losses fade by half in this much time
#endif
#ifndef AOTC_POOL_TOLERANCE_NS
#define AOTC_POOL_TOLERANCE_NS 1000000  // losses up to this much above the gains (remembered, faded) are noise
#endif
#ifndef AOTC_POOL_BACKOFF_MIN_NS
#define AOTC_POOL_BACKOFF_MIN_NS 5000000  // the first time on one thread after a drop
#endif
#ifndef AOTC_POOL_BACKOFF_MAX_NS
#define AOTC_POOL_BACKOFF_MAX_NS 1000000000  // the longest time on one thread before the next probe
#endif
#ifndef AOTC_CHUNK_WORK
#define AOTC_CHUNK_WORK 8192  // elements: a chunk at least this big pays for its claim (an atomic CAS)
#endif
#ifndef AOTC_CHUNKS_PER_THREAD
#define AOTC_CHUNKS_PER_THREAD 16  // at most: enough that a late thread costs a small chunk, not a share
#endif

// The job word: generation (19 bits) | width (7) | chunks (19). A thread's share word: generation | first
// chunk left (19) | end (19). Packing them makes a claim one compare-and-swap that fails once the loop it
// read has been replaced by another.
#define AOTC_POOL_NBITS 19
#define AOTC_POOL_CHUNKS_MAX ((1 << AOTC_POOL_NBITS) - 1)

#ifdef AOTC_SELFTEST_POOL
// Simulated time that aotc_pool.h's self-test's timed calls add to the clock instead of sleeping it: a nap
// on a loaded machine oversleeps by whole time slices, which turned the lengths of simulated calls, and so
// the policy's choices, into luck (a 0.5 ms call once read longer than a 6 ms one).
static std::atomic<int64_t> aotc_selftest_skew_ns{0};
#endif

static inline int64_t aotc_now_ns() {
  const int64_t ns = aotc_clock_ns(CLOCK_MONOTONIC);
#ifdef AOTC_SELFTEST_POOL
  return ns + aotc_selftest_skew_ns.load(std::memory_order_relaxed);
#else
  return ns;
#endif
}

static inline void aotc_cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static inline void aotc_futex_wait(std::atomic<uint32_t>* word, uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

static inline void aotc_futex_wait_for(std::atomic<uint32_t>* word, uint32_t value, int64_t ns) {
  const timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, &ts, NULL, 0);
}

static inline void aotc_futex_wake(std::atomic<uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline uint64_t aotc_job_pack(uint64_t gen, uint64_t width, uint64_t chunks) {
  return gen << 45 | width << 38 | chunks << 19;
}
static inline uint32_t aotc_job_gen(uint64_t j) { return (uint32_t)(j >> 45); }
static inline int aotc_job_width(uint64_t j) { return (int)(j >> 38 & 127); }
static inline int64_t aotc_job_chunks(uint64_t j) { return (int64_t)(j >> 19 & AOTC_POOL_CHUNKS_MAX); }
static inline uint64_t aotc_share_pack(uint64_t gen, uint64_t lo, uint64_t hi) { return gen << 38 | lo << 19 | hi; }
static inline uint32_t aotc_share_gen(uint64_t s) { return (uint32_t)(s >> 38); }
static inline int64_t aotc_share_lo(uint64_t s) { return (int64_t)(s >> 19 & AOTC_POOL_CHUNKS_MAX); }
static inline int64_t aotc_share_hi(uint64_t s) { return (int64_t)(s & AOTC_POOL_CHUNKS_MAX); }

// True on a thread while it runs a chunk: a loop started inside one runs serially (no nested pools).
static thread_local bool aotc_pool_inside = false;

struct aotc_worker {
  alignas(64) std::atomic<uint32_t> wake{0};  // the futex word this worker sleeps on
  std::atomic<uint32_t> sleeping{0};
  std::atomic<int> cpu{-1};  // the CPU it last went to sleep on (aotc_pool_wake)
  std::atomic<bool> moved{false};  // the caller narrowed its affinity to wake it elsewhere: widen it again
  std::atomic<uint32_t> busy{0};   // inside a chunk (aotc_pool_wait_pull)
  std::atomic<bool> pulled{false};  // the caller moved it onto its CPU for a late chunk
  pid_t tid = 0;
  pthread_t thread;
  clockid_t clock;  // its CPU time
  bool has_clock = false;
};

struct aotc_pool_stats {  // for tests and benchmarks: what the policy saw (aotc_pool_stats_get)
  int64_t calls = 0, loops = 0, stalls = 0, drops = 0, solo_calls = 0, probes = 0, wakes = 0;
  int64_t wait_ns = 0, loss_ns = 0, gain_ns = 0, worker_chunks = 0, chunks = 0, serial = 0, explores = 0;
  int64_t busy_skips = 0;  // tries of the workers that the time bound would have made, skipped: no core was spare
  int64_t moves = 0;  // workers woken off the caller's CPU (aotc_pool_wake)
  int64_t pulls = 0;  // descheduled workers pulled onto the waiting caller's CPU (aotc_pool_wait_pull)
};

struct aotc_share {  // one thread's share of a loop's chunks (its own cache line: the owner claims often)
  alignas(64) std::atomic<uint64_t> word{0};
};

struct aotc_pool {
  alignas(64) std::atomic<uint64_t> job{0};
  aotc_share shares[AOTC_POOL_MAX];  // slot s's share of the current loop (aotc_pool_claim)
  alignas(64) std::atomic<uint32_t> done{0};  // chunks finished in the current loop
  std::atomic<uint32_t> caller_sleeping{0};
  std::atomic<int> failed{0};
  std::exception_ptr error;
  void (*fn)(void*, int64_t, int) = nullptr;  // fn(ctx, chunk, slot)
  void* ctx = nullptr;
  std::atomic<bool> stop{false};
  int started = 0;  // worker threads created so far
  cpu_set_t cpus;  // the process's affinity when the pool was created: what a moved worker gets back
  aotc_worker workers[AOTC_POOL_MAX];
  // Settings and policy: touched by the calling thread only (calls into one library are serialised).
  int want = 0;          // threads asked for; 0: the default
  bool fixed = false;    // exactly ``want`` threads, no adaptation
  int width = 0;         // threads this call may use (0: not inside a call)
  bool dropped = false;  // this call fell back to one thread
  int64_t gain_ns = 0, loss_ns = 0;  // this call: time the workers saved, time spent waiting for them
  double past_gain_ns = 0, past_loss_ns = 0;  // earlier calls' gains and losses, fading (AOTC_POOL_MEMORY_NS)
  int64_t last_call_ns = 0;  // when the last call began (the fading's clock)
  int64_t solo_until_ns = 0;  // calls that begin before this run on one thread
  int64_t backoff_ns = AOTC_POOL_BACKOFF_MIN_NS;  // time on one thread after the next drop
  int64_t settled_ns = 0;  // the last drop, or the last shortening of the backoff
  // The measured choice between workers and one thread, for calls of one shape (``key``): each way's call
  // time (aotc_pool_typical of its last calls), the way preferred, and when to try the other way next.
  uint64_t key = 0;
  double typical_ns[2] = {0, 0};  // [0]: calls that began with workers, [1]: calls on one thread (0: none yet)
  double recent_ns[2][AOTC_POOL_RECENT] = {};  // the last calls' times, each way (a ring)
  int64_t recent_n[2] = {0, 0};  // calls timed each way (a new key starts over)
  bool prefer_solo = false;
  int64_t explore_every = AOTC_POOL_EXPLORE_MIN, since_explore = 0;
  int64_t explored_ns = 0;  // the last try of the other way, or the last switch
  aotc_cpu_ticks ticks;  // the CPUs' counters when the time bound last looked (aotc_pool.h, aotc_spare_cores.h)
  bool adapting = false, exploring = false;  // this call: the policy is on; it tries the way not preferred
  int solo = 0;  // this call began on one thread
  int64_t began_ns = 0;
  int site = 0;  // the loops this call has started (a loop's site: its order in the call)
  bool short_site[AOTC_POOL_SITES] = {};  // the loop at this site was short the last time (AOTC_POOL_WAKE_MIN_NS)
  int64_t test_worker_delay_ns = 0;  // tests: workers sleep this long inside every chunk they run
  bool test_no_pull = false;  // tests: no worker is pulled onto the caller's CPU (aotc_pool_wait_pull)
  aotc_pool_stats stats;

  ~aotc_pool() {  // the library is being unloaded (or the process exits): let the workers go
    stop.store(true);
    for (int i = 1; i <= started; ++i) {
      workers[i].wake.fetch_add(1);
      aotc_futex_wake(&workers[i].wake, 1);
    }
    for (int i = 1; i <= started; ++i) pthread_join(workers[i].thread, NULL);
  }
};

static aotc_pool& aotc_the_pool() {
  static aotc_pool pool;
  return pool;
}

static inline int aotc_default_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();  // honours OMP_NUM_THREADS and the process's CPU affinity
#else
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
#endif
}

// Run chunk ``c`` of a loop of ``chunks`` as ``slot``; an exception is kept for the caller (the first
// one wins). The last chunk wakes the caller if it sleeps.
static inline void aotc_pool_chunk(aotc_pool& p, int64_t c, int64_t chunks, int slot) {
  try {
    p.fn(p.ctx, c, slot);
  } catch (...) {
    int expect = 0;
    if (p.failed.compare_exchange_strong(expect, 1)) p.error = std::current_exception();
  }
  if (p.done.fetch_add(1) + 1 == (uint32_t)chunks && p.caller_sleeping.load())
    aotc_futex_wake(&p.done, 1);
}

// Claim a chunk of generation ``gen`` for ``slot`` of a loop ``width`` threads wide: the first left of
// its own share, else the last left of another's; -1 when none is left (or the loop is over).
// Note (why shares): slot s's share is the s-th of ``width`` equal runs of the chunks, so consecutive loops
// over the same rows (a matmul, its epilogue's output read by the next matmul, a layer norm) give each row
// to the same thread, whose core's L2 still holds it. Chunks handed out in order from one counter went to
// whichever thread asked next, so about half of a matmul's rows of A came from the other core's cache.
// A thread that runs out steals from the ends of the others' shares, one chunk at a time, so a loop still
// ends within a chunk of balanced, and a worker that wakes late (or is descheduled) finds its share taken
// by the caller: nobody waits for a thread that does not come.
static inline int64_t aotc_pool_claim(aotc_pool& p, uint32_t gen, int slot, int width) {
  for (int i = 0; i < width; ++i) {
    std::atomic<uint64_t>& w = p.shares[(slot + i) % width].word;
    uint64_t v = w.load(std::memory_order_acquire);
    while (aotc_share_gen(v) == gen && aotc_share_lo(v) < aotc_share_hi(v)) {
      const bool own = i == 0;  // own share: from its front; another's: from its end
      if (w.compare_exchange_weak(v, own ? v + ((uint64_t)1 << AOTC_POOL_NBITS) : v - 1, std::memory_order_acquire))
        return own ? aotc_share_lo(v) : aotc_share_hi(v) - 1;
    }
  }
  return -1;
}

// The pool's CPUs but ``cpu`` into ``others``; false (nothing to leave out) when ``cpu`` is unknown, not one
// of them, or their only one.
static inline bool aotc_pool_off_cpu(const aotc_pool& p, int cpu, cpu_set_t* others) {
  if (cpu < 0 || !CPU_ISSET(cpu, &p.cpus) || CPU_COUNT(&p.cpus) < 2) return false;
  *others = p.cpus;
  CPU_CLR(cpu, others);
  return true;
}

// Whether the caller pulled this worker onto its CPU for a late chunk (aotc_pool_wait_pull); clears it.
static inline bool aotc_pool_was_pulled(aotc_worker& me) {
  return me.pulled.load(std::memory_order_relaxed) && me.pulled.exchange(false);
}

static void* aotc_pool_worker(void* arg) {
  aotc_pool& p = aotc_the_pool();
  const int id = (int)(intptr_t)arg;
  aotc_worker& me = p.workers[id];
  me.tid = (pid_t)syscall(SYS_gettid);
  uint32_t seen = aotc_job_gen(p.job.load());
  bool pulled = false;
  for (;;) {
    uint64_t j = p.job.load(std::memory_order_acquire);
    // A worker pulled onto the caller's CPU sleeps at once, not spinning beside the caller; the next loop's
    // wake-up moves it off that CPU (aotc_pool_wake), and as a wake-up, not a move of a queued thread, it
    // gets its turn on the other core soon. (Moved off at once, it queued behind the other process there:
    // MobileNetV2 with one core busy 10% slower.)
    int64_t deadline = pulled ? 0 : aotc_now_ns() + AOTC_POOL_SPIN_NS;
    pulled = false;
    for (int i = 1; aotc_job_gen(j) == seen && !p.stop.load(std::memory_order_relaxed); ++i) {
      if (i % 256 == 0 && aotc_now_ns() > deadline) {
        const uint32_t w = me.wake.load();
        // Kept off the caller's CPU through the loops it spun between (aotc_pool_wake); the next wake-up may
        // place it anywhere again. Widening does not move a thread.
        if (me.moved.exchange(false)) sched_setaffinity(0, sizeof p.cpus, &p.cpus);
        me.cpu.store(sched_getcpu(), std::memory_order_relaxed);
        me.sleeping.store(1);  // then look once more: the caller reads ``sleeping`` after publishing
        if (aotc_job_gen(p.job.load()) == seen && !p.stop.load()) aotc_futex_wait(&me.wake, w);
        me.sleeping.store(0);
        deadline = aotc_now_ns() + AOTC_POOL_SPIN_NS;
      }
      aotc_cpu_relax();
      j = p.job.load(std::memory_order_acquire);
    }
    if (p.stop.load()) return NULL;
    seen = aotc_job_gen(j);
    cpu_set_t others;  // a pull that came after its last chunk: off the caller's CPU now
    if (aotc_pool_was_pulled(me) && aotc_pool_off_cpu(p, sched_getcpu(), &others))
      sched_setaffinity(0, sizeof others, &others);
    const int width = aotc_job_width(j);
    if (id >= width) continue;
    aotc_pool_inside = true;
    const int64_t n = aotc_job_chunks(j);
    for (int64_t c; (c = aotc_pool_claim(p, seen, id, width)) >= 0;) {
      me.busy.store(1, std::memory_order_relaxed);
      if (p.test_worker_delay_ns) {
        const timespec ts = {0, (long)p.test_worker_delay_ns};
        nanosleep(&ts, NULL);
      }
      aotc_pool_chunk(p, c, n, id);
      me.busy.store(0, std::memory_order_relaxed);
    }
    aotc_pool_inside = false;
    pulled = aotc_pool_was_pulled(me);
  }
}

// Workers 1 .. n-1 exist (created on first need, with every signal blocked: they belong to the host's
// main thread). Returns how many threads can take part, the caller included.
static inline int aotc_pool_grow(aotc_pool& p, int n) {
  if (n > AOTC_POOL_MAX) n = AOTC_POOL_MAX;
  if (n - 1 <= p.started) return n;
  if (p.started == 0 && sched_getaffinity(0, sizeof p.cpus, &p.cpus) != 0) CPU_ZERO(&p.cpus);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  // Started off the caller's CPU, as aotc_pool_wake wakes them (see the note there).
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  cpu_set_t others;
  const bool narrowed = aotc_pool_off_cpu(p, sched_getcpu(), &others) &&
                        pthread_attr_setaffinity_np(&attr, sizeof others, &others) == 0;
  while (p.started < n - 1) {
    const int id = p.started + 1;
    p.workers[id].moved.store(narrowed);
    if (pthread_create(&p.workers[id].thread, &attr, aotc_pool_worker, (void*)(intptr_t)id) != 0) break;
    p.workers[id].has_clock = pthread_getcpuclockid(p.workers[id].thread, &p.workers[id].clock) == 0;
    p.started = id;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return p.started + 1;
}

// The policy's view of one loop: the workers saved about (their chunks x the caller's time per chunk);
// the caller lost the time it waited beyond one chunk. A call whose losses, with the earlier calls' (faded),
// pass the gains by more than AOTC_POOL_TOLERANCE_NS runs the rest of itself on one thread.
static inline bool aotc_pool_losing(const aotc_pool& p) {
  return p.past_loss_ns + (double)p.loss_ns > p.past_gain_ns + (double)p.gain_ns + AOTC_POOL_TOLERANCE_NS;
}

static inline void aotc_pool_account(aotc_pool& p, int64_t chunks, int64_t mine, int threads, int64_t busy_ns,
                                     int64_t wait_ns) {
  const int64_t per = mine > 0 ? busy_ns / mine : 0;
  // At most the loop's length per worker: a caller descheduled inside its one chunk would claim more.
  const int64_t cap = (int64_t)(threads - 1) * busy_ns, by_chunks = (chunks - mine) * per;
  const int64_t gain = by_chunks < cap ? by_chunks : cap;
  p.gain_ns += gain;
  p.stats.gain_ns += gain;
  p.stats.wait_ns += wait_ns;
  p.stats.chunks += chunks;
  p.stats.worker_chunks += chunks - mine;
  const int64_t lost = wait_ns - per - AOTC_POOL_SLACK_NS;
  if (lost <= 0) return;
  p.loss_ns += lost;
  p.stats.loss_ns += lost;
  p.stats.stalls += 1;
  if (!p.fixed && p.width > 1 && aotc_pool_losing(p)) {  // inside a call only
    p.width = 1;
    p.dropped = true;
    p.stats.drops += 1;
  }
}

// Wake the workers of a loop ``threads`` wide that sleep (the ones still spinning have seen the loop).
// Note (why move them): Linux may wake a worker on the CPU it last slept on even when that is the
// caller's and another CPU is idle (seen on a 2-core VM: a worker stayed on the caller's CPU for
// seconds, and ran its chunks only while the caller waited, so 2 threads took one thread's time). A worker
// that went to sleep on the caller's CPU is woken with that CPU left out of its affinity, and widens it
// again itself when it next goes to sleep (aotc_pool_worker): not sooner, or the scheduler may move it
// back beside the caller within the call when the other CPUs are busy.
static inline void aotc_pool_wake(aotc_pool& p, int threads) {
  int here = -2;
  for (int i = 1; i < threads; ++i) {
    aotc_worker& w = p.workers[i];
    if (!w.sleeping.load()) continue;
    if (here == -2) here = sched_getcpu();
    cpu_set_t others;
    if (w.cpu.load(std::memory_order_relaxed) == here && w.tid > 0 && aotc_pool_off_cpu(p, here, &others) &&
        sched_setaffinity(w.tid, sizeof others, &others) == 0) {
      w.moved.store(true);
      p.stats.moves += 1;
    }
    w.wake.fetch_add(1);
    aotc_futex_wake(&w.wake, 1);
    p.stats.wakes += 1;
  }
}

// The caller has run out of chunks: it sleeps until the workers finish theirs, in windows of
// AOTC_POOL_PULL_WINDOW_NS. A worker inside a chunk whose CPU clock stood still through a window, while the
// caller's CPU was free, is descheduled (another process has its core) and would hold the loop up for
// the rest of that process's time slice: it is moved onto the caller's CPU, sleeps there after the chunk,
// and the next loop's wake-up moves it off (aotc_pool_worker, aotc_pool_wake). Note (why not leave it to the scheduler): an idle CPU takes a waiting thread
// from another only when it has not run for a while (Linux's migration cost, 0.5 ms), so a worker preempted
// a moment ago stays queued behind the other process (GPT-2 at 1x128 with one core busy waited ~25 ms a
// call over ~130 loops).
static inline void aotc_pool_wait_pull(aotc_pool& p, int threads, int64_t chunks) {
  int64_t before[AOTC_POOL_MAX];
  int busy = 0;
  for (int i = 1; i < threads; ++i) {
    aotc_worker& w = p.workers[i];
    before[i] = w.has_clock && w.tid > 0 && w.busy.load(std::memory_order_relaxed) ? aotc_clock_ns(w.clock) : -1;
    busy += before[i] >= 0;
  }
  const int64_t t0 = aotc_now_ns();
  p.caller_sleeping.store(1);
  const uint32_t d = p.done.load();
  if (d < (uint32_t)chunks) {
    if (busy > 0 && !p.test_no_pull)
      aotc_futex_wait_for(&p.done, d, AOTC_POOL_PULL_WINDOW_NS);
    else
      aotc_futex_wait(&p.done, d);
  }
  p.caller_sleeping.store(0);
  if (busy == 0 || p.done.load() >= (uint32_t)chunks || aotc_now_ns() - t0 < AOTC_POOL_PULL_WINDOW_NS * 3 / 4) return;
  const int here = sched_getcpu();
  if (here < 0 || !CPU_ISSET(here, &p.cpus)) return;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  CPU_SET(here, &mine);
  for (int i = 1; i < threads; ++i) {
    aotc_worker& w = p.workers[i];
    if (before[i] < 0 || !w.busy.load(std::memory_order_relaxed)) continue;
    const int64_t ran = aotc_clock_ns(w.clock) - before[i];
    if (ran < 0 || ran > AOTC_POOL_PULL_WINDOW_NS / 8) continue;  // it ran (or its clock failed)
    if (sched_setaffinity(w.tid, sizeof mine, &mine) != 0) continue;
    w.moved.store(true);  // widened when it next sleeps
    w.pulled.store(true);
    p.stats.pulls += 1;
  }
}

template <class F>
static void aotc_pool_trampoline(void* ctx, int64_t c, int slot) {
  (*static_cast<F*>(ctx))(c, slot);
}

// Threads the current call may use: the setting, narrowed by the policy (1 while it runs solo).
static inline int aotc_pool_threads() {
  aotc_pool& p = aotc_the_pool();
  if (aotc_pool_inside) return 1;
  if (p.width > 0) return p.width;
  return p.want > 0 ? p.want : aotc_default_threads();
}

// Run f(chunk, slot) for every chunk in [0, chunks) on up to ``threads`` threads; slot < threads names
// the thread (0: the caller), for per-thread scratch. Returns when every chunk is done.
template <class F>
static void aotc_pool_run(int64_t chunks, int threads, F&& f) {
  aotc_pool& p = aotc_the_pool();
  const int site = !aotc_pool_inside && p.width > 0 && p.site < AOTC_POOL_SITES ? p.site++ : -1;
  const int most = aotc_pool_threads();
  threads = threads < most ? threads : most;
  if (threads > chunks) threads = (int)chunks;
  if (threads > 1) threads = aotc_pool_grow(p, threads);
  if (threads <= 1 || chunks > AOTC_POOL_CHUNKS_MAX) {
    struct inside {  // restored also when f throws
      const bool was = aotc_pool_inside;
      inside() { aotc_pool_inside = true; }
      ~inside() { aotc_pool_inside = was; }
    } mark;
    if (!mark.was) p.stats.serial += 1;
    for (int64_t c = 0; c < chunks; ++c) f(c, 0);
    return;
  }
  typedef typename std::remove_reference<F>::type Fn;
  p.fn = aotc_pool_trampoline<Fn>;
  p.ctx = (void*)std::addressof(f);
  p.done.store(0, std::memory_order_relaxed);
  p.failed.store(0, std::memory_order_relaxed);
  const uint32_t gen = (aotc_job_gen(p.job.load()) + 1) & ((1u << AOTC_POOL_NBITS) - 1);
  for (int s = 0; s < threads; ++s)  // before the job word, which a worker reads first
    p.shares[s].word.store(aotc_share_pack(gen, (uint64_t)(s * chunks / threads), (uint64_t)((s + 1) * chunks / threads)),
                           std::memory_order_relaxed);
  p.job.store(aotc_job_pack(gen, (uint64_t)threads, (uint64_t)chunks));  // seq_cst: after the shares, before the reads below
  p.stats.loops += 1;
  aotc_pool_inside = true;
  if (site < 0 || !p.short_site[site]) aotc_pool_wake(p, threads);
  const int64_t t0 = aotc_now_ns();  // after the wake-up calls: a loop's length is its own
  int64_t mine = 0;
  for (int64_t c; (c = aotc_pool_claim(p, gen, 0, threads)) >= 0; ++mine) aotc_pool_chunk(p, c, chunks, 0);
  const int64_t t1 = aotc_now_ns();
  if (site >= 0) p.short_site[site] = (t1 - t0) * (mine < chunks ? threads : 1) < AOTC_POOL_WAKE_MIN_NS;
  for (int64_t i = 1; p.done.load() < (uint32_t)chunks; ++i) {
    if (i % 64 == 0 && aotc_now_ns() - t1 > AOTC_POOL_WAIT_SPIN_NS) aotc_pool_wait_pull(p, threads, chunks);
    aotc_cpu_relax();
  }
  aotc_pool_inside = false;
  aotc_pool_account(p, chunks, mine, threads, t1 - t0, aotc_now_ns() - t1);
  if (p.failed.load()) std::rethrow_exception(p.error);
}

// Loop nests get one thread per this many elements (a loop's start-up costs a few microseconds), at most
// the call's width; below it they run on the calling thread alone.
#ifndef AOTC_PAR_MIN_WORK
#define AOTC_PAR_MIN_WORK 16384
#endif

// Threads for a loop nest of ``work`` elements. Note: fewer threads for small nests, not only serial
// below a threshold: tiny loops cost more in wake-ups than they save.
static inline int aotc_threads_for(int64_t work) {
  const int64_t most = aotc_pool_threads(), n = work / AOTC_PAR_MIN_WORK;
  return (int)(n < 1 ? 1 : n < most ? n : most);
}

// A loop over ``n`` items holding ``work`` elements in all: body(lo, hi) runs items [lo, hi). Threads by
// work (aotc_threads_for); chunks of at least AOTC_CHUNK_WORK elements, at most AOTC_CHUNKS_PER_THREAD
// per thread.
template <class F>
static void aotc_parallel_for(int64_t n, int64_t work, F&& body) {
  const int threads = n > 1 && work >= 2 * AOTC_PAR_MIN_WORK ? aotc_threads_for(work) : 1;
  if (threads <= 1) {
    if (n > 0) body((int64_t)0, n);
    return;
  }
  int64_t chunks = work / AOTC_CHUNK_WORK;
  const int64_t most = (int64_t)threads * AOTC_CHUNKS_PER_THREAD;
  chunks = chunks < most ? chunks : most;
  chunks = chunks < n ? chunks : n;
  chunks = chunks > threads ? chunks : threads;
  aotc_pool_run(chunks, threads, [&](int64_t c, int) { body(c * n / chunks, (c + 1) * n / chunks); });
}

#if defined(AOTC_SELFTEST_POOL_LOOP) || defined(AOTC_SELFTEST_POOL)  // the checks below, and aotc_pool.h's
#include <stdio.h>

#include <stdexcept>
#include <vector>

// Sleeps ``ns`` nanoseconds.
static void aotc_nap(long ns) {
  const timespec ts = {ns / 1000000000, ns % 1000000000};
  nanosleep(&ts, NULL);
}

// Every chunk runs exactly once (each napping ``nap`` ns), on a slot below the loop's width; returns the
// chunks workers ran.
static int64_t aotc_pool_check_once(int64_t chunks, int threads, int& fails, long nap = 0) {
  std::vector<std::atomic<int>> hits(chunks);
  std::atomic<int64_t> by_workers{0};
  std::atomic<int> bad_slot{0};
  aotc_pool_run(chunks, threads, [&](int64_t c, int slot) {
    hits[c].fetch_add(1);
    if (nap) aotc_nap(nap);
    if (slot < 0 || slot >= threads) bad_slot.store(1);
    if (slot) by_workers.fetch_add(1);
  });
  for (auto& h : hits) fails += h.load() != 1;
  fails += bad_slot.load();
  return by_workers.load();
}
#endif

#ifdef AOTC_SELFTEST_POOL_LOOP
int main() {
  int fails = 0;
  for (int threads : {1, 2, 3, 4})
    for (int64_t chunks : {1, 2, 3, 17, 1000, 100000}) aotc_pool_check_once(chunks, threads, fails);
  // Chunks that wait (not compute) leave the caller's core free: the worker takes some of them. On a loaded
  // machine (CI's tests run side by side) one loop's 0.4 s could pass before the worker got a core (1 run
  // in ~10 at a load of 4): it must take some in one of five.
  std::atomic<int64_t> helped{0};
  for (int attempt = 0; attempt < 5 && helped.load() == 0; ++attempt)
    aotc_pool_run(200, 2, [&](int64_t, int slot) {
      aotc_nap(2000000);
      if (slot) helped.fetch_add(1);
    });
  if (helped.load() == 0) printf("the worker ran no chunk\n"), ++fails;
  // Each thread starts at the front of its own share (slot s: chunk s * chunks / width); the others take
  // from the ends of shares, so a share's first chunk is its owner's whenever the owner runs any.
  for (int round = 0; round < 20; ++round) {
    std::atomic<int64_t> first[2] = {{-1}, {-1}};
    aotc_pool_run(40, 2, [&](int64_t c, int slot) {
      int64_t none = -1;
      first[slot].compare_exchange_strong(none, c);
      aotc_nap(20000);
    });
    if (first[0].load() != 0) printf("the caller began at chunk %ld\n", (long)first[0].load()), ++fails;
    if (first[1].load() != -1 && first[1].load() != 20) printf("the worker began at chunk %ld\n", (long)first[1].load()), ++fails;
  }
  // A worker asleep on the caller's CPU is woken elsewhere (aotc_pool_wake): pin the caller to its CPU and
  // the worker beside it until the worker sleeps there (a loop wakes it; a wake-up that moves it, or a pin
  // its own widening undid, takes another try), widen the worker again, and its chunks of the next loop
  // run on another CPU.
  cpu_set_t all;
  const int here = sched_getcpu();
  if (sched_getaffinity(0, sizeof all, &all) == 0 && CPU_COUNT(&all) > 1 && here >= 0) {
    aotc_pool& p = aotc_the_pool();
    aotc_worker& w = p.workers[1];
    p.test_no_pull = true;  // its naps would look like a descheduled worker
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(here, &one);
    sched_setaffinity(0, sizeof one, &one);
    auto asleep = [&]() {
      for (int i = 0; i < 200 && !w.sleeping.load(); ++i) aotc_nap(1000000);
      return w.sleeping.load() != 0;
    };
    bool ready = false;
    for (int attempt = 0; attempt < 20 && !ready; ++attempt) {
      asleep();
      sched_setaffinity(w.tid, sizeof one, &one);
      aotc_pool_run(8, 2, [&](int64_t, int) { aotc_nap(100000); });
      ready = asleep() && w.cpu.load() == here && !w.moved.load();
    }
    sched_setaffinity(w.tid, sizeof all, &all);
    std::atomic<int> worker_cpu{-1};
    const int64_t moves = p.stats.moves;
    aotc_pool_run(40, 2, [&](int64_t, int slot) {
      if (slot) worker_cpu.store(sched_getcpu());
      aotc_nap(200000);
    });
    if (!ready || p.stats.moves != moves + 1 || worker_cpu.load() == here)
      printf("the worker ran on the caller's CPU %d (%ld moves, set up: %d)\n", here, (long)(p.stats.moves - moves), ready), ++fails;
    sched_setaffinity(0, sizeof all, &all);
    p.test_no_pull = false;
  }
  // A worker descheduled inside a chunk is pulled onto the waiting caller's CPU (aotc_pool_wait_pull): the
  // worker pinned to another CPU beside a spinning thread, its chunk 20 ms of CPU time, the caller's chunk
  // only waits for the worker to begin. The chunk ends on the caller's CPU, and the worker's chunks of the
  // next loop run elsewhere.
  if (sched_getaffinity(0, sizeof all, &all) == 0 && CPU_COUNT(&all) > 1 && here >= 0) {
    aotc_pool& p = aotc_the_pool();
    aotc_worker& w = p.workers[1];
    int other = -1;
    for (int c = 0; c < CPU_SETSIZE && other < 0; ++c)
      if (c != here && CPU_ISSET(c, &all)) other = c;
    cpu_set_t one, two;
    CPU_ZERO(&one);
    CPU_SET(here, &one);
    CPU_ZERO(&two);
    CPU_SET(other, &two);
    sched_setaffinity(0, sizeof one, &one);
    std::atomic<bool> stop{false};
    pthread_t spinner;
    pthread_create(&spinner, NULL, [](void* arg) -> void* {
      while (!static_cast<std::atomic<bool>*>(arg)->load(std::memory_order_relaxed)) aotc_cpu_relax();
      return NULL;
    }, &stop);
    pthread_setaffinity_np(spinner, sizeof two, &two);
    bool pulled_ok = false;
    int end_cpu = -1;
    int64_t pulls = 0;
    for (int attempt = 0; attempt < 5 && !pulled_ok; ++attempt) {
      sched_setaffinity(w.tid, sizeof two, &two);
      std::atomic<bool> began{false};
      std::atomic<int> last{-1};
      const int64_t before = p.stats.pulls;
      aotc_pool_run(2, 2, [&](int64_t, int slot) {
        if (slot == 0) {
          for (int i = 0; i < 2000 && !began.load(); ++i) aotc_nap(100000);
          return;
        }
        began.store(true);
        const int64_t t0 = aotc_clock_ns(CLOCK_THREAD_CPUTIME_ID);
        while (aotc_clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0 < 20000000) aotc_cpu_relax();
        last.store(sched_getcpu());
      });
      aotc_nap(2000000);
      pulls = p.stats.pulls - before;
      end_cpu = last.load();
      // It went to sleep on the caller's CPU; the next loop wakes it elsewhere.
      std::atomic<int> next_cpu{-1};
      p.test_no_pull = true;  // (naps)
      aotc_pool_run(40, 2, [&](int64_t, int slot) {
        if (slot) next_cpu.store(sched_getcpu());
        aotc_nap(200000);
      });
      p.test_no_pull = false;
      pulled_ok = began.load() && pulls >= 1 && end_cpu == here && !w.pulled.load() && next_cpu.load() != here;
    }
    stop.store(true);
    pthread_join(spinner, NULL);
    sched_setaffinity(w.tid, sizeof all, &all);
    sched_setaffinity(0, sizeof all, &all);
    if (!pulled_ok)
      printf("a descheduled worker was not pulled onto the caller's CPU %d (%ld pulls, its chunk ended on %d, still pulled: %d)\n",
             here, (long)pulls, end_cpu, w.pulled.load()), ++fails;
  }
  // A loop inside a chunk runs on that thread alone.
  std::atomic<int> nested_bad{0};
  aotc_pool_run(4, 2, [&](int64_t, int) {
    aotc_pool_run(8, 2, [&](int64_t, int slot) { nested_bad.fetch_or(slot != 0); });
    nested_bad.fetch_or(aotc_pool_threads() != 1);
  });
  fails += nested_bad.load();
  // An exception in any chunk reaches the caller, after every chunk finished.
  bool caught = false;
  try {
    aotc_pool_run(64, 2, [&](int64_t c, int) {
      if (c == 63) throw std::runtime_error("chunk 63");
    });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  if (!caught) printf("the exception was lost\n"), ++fails;
  // aotc_parallel_for covers [0, n) once, in order within each piece.
  for (int64_t n : {1, 5, 1000, 123457}) {
    std::vector<int> seen(n, 0);
    aotc_parallel_for(n, n * 64, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) seen[i] += 1;
    });
    for (int v : seen) fails += v != 1;
  }
  if (fails) printf("%d failures\n", fails);
  return fails != 0;
}
#endif

#endif  // AOTC_POOL_LOOP_H
