// The thread pool's policy between calls, and the header to include for the pool: whether a call runs
// with the workers or on the calling thread alone (aotc_pool_begin_call / aotc_pool_end_call, aotc_pool_call),
// the settable thread count (aotc_pool_set_threads) and the counters (aotc_pool_stats_get).
// What it is not: the pool itself -- its workers, the job word, the claims, the futex sleep and wake, and
// the loops (aotc_pool_run, aotc_parallel_for) with the policy's view of one loop (aotc_pool_account) --
// nor its state (struct aotc_pool) and settings (AOTC_POOL_*): aotc_pool_loop.h, included here.
//
// A loop is over when its chunks are done (aotc_pool_loop.h: no barrier), so what slows a call is a worker
// descheduled in the middle of a chunk (moved onto the waiting caller's CPU: aotc_pool_wait_pull). The caller
// measures that wait (the time between running out of
// chunks and the last chunk's end) against what the workers contributed; when the
// losses, with the earlier calls' (fading with time), pass the gains by more than a tolerance it runs the
// rest of the call, and the calls of a growing stretch of time after it, on its own thread (then it probes
// again). Beyond that, calls choose between workers and one thread by their measured times (a trimmed
// mean of each way's last calls, per shape), trying the way not chosen now and then (aotc_pool_end_call
// says why).
// Note (why not drop at the first stall, as before): a drop costs the rest of the call and the calls after
// it their workers (MobileNetV2: 12 ms a call instead of 8), so one stall -- a neighbour's burst, or another
// runtime in the process (ONNX Runtime's threads spin ~20 ms after each of its calls) -- must not cause one.
#ifndef AOTC_POOL_H
#define AOTC_POOL_H

#include <stdint.h>

#include <cmath>

#include "aotc_pool_loop.h"

#ifndef AOTC_POOL_SPARE_MIN
#define AOTC_POOL_SPARE_MIN 0.5  // cores spare on average (aotc_spare_cores) for the time bound to try the workers
#endif

// ---- calls: the settable thread count and the policy between calls ----------------------------------

// n > 0: up to n threads, fewer while the extra ones do not get a core; 0: the default count (all the
// process's cores or OMP_NUM_THREADS), adapting likewise; n < 0: exactly -n threads, never fewer.
static inline void aotc_pool_set_threads(int32_t n) {
  aotc_pool& p = aotc_the_pool();
  const bool fixed = n < 0;
  const int want = n < 0 ? -n : n;
  if (fixed == p.fixed && want == p.want) return;  // the runtime sets it before every call: only a change counts
  p.fixed = fixed;
  p.want = want;
  // A new setting is tried from the next call on, whatever the policy had learnt.
  p.solo_until_ns = 0;
  p.backoff_ns = AOTC_POOL_BACKOFF_MIN_NS;
  p.past_gain_ns = p.past_loss_ns = 0;
  p.typical_ns[0] = p.typical_ns[1] = 0;
  p.recent_n[0] = p.recent_n[1] = 0;
  p.prefer_solo = false;
  p.explore_every = AOTC_POOL_EXPLORE_MIN;
  p.since_explore = 0;
}

// The key of a call's shapes: its dynamic sizes, hashed (FNV-1a). Calls of other sizes take other times,
// so the policy compares calls of one key (a new key starts its measurements over).
static inline uint64_t aotc_pool_key(const int64_t* syms, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; ++i) h = (h ^ (uint64_t)syms[i]) * 1099511628211ull;
  return h;
}

#ifdef AOTC_SELFTEST_POOL
static double aotc_selftest_spare = 1.0;  // cores the self-test's simulated machine has spare (no /proc/stat)
#endif

// Whether a core has been spare for the workers since the last look (aotc_spare_cores.h), or it cannot
// tell (no /proc/stat, the first look). Note (why ask): with one thread chosen, the time bound tries the
// workers every AOTC_POOL_EXPLORE_NS, so that a choice made in a passing slowdown ends soon after it. Under
// a core busy for good those tries were the calls' only cost: every 8th call of a 5-25 ms model ran with
// workers, and took 1.2-1.5x one thread's time (busy auto over one thread 1.01-1.03 in
// benchmarks/cpu_contention.py; 0.99-1.01 with no time bound). The tries spaced in calls still come.
static inline bool aotc_pool_cores_spare(aotc_pool& p) {
#ifdef AOTC_SELFTEST_POOL
  (void)p;
  return aotc_selftest_spare >= AOTC_POOL_SPARE_MIN;
#else
  const aotc_cpu_ticks now = aotc_cpu_ticks_now();
  const double spare = aotc_spare_cores(p.ticks, now);
  p.ticks = now;
  return spare < 0 || spare >= AOTC_POOL_SPARE_MIN;
#endif
}

// Start a call: its width is the setting, or one thread while the policy holds calls solo (after a drop)
// or has measured that one thread is faster; every ``explore_every`` calls it tries the other way. What
// earlier calls gained and lost fades with the time since the last call.
static inline void aotc_pool_begin_call(uint64_t key = 0) {
  aotc_pool& p = aotc_the_pool();
  p.width = p.want > 0 ? p.want : aotc_default_threads();
  p.gain_ns = p.loss_ns = 0;
  p.dropped = p.exploring = false;
  p.site = 0;
  p.stats.calls += 1;
  p.adapting = !p.fixed && p.width > 1;
  if (!p.adapting) return;
  if (key != p.key) {
    p.key = key;
    p.typical_ns[0] = p.typical_ns[1] = 0;
    p.recent_n[0] = p.recent_n[1] = 0;
    p.prefer_solo = false;
    p.explore_every = AOTC_POOL_EXPLORE_MIN;
    p.since_explore = 0;
  }
  const int64_t now = aotc_now_ns();
  if (p.last_call_ns > 0 && now > p.last_call_ns) {
    const double fade = exp2(-(double)(now - p.last_call_ns) / AOTC_POOL_MEMORY_NS);
    p.past_gain_ns *= fade;
    p.past_loss_ns *= fade;
  }
  p.last_call_ns = now;
  bool solo = p.prefer_solo;
  if (now < p.solo_until_ns) {
    solo = true;
  } else {
    if (p.solo_until_ns > 0) p.stats.probes += 1;  // this call tries the workers again
    p.solo_until_ns = 0;
    ++p.since_explore;
    bool try_other = p.since_explore >= p.explore_every;
    if (!try_other && p.prefer_solo && p.since_explore >= AOTC_POOL_EXPLORE_MIN &&
        now - p.explored_ns >= AOTC_POOL_EXPLORE_NS) {
      try_other = aotc_pool_cores_spare(p);  // the time bound (AOTC_POOL_EXPLORE_NS), when a core was free
      if (!try_other) {
        p.explored_ns = now;  // look again after as long
        p.stats.busy_skips += 1;
      }
    }
    if (try_other) {
      p.exploring = true;
      p.since_explore = 0;
      p.explored_ns = now;
      p.stats.explores += 1;
      solo = !solo;
    }
  }
  p.solo = solo;
  if (solo) {
    p.stats.solo_calls += 1;
    p.width = 1;
  }
  p.began_ns = aotc_now_ns();
}

// A way's typical call time: the mean of its last calls but the slowest (one preempted call is left out
// when there are three or more). Note (why not the median): under a neighbour that takes a core in bursts
// (3-5 ms of every 12-20), 30-40% of MobileNetV2's calls with workers had a thread preempted (7.6 ms
// against 4.4; 7.1 alone); whenever three of the last five were such calls their median passed one
// thread's, and the calls went to one thread for 8-30 at a time: round medians at one thread's time,
// 7.1 ms, where fixed 2 threads took 4.7. The mean of the rest weighs how often the slow calls come.
static inline double aotc_pool_typical(const double* ring, int64_t n) {
  const int k = n < AOTC_POOL_RECENT ? (int)n : AOTC_POOL_RECENT;
  double sum = 0, most = 0;
  for (int i = 0; i < k; ++i) {
    sum += ring[i];
    most = ring[i] > most ? ring[i] : most;
  }
  return k >= 3 ? (sum - most) / (k - 1) : sum / k;
}

// End a call. Its time joins its way's typical time (a call that dropped counts as one with workers: that
// is what trying them cost). The way preferred switches when the other way's is lower (workers must
// win by a margin: they cost CPU that other processes may want); a try of the other way that confirms the
// choice doubles the calls until the next (up to AOTC_POOL_EXPLORE_MAX), one that changes it resets them.
// Note (why measure calls): the waits at the ends of loops are not all a busy core costs. With a spinning
// process on one of 2 cores, MobileNetV2's worker ran 20% of the chunks and waited little, yet calls took
// 7.9 ms against 6.5 on one thread (the worker and the caller shared a core, and each wake-up preempted
// the caller); only the calls' times show that.
//
// A call that had to drop to one thread holds the calls of the next ``backoff_ns`` on one thread and
// doubles the backoff (up to AOTC_POOL_BACKOFF_MAX_NS); calls with workers and no drop for as long as the
// backoff halve it. So a core taken for good keeps the workers asleep nearly always, a passing load (a
// neighbour's burst, another runtime's threads spinning after their call) costs a few short probes, and
// a lone stall after many good calls costs nothing but itself: the faded gains outweigh it. Note: time, not
// calls, sets the backoff: in calls, a tiny model (50 us a call) probed every few milliseconds, and each
// probe could cost a whole time slice of the busy core.
static inline void aotc_pool_end_call() {
  aotc_pool& p = aotc_the_pool();
  if (p.adapting) {
    p.past_gain_ns += (double)p.gain_ns;
    p.past_loss_ns += (double)p.loss_ns;
    const int64_t now = aotc_now_ns();
    // A try of the way not preferred stands for it alone: its older calls are from before the switch, and
    // conditions have changed since (ONNX Runtime's threads spinning for three calls must not keep the
    // workers off for the next dozens).
    if (p.exploring) p.recent_n[p.solo] = 0;
    p.recent_ns[p.solo][p.recent_n[p.solo]++ % AOTC_POOL_RECENT] = (double)(now - p.began_ns);
    p.typical_ns[p.solo] = aotc_pool_typical(p.recent_ns[p.solo], p.recent_n[p.solo]);
    if (p.typical_ns[1 - p.solo] > 0) {
      const double workers = p.typical_ns[0], alone = p.typical_ns[1];
      const bool solo_wins = workers >= AOTC_POOL_WORKERS_MUST_WIN * alone;
      if (solo_wins != p.prefer_solo) {
        p.prefer_solo = solo_wins;
        p.explore_every = AOTC_POOL_EXPLORE_MIN;
        p.explored_ns = now;
      } else if (p.exploring) {
        p.explore_every = p.explore_every < AOTC_POOL_EXPLORE_MAX / 2 ? 2 * p.explore_every : AOTC_POOL_EXPLORE_MAX;
      }
    }
    if (p.dropped) {
      p.solo_until_ns = now + p.backoff_ns;
      p.backoff_ns = p.backoff_ns < AOTC_POOL_BACKOFF_MAX_NS / 2 ? p.backoff_ns * 2 : AOTC_POOL_BACKOFF_MAX_NS;
      p.settled_ns = now;
    } else if (p.width > 1 && now - p.settled_ns >= p.backoff_ns) {
      p.backoff_ns = p.backoff_ns / 2 > AOTC_POOL_BACKOFF_MIN_NS ? p.backoff_ns / 2 : AOTC_POOL_BACKOFF_MIN_NS;
      p.settled_ns = now;
    }
  }
  p.width = 0;
  p.adapting = false;
}

struct aotc_pool_call {  // RAII: aotc_run's body is one call, also when a kernel throws
  explicit aotc_pool_call(uint64_t key = 0) { aotc_pool_begin_call(key); }
  ~aotc_pool_call() { aotc_pool_end_call(); }
};

// The pool's counters since the library loaded, for benchmarks and tests: writes up to ``n`` of them (in the
// order of aotc_pool_stats) and returns how many it has.
extern "C" __attribute__((visibility("default"), weak)) int32_t aotc_pool_stats_get(int64_t* out, int32_t n) {
  const aotc_pool_stats& s = aotc_the_pool().stats;
  const int64_t all[] = {s.calls, s.loops, s.stalls, s.drops, s.solo_calls, s.probes, s.wakes,
                         s.wait_ns, s.loss_ns, s.gain_ns, s.worker_chunks, s.chunks, s.serial, s.explores, s.busy_skips, s.moves,
                         s.pulls};
  const int32_t have = (int32_t)(sizeof all / sizeof all[0]);
  for (int32_t i = 0; i < n && i < have; ++i) out[i] = all[i];
  return have;
}

#ifdef AOTC_SELFTEST_POOL
// The policy's checks, with aotc_pool_loop.h's helpers (aotc_nap, aotc_pool_check_once); the loops' own
// checks are that header's self-test.
int main() {
  int fails = 0;
  aotc_pool& p = aotc_the_pool();
  // Inside calls, a loop that was short the last time the call reached it wakes no sleeping worker; a long
  // one does. (A few wakes are allowed: a caller descheduled inside the short loop makes it look long.)
  aotc_pool_set_threads(2);
  p.explore_every = INT64_MAX;  // (no tries of one thread in these calls)
  auto calls_of = [&](long chunk_nap) {
    const int64_t wakes = p.stats.wakes;
    for (int i = 0; i < 20; ++i) {
      aotc_nap(1000000);  // the worker's spin ends: it sleeps
      aotc_pool_call call;
      aotc_pool_check_once(64, 2, fails, chunk_nap);
    }
    return p.stats.wakes - wakes;
  };
  calls_of(0);
  const int64_t short_wakes = calls_of(0), long_wakes = (calls_of(100000), calls_of(100000));
  if (short_wakes > 3) printf("%ld wakes in 20 calls of a short loop\n", (long)short_wakes), ++fails;
  if (long_wakes < 17) printf("%ld wakes in 20 calls of a long loop\n", (long)long_wakes), ++fails;
  // The measured choice: calls that take 6 ms with workers and 0.5 ms on one thread (simulated: the call
  // moves the clock on by its width's time) go to one thread after a try of it, and stay there but for
  // tries of the workers, which come at doubling intervals; and the other way round. (Bounds stay loose: a
  // call's real microseconds still count, and a loaded machine can stretch them.) A new shape (key) starts
  // over.
  auto simulated = [&](long workers_ns, long alone_ns, uint64_t key) {
    aotc_pool_call call(key);
    aotc_selftest_skew_ns.fetch_add(aotc_pool_threads() > 1 ? workers_ns : alone_ns);
    return aotc_pool_threads() > 1;
  };
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  int with_workers = 0;
  for (int i = 0; i < 8 * AOTC_POOL_EXPLORE_MIN && !p.prefer_solo; ++i) simulated(6000000, 500000, 7);
  if (!p.prefer_solo) printf("one thread, faster, was not chosen\n"), ++fails;
  for (int i = 0; i < 100; ++i) with_workers += simulated(6000000, 500000, 7);
  if (with_workers < 1 || with_workers > 25) printf("%d calls of 100 tried the workers\n", with_workers), ++fails;
  if (p.explore_every < 16)
    printf("tries every %ld calls, expected them to space out\n", (long)p.explore_every), ++fails;
  simulated(6000000, 500000, 8);
  if (p.prefer_solo || p.typical_ns[1] != 0) printf("a new key kept the old measurements\n"), ++fails;
  with_workers = 0;
  for (int i = 0; i < 100; ++i) with_workers += simulated(500000, 6000000, 8);
  if (p.prefer_solo || with_workers < 75)
    printf("workers, faster, were not chosen (%d calls of 100)\n", with_workers), ++fails;
  // A passing slowdown of the workers (three calls) moves the calls to one thread; the next try of the
  // workers, fast again, moves them back at once (older samples do not outvote it).
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  for (int i = 0; i < 20; ++i) simulated(500000, 6000000, 9);
  for (int i = 0; i < 3; ++i) simulated(12000000, 6000000, 9);
  int back_after = 0;
  while (back_after < 4 * AOTC_POOL_EXPLORE_MIN && (back_after == 0 || p.prefer_solo)) {
    simulated(500000, 6000000, 9);
    ++back_after;
  }
  if (back_after > AOTC_POOL_EXPLORE_MIN + 2) printf("workers came back after %d calls\n", back_after), ++fails;
  // Another runtime's threads spinning for ~20 ms after its calls (ONNX Runtime's, in one process with the
  // package, as in cpu_side_by_side.py): calls come in blocks of 30, seconds apart, and in the first 8 of
  // each the workers are slow (6 ms against 4.4 alone; 2.5 against 4.2 otherwise). Tries of the workers
  // that fall in the slow calls confirm one thread; tries spaced in calls alone once kept the workers off
  // for whole blocks (MobileNet at its one-thread time for a run). A bound in time on the wait between
  // tries brings them back within tens of ms of the end of the slowdown.
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  for (int i = 0; i < 20; ++i) simulated(2500000, 4200000, 10);
  const int solo_calls_max = AOTC_POOL_EXPLORE_NS / 4200000 + 2;  // the time bound's, in calls alone
  int most_solo = 0;  // calls alone after the slowdown, in the worst block
  for (int block = 0; block < 12; ++block) {
    aotc_selftest_skew_ns.fetch_add(2000000000);  // the other engines' calls
    int solo_calls = 0;
    for (int i = 0; i < 8; ++i) simulated(6000000, 4400000, 10);
    for (int i = 8; i < 30; ++i) solo_calls += !simulated(2500000, 4200000, 10);
    most_solo = solo_calls > most_solo ? solo_calls : most_solo;
  }
  if (most_solo > solo_calls_max)
    printf("%d calls of 22 on one thread after a slowdown, expected at most %d\n", most_solo, solo_calls_max), ++fails;
  // With the workers chosen, tries of one thread stay spaced in calls, also for a slow model (10 ms with
  // workers, 18.5 alone): 300 calls, 3 s, try it 5 or 6 times (at 8, 16, 32, ... calls), not every 8 calls.
  const int64_t explores = p.stats.explores;
  for (int i = 0; i < 300; ++i) simulated(10000000, 18500000, 11);
  if (p.stats.explores - explores > 7) printf("%ld tries of one thread in 300 calls\n", (long)(p.stats.explores - explores)), ++fails;
  // One thread chosen under a core busy for good (no core spare): the time bound stays quiet, and the tries
  // of the workers come spaced in calls, as the other way round -- a slow model (25 ms with workers, 21
  // alone), 300 calls: at 8, 16, 32, ... calls, not every 8. Once a core is spare again, the next look
  // (30 ms on) tries the workers, and they win the calls back.
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  aotc_selftest_spare = 0;
  for (int i = 0; i < 4 * AOTC_POOL_EXPLORE_MIN && !p.prefer_solo; ++i) simulated(25000000, 21000000, 12);
  const int64_t tries = p.stats.explores, skips = p.stats.busy_skips;
  with_workers = 0;
  for (int i = 0; i < 300; ++i) with_workers += simulated(25000000, 21000000, 12);
  if (!p.prefer_solo || with_workers > 7 || p.stats.busy_skips == skips)
    printf("busy core: %d calls of 300 with workers (%ld tries, %ld skipped), expected at most 7\n", with_workers,
           (long)(p.stats.explores - tries), (long)(p.stats.busy_skips - skips)), ++fails;
  aotc_selftest_spare = 1;
  int back = 0;
  while (back < 300 && !simulated(10000000, 21000000, 12)) ++back;
  if (back > AOTC_POOL_EXPLORE_NS / 21000000 + AOTC_POOL_EXPLORE_MIN + 1)
    printf("workers came back %d calls after a core was spare\n", back), ++fails;
  // A neighbour that takes a core in bursts: 3 of every 8 calls with workers, in a row, have a thread
  // preempted (7.6 ms against 4.4, and 7.1 alone). The workers keep nearly all the calls.
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  int burst_workers = 0, nth = 0;
  for (int i = 0; i < 400; ++i) {
    const bool hit = aotc_pool_threads() > 1 && nth++ % 8 < 3;
    burst_workers += simulated(hit ? 7600000 : 4400000, 7100000, 13);
  }
  if (burst_workers < 360) printf("bursty neighbour: %d calls of 400 with workers, expected 360\n", burst_workers), ++fails;
  // A longer slowdown (0.3 s), then none: the tries in it spaced out (to 64 calls, 0.27 s alone).
  for (int i = 0; i < 70; ++i) simulated(6000000, 4400000, 10);
  int stuck = 0;
  while (stuck < 300 && !simulated(2500000, 4200000, 10)) ++stuck;
  if (stuck > solo_calls_max)
    printf("%d calls on one thread after a long slowdown, expected at most %d\n", stuck, solo_calls_max), ++fails;
  // The policy. A worker descheduled inside its chunks is simulated: it sleeps 60 ms in each. The caller's
  // chunks nap until the worker holds one (the worker is woken after the first), then finish at once: the
  // caller runs out of chunks and waits ~60 ms for the worker's.
  auto stall = [&]() {
    std::atomic<bool> worker_in{false};
    for (bool& s : p.short_site) s = false;  // the loop wakes the worker
    const int64_t give_up = aotc_now_ns() + 1000000000;
    aotc_pool_run(2000, 2, [&](int64_t, int slot) {
      if (slot) worker_in.store(true);
      while (!slot && !worker_in.load() && aotc_now_ns() < give_up) aotc_nap(300000);
    });
    if (!worker_in.load()) printf("the worker never started (a very busy machine?)\n"), ++fails;
  };
  // With gains of 0.5 s remembered (many good calls just before), one stall costs the call nothing more.
  aotc_pool_set_threads(3);
  aotc_pool_set_threads(2);
  p.explore_every = INT64_MAX;  // (no tries of one thread in these calls)
  p.test_worker_delay_ns = 60000000;
  {
    aotc_pool_call call;
    p.past_gain_ns = 5e8;
    const int64_t stalls = p.stats.stalls;
    stall();
    if (p.stats.stalls == stalls) printf("no stall (the simulation failed)\n"), ++fails;
    if (aotc_pool_threads() != 2 || p.dropped) printf("a lone stall after good calls dropped the call\n"), ++fails;
  }
  // With nothing remembered it costs the call one wait: the rest of it, and the calls of the next
  // backoff_ns, run on the caller alone; then a probe call uses the workers again, and the backoff doubles.
  aotc_pool_set_threads(3);  // a new setting forgets the gains
  aotc_pool_set_threads(2);
  if (p.past_gain_ns != 0 || p.past_loss_ns != 0) printf("a new setting kept the gains\n"), ++fails;
  p.explore_every = INT64_MAX;
  p.backoff_ns = 300000000;  // long enough that the solo call below surely begins within it
  const int64_t drops = p.stats.drops;
  int64_t worker_chunks_after_drop = 0;
  {
    aotc_pool_call call;
    stall();
    if (aotc_pool_threads() != 1 || p.stats.drops != drops + 1)
      printf("no drop to one thread after a stall\n"), ++fails;
    for (int i = 0; i < 5; ++i) worker_chunks_after_drop += aotc_pool_check_once(64, 2, fails, 1000);
  }
  fails += worker_chunks_after_drop != 0;
  p.test_worker_delay_ns = 0;
  if (p.backoff_ns != 600000000) printf("backoff %ld ns, expected 6e8\n", (long)p.backoff_ns), ++fails;
  {
    aotc_pool_call call;
    if (aotc_pool_threads() != 1) printf("the call after the drop is not solo\n"), ++fails;
  }
  p.solo_until_ns = aotc_now_ns();  // as if the backoff had passed
  p.prefer_solo = false;  // (and as if the calls' times had not preferred one thread)
  p.typical_ns[0] = p.typical_ns[1] = 0;
  p.recent_n[0] = p.recent_n[1] = 0;
  const int64_t probes = p.stats.probes;
  {
    aotc_pool_call call;
    if (aotc_pool_threads() != 2 || p.stats.probes != probes + 1) printf("no probe after the backoff\n"), ++fails;
  }
  // Calls with workers and no drop, for as long as the backoff, halve it (not below the minimum).
  p.settled_ns = aotc_now_ns() - p.backoff_ns;
  {
    aotc_pool_call call;
    aotc_pool_check_once(64, 2, fails);
  }
  if (p.backoff_ns != 300000000) printf("backoff %ld ns after good calls, expected 3e8\n", (long)p.backoff_ns), ++fails;
  p.backoff_ns = AOTC_POOL_BACKOFF_MIN_NS;
  p.settled_ns = 0;
  { aotc_pool_call call; }
  if (p.backoff_ns != AOTC_POOL_BACKOFF_MIN_NS) printf("backoff below the minimum\n"), ++fails;
  // The gains fade: half after AOTC_POOL_MEMORY_NS.
  p.past_gain_ns = 1e6;
  p.last_call_ns = aotc_now_ns() - AOTC_POOL_MEMORY_NS;
  {
    aotc_pool_call call;
    if (p.past_gain_ns > 0.51e6 || p.past_gain_ns < 0.3e6)
      printf("gains %g after a half-life, expected 5e5\n", p.past_gain_ns), ++fails;
  }
  // A fixed count never drops.
  aotc_pool_set_threads(-2);
  p.test_worker_delay_ns = 60000000;
  {
    aotc_pool_call call;
    const int64_t stalls = p.stats.stalls;
    stall();
    if (p.stats.stalls == stalls) printf("no second stall\n"), ++fails;
    if (aotc_pool_threads() != 2) printf("a fixed count dropped\n"), ++fails;
  }
  p.test_worker_delay_ns = 0;
  // A new setting drops what the policy learnt; the same one again (the runtime sets it before every call)
  // keeps it.
  aotc_pool_set_threads(2);
  p.solo_until_ns = INT64_MAX;
  aotc_pool_set_threads(2);
  if (p.solo_until_ns != INT64_MAX) printf("setting the same count reset the policy\n"), ++fails;
  aotc_pool_set_threads(3);
  if (p.solo_until_ns != 0 || p.backoff_ns != AOTC_POOL_BACKOFF_MIN_NS)
    printf("a new count kept the old policy\n"), ++fails;
  if (fails) printf("%d failures\n", fails);
  return fails != 0;
}
#endif

#endif  // AOTC_POOL_H
